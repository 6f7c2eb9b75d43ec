"""`oopscope export netflow`: replay stored flow records to a NetFlow v5 / v9 / IPFIX collector."""

from __future__ import annotations

import click

FORMATS = ("csv", "jsonl", "parquet")


def _format_of(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    name = path.lower()
    for suffix, kind in ((".csv", "csv"), (".jsonl", "jsonl"), (".json", "jsonl"),
                         (".ndjson", "jsonl"), (".parquet", "parquet"), (".pq", "parquet")):
        if name.endswith(suffix):
            return kind
    from tools.errors import NetflowInputError

    raise NetflowInputError(f"{path}: cannot tell the format from the name; give --format "
                            f"{'|'.join(FORMATS)}")


def read_results(path: str, fmt: str | None = None):
    """The rows of a results file as `oopscope run --output netflow=FILE` writes them (Arrow)."""
    import os

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    from tools.errors import NetflowInputError

    kind = _format_of(path, fmt)
    if not os.path.isfile(path):
        raise NetflowInputError(f"{path}: no such results file")
    text_columns = {"srcIP": pa.string(), "destIP": pa.string()}
    try:
        if kind == "csv":
            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                column_types=text_columns))
        elif kind == "jsonl":
            # addresses stay text even when every value of a block looks numeric
            table = pajson.read_json(path)
        else:
            table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NetflowInputError(f"{path}: cannot read it as {kind}: {first}") from None
    return table


@click.group()
def export() -> None:
    """Export stored query results to other systems."""


@export.command("netflow")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--to", "target", metavar="HOST:PORT",
              help="Collector to send to (e.g. 127.0.0.1:2055, [::1]:4739).")
@click.option("--version", "version", type=click.Choice(["5", "9", "10"]), default="9",
              show_default=True, help="NetFlow version (10 = IPFIX).")
@click.option("--mtu", type=click.IntRange(576, 65535), default=1500, show_default=True,
              help="Path MTU: datagrams carry at most MTU - IP - UDP header bytes.")
@click.option("--pcap", "pcap", type=click.Path(dir_okay=False), default=None,
              help="Also write the datagrams as UDP packets to this pcap (for tshark).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Format of RESULTS (default: from its suffix).")
@click.option("--sampling", type=click.IntRange(1, 16383), default=1, show_default=True,
              help="Sampling interval to announce (1 = every packet).")
@click.option("--source-id", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="v9 source id / IPFIX observation domain (v5: engine id, low 8 bits).")
@click.option("--pace", type=click.FloatRange(0), default=2000, show_default=True,
              help="Datagrams a second at most, so a collector's socket buffer does not "
                   "overflow (0: unpaced; nfcapd -B 33554432 takes 10000).")
@click.option("--template-every", type=click.IntRange(1), default=64, show_default=True,
              help="v9/IPFIX: resend templates every N datagrams (and every 60 s export time).")
def netflow(results: str, target: str | None, version: str, mtu: int, pcap: str | None,
            fmt: str | None, sampling: int, source_id: int, pace: float,
            template_every: int) -> None:
    """Replay RESULTS (the netflow query's rows: CSV, JSON lines or Parquet, as written by
    `oopscope run netflow --output netflow=FILE`) as NetFlow datagrams.

    Flow and header times are the records' capture times, never the wall clock. Sends that
    fail (collector down) are counted and reported, not fatal. The summary goes to stderr.

    Example: oopscope export netflow flows.csv --to 127.0.0.1:2055 --version 10
    """
    from tools.errors import NetflowError
    from tools.netflow.exporter import Exporter

    if not target and not pcap:
        raise click.UsageError("give --to HOST:PORT, --pcap FILE, or both")
    if target:  # a bad address fails before the file is read
        from tools.netflow.sender import parse_target

        parse_target(target)
    table = read_results(results, fmt)
    try:
        exporter = Exporter(target, int(version), mtu=mtu, pcap=pcap, sampling_interval=sampling,
                            source_id=source_id, pace=pace,
                            template_every_messages=template_every)
    except OSError as exc:
        raise NetflowError(f"cannot open {pcap or target}: {exc.strerror or exc}") from None
    try:
        exporter.export(table, where=f"{results}: ")
    finally:
        exporter.close()
    click.echo(exporter.summary(), err=True)
