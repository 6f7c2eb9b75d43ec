"""`oopscope serve`: the appliance, running until stopped; queries come and go while it runs."""

from __future__ import annotations

import click

from tools.commands.params import Duration, Size, active_timeout_option


@click.command()
@click.option("--interface", "interfaces", multiple=True, metavar="NAME=IFACE",
              help="Capture live on IFACE as link NAME (repeatable). Needs root or "
                   "CAP_NET_RAW.")
@click.option("--link", "links", multiple=True, metavar="NAME=PCAP",
              help="Replay a capture file as link NAME, paced and stamped with the wall "
                   "clock (repeatable; for demos and tests).")
@click.option("--records", "records", multiple=True, metavar="NAME=PROTOCOL:PATH",
              help="A record link (repeatable): the records of PROTOCOL, a record protocol "
                   "of a --schema file, from PATH: a FIFO or - read as records arrive, or a "
                   "file of records timed by a field of their own, replayed once at --speed.")
@click.option("--schema", "schema_files", multiple=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="A schema file (GS-lite's packet_schema.txt format, repeatable): the "
                   "protocols of --records, and of every query submitted (a query's own "
                   "schema files, `submit --schema`, replace its protocols).")
@click.option("--csv-separator", "csv_separator", default=None, metavar="CHAR",
              help="The field separator of CSV record links (default: detected from the "
                   "first line among , | tab ; else space).")
@click.option("--netflow-in", "netflow_in", multiple=True, metavar="NAME=HOST:PORT|FILE.pcap",
              help="A link of NetFlow v5/v9/IPFIX flow records (repeatable): a UDP collector "
                   "on HOST:PORT (its templates kept in --state), or the exported datagrams "
                   "of a capture file replayed once by capture time at --speed. Queries "
                   "submitted read it as NETFLOW (FROM NAME.NETFLOW).")
@active_timeout_option("The exporters' active timeout: a NETFLOW link's punctuation on flow "
                      "start is each exporter's latest export time minus this (an "
                      "exporter that sends its own timeout is taken at its word).")
@click.option("--speed", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
              help="Replay --link files (and --records files) at this many times real "
                   "time.")
@click.option("--loop", is_flag=True, help="Replay --link files over and over.")
@click.option("--state", "state", required=True, type=click.Path(file_okay=False),
              help="Directory of everything the server remembers: queries, spools, "
                   "checkpoints (a restart with the same --state resumes them).")
@click.option("--output-root", default=None, type=click.Path(file_okay=False),
              help="Queries write only below this directory (default: --state).")
@click.option("--listen", default="127.0.0.1:7405", show_default=True,
              metavar="HOST:PORT|unix[:PATH]",
              help="Where the control API and the page listen. A non-loopback address "
                   "needs --token-file.")
@click.option("--token-file", default=None, type=click.Path(dir_okay=False),
              help="A file holding the token every request must carry (mode 0600: one "
                   "others may read is refused).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME[:PORT]",
              help="A Host name requests may carry besides the server's own address and "
                   "loopback names (repeatable): a reverse proxy's public name. Others get "
                   "421 (DNS rebinding).")
@click.option("--max-body", "max_body", type=click.IntRange(1024, 1 << 30), default=1 << 20,
              show_default=True, metavar="BYTES", help="The largest request body (413).")
@click.option("--request-timeout", "request_timeout", type=Duration(), default="10s",
              show_default=True, help="A client has this long to send a whole request; "
                                      "its connection is then closed.")
@click.option("--max-connections", "max_connections", type=click.IntRange(8, 100_000),
              default=200, show_default=True,
              help="Open HTTP connections; past it the oldest one still sending its "
                   "request is closed.")
@click.option("--max-streams", "max_streams", type=click.IntRange(1, 10_000), default=32,
              show_default=True, help="Event streams (pages) and tails open at once; "
                                      "past it, 503.")
