"""`oopscope run`: run a query file over pcap files (each file a link), as fast as possible."""

from __future__ import annotations

from pathlib import Path

import click

from tools.params import Duration


def _pairs(values: tuple[str, ...], option: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=option)
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _links(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        name, sep, path = item.partition("=")
        if not sep:  # a bare PCAP: the link is named after the file stem
            name, path = Path(item).stem, item
        if not name.strip() or not path.strip():
            raise click.BadParameter(f"{item!r} is not NAME=PCAP or PCAP", param_hint="--link")
        out.append((name.strip(), path.strip()))
    return tuple(out)


@click.command()
@click.argument("query_file")
@click.option("--link", "links", multiple=True, required=True, metavar="NAME=PCAP",
              help="A capture file and the link name it plays (repeatable). A bare PCAP is "
                   "named after the file stem.")
@click.option("--output", "outputs", multiple=True, metavar="QUERY=PATH",
              help="Write QUERY's rows to PATH (- for stdout; repeatable). Only the queries "
                   "named run. Default: every query no other query reads, to stdout.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "jsonl", "parquet"]),
              default=None, help="Output format (default: from the file suffix; table on "
                                 "stdout).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a DEFINE key (e.g. --set flush=oop_slow, --set aggregate_slots=4).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Give a PARAM its value (e.g. --param min_bytes=100000).")
@click.option("--master", default=None, metavar="URL",
              help="Spark master URL (default local[*]).")
@click.option("--spool", default=None, type=click.Path(file_okay=False),
              help="Spool directory (kept; default: a temporary one removed at the end).")
@click.option("--checkpoint", default=None, type=click.Path(file_okay=False),
              help="Spark checkpoint directory (kept; default: temporary).")
@click.option("--punctuate-every", "punctuate_every", type=Duration(), default="1s",
              show_default=True, help="Punctuation period in data time.")
def run(query_file: str, links, outputs, fmt, sets, params, master, spool, checkpoint,
        punctuate_every: int) -> None:
    """Run QUERY_FILE (a path or a shipped query name such as q8_1) over capture files.

    Each capture is one link, read as fast as possible; its punctuation follows the data
    clock (checked once per batch of 65536 packets). The runnable queries are windowed
    aggregations over links; a file that also holds joins, query-on-query or selections runs
    its aggregations when --output names only those. Results go to the outputs, a summary
    (packets, malformed, rows, evictions, flushes, late packets, timings) to stderr.

    Example: oopscope run q8_1 --link main=trace.pcap --output q8_1=q8_1.csv
    """
    import logging

    from tools.pipeline import RunConfig, run_offline

    if punctuate_every <= 0:
        raise click.BadParameter("must be positive", param_hint="--punctuate-every")
    config = RunConfig(query_file=query_file, links=_links(links),
                       outputs=_pairs(outputs, "--output"), format=fmt,
                       overrides=_pairs(sets, "--set"), params=_pairs(params, "--param"),
                       master=master, spool=spool, checkpoint=checkpoint,
                       punctuate_every_ns=punctuate_every)
    summary = run_offline(config)
    # the summary is the run's report, not a diagnostic: always shown, on stderr
    click.echo(summary.format(), err=True)
    logging.getLogger(__name__).debug("run finished in %.2f s", summary.total_seconds)
