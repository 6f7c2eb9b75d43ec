"""`oopscope example DIR`: write the GS-lite example (query, schema file, CSV records) into DIR.

The files are package data (`tools/gen/gslite/`), so an installed oopscope has them as a
source tree does: a GS-lite query, the schema file declaring its CSV record protocol
(`READINGS`), and ten records. The README's tour runs them.
"""

from __future__ import annotations

import click

#: the example's files, as `oopscope run` reads them
FILES = ("example.gsql", "packet_schema.txt", "records.csv")


@click.command()
@click.argument("directory", type=click.Path(file_okay=False), default=".")
@click.option("--force", is_flag=True, help="Replace files of the same names in DIRECTORY.")
def example(directory: str, force: bool) -> None:
    """Write a small GS-lite example into DIRECTORY (made if missing; default: here).

    \b
    example.gsql       per minute and sensor: readings, their sum, peak and alarms
    packet_schema.txt  a schema file declaring the READINGS record protocol
    records.csv        ten READINGS records
    Then:
      oopscope run DIR/example.gsql --schema DIR/packet_schema.txt --link csv=DIR/records.csv
    """
    from importlib.resources import files
    from pathlib import Path

    from common.errors import ConfigError

    where = Path(directory)
    targets = [where / name for name in FILES]
    present = [str(t) for t in targets if t.exists()]
    if present and not force:
        # the same bytes again are no change: the tour can be run twice
        source = files("tools.gen").joinpath("gslite")
        differ = [t for t in targets if t.exists()
                  and (not t.is_file() or t.read_bytes() != source.joinpath(t.name).read_bytes())]
        if differ:
            verb = "exists and differs" if len(differ) == 1 else "exist and differ"
            raise ConfigError(f"{', '.join(str(t) for t in differ)} already {verb} from the "
                              f"example; give another directory, or --force to replace them")
    try:
        where.mkdir(parents=True, exist_ok=True)
        source = files("tools.gen").joinpath("gslite")
        for target in targets:
            target.write_bytes(source.joinpath(target.name).read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot write the example into {where}: {exc.strerror or exc}") \
            from None
    click.echo(f"oopscope example: {', '.join(str(t) for t in targets)}; run it with\n"
               f"  oopscope run {targets[0]} --schema {targets[1]} --link csv={targets[2]}",
               err=True)
