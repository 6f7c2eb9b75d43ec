"""`oopscope run`: run a query file over capture files or live interfaces (each one a link)."""

from __future__ import annotations

from pathlib import Path

import click

from tools.commands.params import (
    Duration,
    active_timeout_option,
    functions_option,
    schema_option,
)


def _separator(text: str | None) -> str | None:
    """--csv-separator as the character it names (None: detect it from the first line)."""
    from capture.records import resolve_separator

    try:
        return resolve_separator(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--csv-separator") from None


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


def _flow_links(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """--netflow-in NAME=FILE.pcap or NAME=HOST:PORT pairs."""
    out = []
    for item in values:
        name, sep, source = item.partition("=")
        if not sep or not name.strip() or not source.strip():
            raise click.BadParameter(f"{item!r} is not NAME=FILE.pcap or NAME=HOST:PORT",
                                     param_hint="--netflow-in")
        out.append((name.strip(), source.strip()))
    return tuple(out)


def _interfaces(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        name, sep, iface = item.partition("=")
        if not sep:  # a bare interface: the link is named after it
            name, iface = item, item
        if not name.strip() or not iface.strip():
            raise click.BadParameter(f"{item!r} is not NAME=IFACE or IFACE",
                                     param_hint="--interface")
        out.append((name.strip(), iface.strip()))
    return tuple(out)


def _speed(text: str) -> float | None:
    if text.strip().lower() in ("max", "inf", "fastest"):
        return None
    try:
        value = float(text.rstrip("xX"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not max or a number such as 1, 10, 0.5",
                                 param_hint="--speed") from None
    if value <= 0:
        raise click.BadParameter("must be positive (or max)", param_hint="--speed")
    return value


def live_options(command):
    """The live capture options of `run` and `agent`, handed to the command as one
    `capture_options` tuple (`RunConfig.capture_options`)."""
    options = [
        click.option("--promiscuous", is_flag=True, help="Live capture in promiscuous mode."),
        click.option("--direction", type=click.Choice(["in", "out", "inout"]),
                     default="inout", show_default=True,
                     help="Live capture: packets received, sent, or both (tcpdump's -Q). On "
                          "a loopback device each packet counts once whatever the "
                          "direction."),
        click.option("--snaplen", type=click.IntRange(64, 262144), default=None,
                     help="Live capture: bytes kept of each frame (default: the headers, "
                          "256, or every byte when a query reads TCP_data, UDP_data or "
                          "caplen)."),
        click.option("--ring-blocks", "ring_blocks", type=click.IntRange(2, 1 << 16),
                     default=64, show_default=True,
                     help="Live capture: blocks of the kernel ring (TPACKET_V3)."),
        click.option("--ring-block-size", "ring_block_size",
                     type=click.IntRange(4096, 1 << 30), default=1 << 22, show_default=True,
                     help="Live capture: bytes per kernel ring block (a multiple of the page "
                          "size)."),
        click.option("--ring-timeout", "ring_timeout", type=Duration(), default="100ms",
                     show_default=True, help="Live capture: a partly filled block is handed "
                                             "over after this long."),
    ]

    def wrapped(*args, promiscuous, direction, snaplen, ring_blocks, ring_block_size,
                ring_timeout, **kwargs):
        kwargs["capture_options"] = (
            ("promiscuous", promiscuous), ("direction", direction), ("snaplen", snaplen),
            ("block_count", ring_blocks), ("block_size", ring_block_size),
            ("frame_timeout_ms", max(1, ring_timeout // 1_000_000)))
        return command(*args, **kwargs)

    import functools

    wrapped = functools.wraps(command)(wrapped)
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


@click.command()
@click.argument("query_files", metavar="QUERY_FILE...", nargs=-1, required=True)
@click.option("--link", "links", multiple=True, metavar="NAME=PCAP",
              help="A capture file and the link name it plays (repeatable). A bare PCAP is "
                   "named after the file stem. A FIFO, or - for standard input "
                   "(tcpdump -w - | oopscope run ...), is read as a stream. A link the "
                   "queries read as a record protocol of a --schema file (FROM "
                   "[csv].CSV_EXAMPLE) takes a CSV file, - or a FIFO of records instead.")
@schema_option
@functions_option
@click.option("--csv-separator", "csv_separator", default=None, metavar="CHAR",
              help="The field separator of CSV record links: one character, or tab, comma, "
                   "pipe, semicolon, space (default: detected from the first line among , | "
                   "tab ; else space). A link whose every record is malformed fails the "
                   "run, naming the separator that reads its first line.")
@click.option("--interface", "interfaces", multiple=True, metavar="NAME=IFACE",
              help="Capture live on IFACE as link NAME (repeatable; a bare IFACE names the "
                   "link after it). Needs root or CAP_NET_RAW.")
@click.option("--output", "outputs", multiple=True, metavar="QUERY=PATH",
              help="Write QUERY's rows to PATH (- for stdout; repeatable). Only the queries "
                   "named run. Default: every query no other query reads, to stdout.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "jsonl", "parquet"]),
              default=None, help="Output format (default: from the file suffix; table on "
                                 "stdout).")
@click.option("--speed", default="max", show_default=True, metavar="max|N",
              help="Replay capture files as fast as possible, or paced at N x real time by "
                   "their timestamps.")
@click.option("--duration", type=Duration(), default=None,
              help="Stop after this long (wall time in paced and live runs, capture time at "
                   "--speed max); every window is still closed and written.")
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
              show_default=True, help="Timer punctuation period (capture time at --speed "
                                      "max, wall time otherwise).")
@click.option("--lull-slack", "lull_slack", type=Duration(), default="1s", show_default=True,
              help="During a lull a link punctuates the run's clock minus this.")
@click.option("--progress/--no-progress", default=None,
              help="Progress line on stderr (default: when stderr is a terminal).")
@click.option("--fanout", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Live capture: each interface captured by N processes in one "
                   "PACKET_FANOUT group (a flow stays on one), each with its own low level "
                   "on its own core; the same rows as N = 1.")
@live_options
@click.option("--netflow", "netflow", default=None, metavar="HOST:PORT",
              help="Also export the flow records as NetFlow/IPFIX over UDP to this collector "
                   "while the query runs (a collector that is down stops nothing: failed "
                   "sends are counted).")
@click.option("--netflow-version", "netflow_version", type=click.Choice(["5", "9", "10"]),
              default="9", show_default=True, help="NetFlow v5, v9 or IPFIX (10).")
@click.option("--netflow-query", "netflow_query", default="netflow", show_default=True,
              help="The query whose rows are the flow records.")
@click.option("--netflow-in", "netflow_in", multiple=True, metavar="NAME=FILE.pcap|HOST:PORT",
              help="A link of NetFlow v5/v9/IPFIX flow records: the exported datagrams of a "
                   "capture file, replayed by capture time, or a UDP collector on HOST:PORT "
                   "(until SIGTERM or Ctrl-C; repeatable). Its queries read it "
                   "as NETFLOW (SELECT ... FROM NAME.NETFLOW).")
@active_timeout_option("The exporters' active timeout: a NETFLOW link's punctuation on flow "
                      "start is each exporter's latest export time minus this (an "
                      "exporter that sends its own timeout is taken at its word).")
@click.option("--netflow-in-idle-timeout", "netflow_in_idle", type=Duration(), default=None,
              help="The exporters' idle (inactive) timeout: a NETFLOW link's punctuation on "
                   "flow end (windows on `last`) is each exporter's latest export time minus "
                   "this (default: the active timeout; an exporter that sends its own is "
                   "taken at its word).")
@click.option("--netflow-pace", "netflow_pace", type=click.IntRange(0), default=2000,
              show_default=True, help="Datagrams per second at most (0: no pacing; a local "
                                      "nfcapd drops when flooded).")
def run(query_files: tuple[str, ...], links, schema_files, function_files, udf_module,
        csv_separator, interfaces, outputs, fmt, speed, duration, sets, params, master, spool,
        checkpoint, punctuate_every: int, lull_slack: int, progress, fanout, capture_options,
        netflow, netflow_version, netflow_query, netflow_pace, netflow_in,
        netflow_in_timeout, netflow_in_idle) -> None:
    """Run QUERY_FILE (a path or a shipped query name such as q8_1) over capture files or
    live interfaces. Several query files are one query set, as in GS-lite: a query may read
    a query of another file.

    Each capture file (--link) or interface (--interface) is one link. Files are replayed
    interleaved by capture time, as fast as possible or paced (--speed N); each link's
    punctuation advances on a timer (every --punctuate-every) to the largest capture time
    seen, and during a lull to the clock minus --lull-slack, so silent links do not hold
    windows back. Results go to the outputs as windows close; a summary (packets, malformed,
    drops, rows, evictions, late packets, timings) to stderr. SIGTERM or Ctrl-C stops the
    capture, closes every window and writes every result.

    \b
    Examples:
      oopscope run q8_1 --link main=trace.pcap --output q8_1=q8_1.csv
      oopscope run top_talkers --link main=trace.pcap --speed 10 --param min_bytes=1M
      sudo oopscope run netflow --interface main=eth0 --duration 1min
      oopscope run example.gsql --schema packet_schema.txt --link csv=records.csv
      oopscope run local.gsql --functions my.def --udf my_udfs.py --link main=trace.pcap
    """
    import logging

    from tools.errors import RunError
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run as run_pipeline

    if punctuate_every <= 0:
        raise click.BadParameter("must be positive", param_hint="--punctuate-every")
    separator = _separator(csv_separator)
    flow_links = _flow_links(netflow_in)
    if not links and not interfaces and not flow_links:
        raise click.UsageError("give --link NAME=PCAP (capture files) or --interface "
                               "NAME=IFACE (live capture)")
    extra: tuple = ()                  # (query, Sink) pairs (RunConfig.extra_sinks)
    exporter = None
    if netflow is not None:
        from tools.results.netflow import NetflowSink

        exporter = NetflowSink(netflow, int(netflow_version), pace=netflow_pace)
        extra = ((netflow_query, exporter),)
    config = RunConfig(query_file=query_files[0], more_query_files=query_files[1:],
                       links=_links(links) + flow_links, interfaces=_interfaces(interfaces),
                       netflow_links=tuple(n for n, _ in flow_links),
                       flow_timeout_ns=netflow_in_timeout.default_ns,
                       flow_exporter_timeouts=netflow_in_timeout.exporters,
                       flow_idle_ns=netflow_in_idle,
                       outputs=_pairs(outputs, "--output"), format=fmt,
                       overrides=_pairs(sets, "--set"), params=_pairs(params, "--param"),
                       master=master, spool=spool, checkpoint=checkpoint,
                       punctuate_every_ns=punctuate_every, speed=_speed(speed),
                       duration_ns=duration, lull_slack_ns=lull_slack, progress=progress,
                       capture_options=capture_options, extra_sinks=extra,
                       keep_results=False, fanout=fanout,
                       schema_files=tuple(schema_files), csv_separator=separator,
                       function_files=tuple(function_files), udf_module=udf_module)
    summary = run_pipeline(config)
    # the summary is the run's report, not a diagnostic: always shown, on stderr
    click.echo(summary.format(), err=True)
    if exporter is not None:
        click.echo(exporter.summary(), err=True)
    logging.getLogger(__name__).debug("run finished in %.2f s", summary.total_seconds)
    if summary.problems:
        raise RunError(f"{len(summary.problems)} input problem(s), see above; the results of "
                       f"every readable packet were written")