@click.option("--master", default=None, metavar="URL", help="Spark master (default local[*]).")
@click.option("--spool", default=None, type=click.Path(file_okay=False),
              help="A directory shared with capture agents (`oopscope agent --spool DIR` "
                   "without a query file): their links are the server's too, and a query "
                   "reading one has its low level run by its agent.")
@click.option("--agent-timeout", "agent_timeout", type=Duration(), default=None,
              help="An agent link whose agent has not beaten for this long is silent: "
                   "windows close without it (default: 3 of the agent's punctuation periods, "
                   "at least 2s).")
@click.option("--fanout", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Capture each --interface with N processes in one PACKET_FANOUT group (a "
                   "flow stays on one), each running the low level of the queries on its "
                   "own core; their rows are melded (the same rows as N = 1).")
@click.option("--punctuate-every", "punctuate_every", type=Duration(), default="1s",
              show_default=True, help="Timer punctuation period of every link.")
@click.option("--lull-slack", "lull_slack", type=Duration(), default="1s", show_default=True,
              help="During a lull a link punctuates the wall clock minus this.")
@click.option("--promiscuous", is_flag=True, help="Live capture in promiscuous mode.")
@click.option("--snaplen", type=click.IntRange(64, 262144), default=None,
              help="Live capture: bytes kept of each frame (default: the headers, 256, "
                   "while no query reads TCP_data, UDP_data or caplen; every byte while one "
                   "does).")
@click.option("--ring-blocks", "ring_blocks", type=click.IntRange(2, 1 << 16), default=64,
              show_default=True, help="Live capture: blocks of the kernel ring.")
@click.option("--ring-block-size", "ring_block_size", type=click.IntRange(4096, 1 << 30),
              default=1 << 22, show_default=True, help="Live capture: bytes per ring block.")
@click.option("--direction", type=click.Choice(["in", "out", "inout"]), default="inout",
              show_default=True, help="Live capture: packets received, sent, or both (as "
                                      "tcpdump -Q; on loopback each packet counts once).")
@click.option("--data-dir", "data_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="A directory whose files submitted queries may name (repeatable): prefix "
                   "files of getlpmid, regular expression files of str_file_regex_match; a "
                   "relative name is read from the first. Without it a query naming a file "
                   "is refused.")
@click.option("--memory-budget", "memory_budget", type=Size(), default=None, metavar="SIZE",
              help="Memory the running queries' low-level tables may take together (512MiB, "
                   "4GiB); a submission that would exceed it is refused. Default: a quarter "
                   "of the machine's memory, at most 4 GiB.")
@click.option("--umask", "umask", default="077", show_default=True, metavar="OCTAL",
              callback=lambda ctx, param, value: _umask(value),
              help="The server's umask: what it writes (state, outputs) is its user's alone "
                   "by default; 027 lets the owning group read the results.")
@click.option("--ready-file", default=None, hidden=True,
              help="Write the server's URL here once it listens (for scripts and tests).")
def serve(interfaces, links, records, schema_files, csv_separator, netflow_in,
          netflow_in_timeout, speed, loop, state,
          output_root, listen, token_file, allow_hosts, max_body, request_timeout,
          max_connections, max_streams, master, spool, agent_timeout, fanout, punctuate_every,
          lull_slack, promiscuous, snaplen, ring_blocks, ring_block_size, direction, data_dirs,
          memory_budget, umask, ready_file) -> None:
    """Run the appliance: capture on the links, run the queries submitted to it.

    Queries are submitted (`oopscope submit`), listed (`queries`), tailed (`tail`) and
    cancelled (`cancel`) while capture goes on; `status` shows the links and `shutdown` (or
    SIGTERM) stops it with every window closed and written. The live page is at the
    server's URL, the Prometheus metrics at /metrics. After a crash, the same command
    resumes every query that was running; the time it was down is reported as a gap.

    \b
    Examples:
      sudo oopscope serve --interface main=eth0 --state /var/lib/oopscope
      oopscope serve --link main=trace.pcap --loop --state /tmp/oops
      oopscope serve --schema s.txt --records csv=CSV_EXAMPLE:feed.fifo --state /tmp/oops
      oopscope serve --netflow-in r1=0.0.0.0:2055 --state /var/lib/oopscope
      oopscope serve --spool /shared/oops --state /var/lib/oopscope   # agents' links
      sudo oopscope serve --interface main=eth0 --fanout 4 --state /var/lib/oopscope
    """
    from pathlib import Path

    from tools.commands.run import _flow_links, _interfaces, _links, _separator
    from tools.serve.appliance import ServeConfig
    from tools.serve.guard import HttpLimits, split_host
    from tools.serve.server import parse_listen, read_token
    from tools.serve.server import serve as run_server

    netflow = _flow_links(netflow_in)
    if not links and not interfaces and not spool and not records and not netflow:
        raise click.UsageError("give --interface NAME=IFACE (live), --link NAME=PCAP, "
                               "--records NAME=PROTOCOL:PATH, --netflow-in "
                               "NAME=HOST:PORT|FILE.pcap, or --spool DIR (the agents' links)")
    if fanout > 1 and (links or not interfaces):
        raise click.UsageError("--fanout splits live interfaces over capture processes: give "
                               "--interface NAME=IFACE (a capture file, --link, is read by "
                               "one)")
    capture_options = (("promiscuous", promiscuous), ("snaplen", snaplen),
                       ("block_count", ring_blocks), ("block_size", ring_block_size),
                       ("frame_timeout_ms", 100), ("direction", direction))
    config = ServeConfig(state=state, links=_links(links), interfaces=_interfaces(interfaces),
                         speed=speed, loop=loop, master=master, output_root=output_root,
                         punctuate_every_ns=punctuate_every, lull_slack_ns=lull_slack,
                         capture_options=capture_options, spool=spool,
                         agent_timeout_s=None if agent_timeout is None else agent_timeout / 1e9,
                         fanout=fanout, schema_files=tuple(schema_files),
                         records=_record_links(records), netflow=netflow,
                         flow_timeout_ns=netflow_in_timeout.default_ns,
                         flow_exporter_timeouts=netflow_in_timeout.exporters,
                         csv_separator=_separator(csv_separator),
                         data_dirs=tuple(data_dirs), memory_budget=memory_budget,
                         umask=umask)
    for name in allow_hosts:
        try:
            ok = bool(split_host(name)[0])
        except ValueError:
            ok = False
        if not ok:
            raise click.BadParameter(f"{name!r} is not NAME or NAME:PORT",
                                     param_hint="--allow-host")
    if request_timeout < 10**8:
        raise click.BadParameter("give at least 0.1s", param_hint="--request-timeout")
    limits = HttpLimits(allow_hosts=tuple(allow_hosts), max_body=max_body,
                        request_timeout=request_timeout / 1e9,
                        max_connections=max_connections, max_streams=max_streams)
    run_server(config, parse_listen(listen, Path(state).resolve()),
               read_token(token_file, private=True), ready_file, limits)


def _record_links(values: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    out = []
    for item in values:
        name, _, rest = item.partition("=")
        protocol, _, path = rest.partition(":")
        if not name.strip() or not protocol.strip() or not path.strip():
            raise click.BadParameter(f"{item!r} is not NAME=PROTOCOL:PATH", param_hint="--records")
        out.append((name.strip(), protocol.strip(), path.strip()))
    return tuple(out)


def _umask(value: str) -> int:
    try:
        mask = int(value, 8)
    except ValueError:
        mask = -1
    if not 0 <= mask <= 0o777:
        raise click.BadParameter(f"{value!r} is not an octal umask (e.g. 077, 027)",
                                 param_hint="--umask")
    if mask & 0o022 != 0o022:
        # a state directory others can write to is refused at the next start
        raise click.BadParameter(f"{value}: would let others than the owner write the "
                                 f"state and the outputs; keep 022 in it (e.g. 027)",
                                 param_hint="--umask")
    return mask
