"""`oopscope agent` and `oopscope collect`: the two levels on different hosts, joined by a
shared spool directory (docs/deployment.md)."""

from __future__ import annotations

import click

from tools.commands.params import (
    Duration,
    active_timeout_option,
    functions_option,
    schema_option,
)
from tools.commands.run import (
    _flow_links,
    _interfaces,
    _links,
    _pairs,
    _separator,
    _speed,
    live_options,
)


@click.command()
@click.argument("query_files", metavar="[QUERY_FILE...]", nargs=-1)
@click.option("--link", "links", multiple=True, metavar="NAME=PCAP",
              help="A capture file this agent replays as link NAME (repeatable), or a CSV "
                   "file (or FIFO) of records when the queries read it as a record protocol.")
@schema_option
@click.option("--csv-separator", "csv_separator", default=None, metavar="CHAR",
              help="The field separator of CSV record links (as on run).")
@functions_option
@click.option("--interface", "interfaces", multiple=True, metavar="NAME=IFACE",
              help="Capture live on IFACE as link NAME (repeatable). Needs root or "
                   "CAP_NET_RAW.")
@click.option("--netflow-in", "netflow_in", multiple=True, metavar="NAME=FILE.pcap|HOST:PORT",
              help="With QUERY_FILE: a link of NetFlow v5/v9/IPFIX flow records (as on run): "
                   "a capture file's exported datagrams, or a UDP collector on HOST:PORT "
                   "(until SIGTERM; its templates kept beside the heartbeat). Its queries "
                   "read it as NETFLOW.")
@active_timeout_option("The exporters' active timeout of --netflow-in links (as on run).")
@click.option("--spool", required=True, type=click.Path(file_okay=False),
              help="The shared spool directory (every agent and the collector see it).")
@click.option("--host-id", "host_id", default=None,
              help="This agent's name in the spool and the heartbeats (default: the host "
                   "name). Two agents never share one.")
@click.option("--speed", default="max", show_default=True, metavar="max|N",
              help="Replay capture files as fast as possible, or at N x real time (without "
                   "QUERY_FILE: always paced, max meaning 1).")
@click.option("--loop", is_flag=True,
              help="Without QUERY_FILE: replay --link files over and over.")
@click.option("--duration", type=Duration(), default=None,
              help="Stop after this long; every link still punctuates end of input.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a DEFINE key (as on run; the collector must be given the same).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Give a PARAM its value (as on run).")
@click.option("--punctuate-every", "punctuate_every", type=Duration(), default="1s",
              show_default=True, help="Timer punctuation and heartbeat period.")
@click.option("--lull-slack", "lull_slack", type=Duration(), default="1s", show_default=True,
              help="During a lull a link punctuates the clock minus this.")
@click.option("--fanout", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Capture each interface with N processes in one PACKET_FANOUT group (a "
                   "flow stays on one), each with its own low level on its own core.")
@click.option("--fanout-member", "fanout_member", default=None, hidden=True,
              help="K/N/GROUP: run as member K of an N-way fanout group (set by --fanout).")
@live_options
def agent(query_files, links, schema_files, csv_separator, function_files, udf_module,
          interfaces, netflow_in, netflow_in_timeout, spool, host_id, speed, loop, duration,
          sets, params, punctuate_every, lull_slack, fanout, fanout_member,
          capture_options) -> None:
    """Run only the low level of QUERY_FILE for this host's links, writing partial rows,
    punctuation and a heartbeat to the shared --spool for `oopscope collect`.

    Without QUERY_FILE the agent works for `oopscope serve --spool` over the same
    directory: it keeps its links open (capture files paced, stamped with the wall clock)
    and runs the low level of every query submitted to the server that reads them, until
    SIGTERM or Ctrl-C.

    A replay ends with end-of-input punctuation; a live agent runs until SIGTERM or Ctrl-C
    (every link flushes and punctuates end of input, exit 0). Started again over the same
    spool with the same --host-id, it continues where its spool ends.

    \b
    Examples:
      oopscope agent q8_1 --link l0=site-a.pcap --spool /shared/spool --host-id a
      sudo oopscope agent netflow --interface main=eth0 --spool /shared/spool
      oopscope agent --link edge=trace.pcap --loop --spool /shared/oops --host-id b
      oopscope agent flows.gsql --netflow-in r1=0.0.0.0:2055 --spool /shared/spool
    """
    from tools.cluster.agent import AgentConfig, run_agent
    from tools.pipeline.config import RunConfig
    from tools.pipeline.fanout import Member
    from tools.pipeline.heartbeat import default_host_id
    from tools.pipeline.threads import StopRequest

    if punctuate_every <= 0:
        raise click.BadParameter("must be positive", param_hint="--punctuate-every")
    flow_links = _flow_links(netflow_in)
    if not links and not interfaces and not flow_links:
        raise click.UsageError("give --link NAME=PCAP, --interface NAME=IFACE or "
                               "--netflow-in NAME=FILE.pcap|HOST:PORT")
    if flow_links and not query_files:
        raise click.UsageError("--netflow-in goes with QUERY_FILE (an agent working for "
                               "`oopscope serve` has no NETFLOW links; give them to serve "
                               "--netflow-in)")
    if not query_files:
        if schema_files or csv_separator or function_files or udf_module:
            raise click.UsageError("--schema, --csv-separator, --functions and --udf go with "
                                   "QUERY_FILE (an agent working for `oopscope serve` runs "
                                   "the server's queries)")
        _watch(links, interfaces, spool, host_id, speed, loop, duration, sets, params,
               punctuate_every, lull_slack, fanout, capture_options,
               None if fanout_member is None else Member.parse(fanout_member))
        return
    if loop:
        raise click.UsageError("--loop is for an agent without QUERY_FILE (one that works "
                               "for `oopscope serve`)")
    config = RunConfig(query_file=query_files[0], more_query_files=query_files[1:],
                       links=_links(links) + flow_links,
                       netflow_links=tuple(n for n, _ in flow_links),
                       flow_timeout_ns=netflow_in_timeout.default_ns,
                       flow_exporter_timeouts=netflow_in_timeout.exporters,
                       interfaces=_interfaces(interfaces), overrides=_pairs(sets, "--set"),
                       params=_pairs(params, "--param"), punctuate_every_ns=punctuate_every,
                       speed=_speed(speed), duration_ns=duration, lull_slack_ns=lull_slack,
                       capture_options=capture_options, progress=False, keep_results=False,
                       fanout=fanout, schema_files=tuple(schema_files),
                       csv_separator=_separator(csv_separator),
                       function_files=tuple(function_files), udf_module=udf_module)
    member = None if fanout_member is None else Member.parse(fanout_member)
    with StopRequest() as stop:
        summary = run_agent(AgentConfig(config, spool, host_id or default_host_id(), member),
                            stop)
    click.echo(summary.format(), err=True)


def _watch(links, interfaces, spool, host_id, speed, loop, duration, sets, params,
           punctuate_every, lull_slack, fanout, capture_options, member=None) -> None:
    """`oopscope agent` without a query file: watch --spool for the server's work."""
    from tools.cluster.watch import WatchConfig, run_watch
    from tools.pipeline.heartbeat import default_host_id
    from tools.pipeline.threads import StopRequest

    if sets or params:
        raise click.UsageError("--set and --param come with each query submitted to the "
                               "server; an agent without QUERY_FILE takes none")
    if fanout > 1:
        raise click.UsageError("--fanout needs QUERY_FILE (an agent working for the server "
                               "captures each interface with one process; the server's own "
                               "interfaces are fanned out by `oopscope serve --fanout N`)")
    config = WatchConfig(spool=spool, host_id=host_id or default_host_id(),
                         links=_links(links), interfaces=_interfaces(interfaces),
                         speed=_speed(speed) or 1.0, loop=loop,
                         punctuate_every_ns=punctuate_every, lull_slack_ns=lull_slack,
                         capture_options=capture_options, duration_ns=duration,
                         member=member)
    with StopRequest() as stop:
        click.echo(run_watch(config, stop), err=True)


@click.command()
@click.argument("query_files", metavar="QUERY_FILE...", nargs=-1, required=True)
@click.option("--spool", required=True, type=click.Path(file_okay=False),
              help="The shared spool directory the agents write.")
@schema_option
@functions_option
@click.option("--links", "links", default=None, metavar="A,B,...",
              help="The links to expect (default: learnt from the heartbeats of "
                   "--expect-agents agents).")
@click.option("--expect-agents", "expect_agents", type=click.IntRange(1), default=None,
              help="Wait for this many agents' heartbeats and meld their links.")
@click.option("--agent-timeout", "agent_timeout", type=Duration(), default=None,
              help="A link whose agent has not beaten for this long is silent: windows close "
                   "without it (default: 3 of the agents' punctuation periods).")
@click.option("--output", "outputs", multiple=True, metavar="QUERY=PATH",
              help="Write QUERY's rows to PATH (as on run).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "jsonl", "parquet"]),
              default=None, help="Output format (default: from the file suffix).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a DEFINE key (the agents' values).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Give a PARAM its value (the agents' values).")
@click.option("--master", default=None, metavar="URL",
              help="Spark master URL (default local[*]; spark://HOST:7077 for a cluster).")
@click.option("--checkpoint", default=None, type=click.Path(file_okay=False),
              help="Spark checkpoint directory (default: temporary).")
def collect(query_files, spool, schema_files, function_files, udf_module, links, expect_agents, agent_timeout, outputs, fmt, sets,
            params, master, checkpoint) -> None:
    """Run only the high level of QUERY_FILE over every agent's partial rows in --spool:
    Meld across all links of all agents, each window closed once, outputs as `run` writes
    them. Ends when every expected link has punctuated end of input, or at SIGTERM.

    \b
    Example:
      oopscope collect q8_1 --spool /shared/spool --expect-agents 2 \\
          --master spark://master:7077 --output q8_1=q8_1.csv
    """
    from tools.cluster.collector import CollectConfig, run_collector
    from tools.errors import RunError
    from tools.pipeline.config import RunConfig
    from tools.pipeline.threads import StopRequest

    names = tuple(n.strip() for n in (links or "").split(",") if n.strip())
    # a speed makes the run a continuous one (`RunConfig.streaming`): rows are written as
    # windows close, never held to the end
    config = RunConfig(query_file=query_files[0], more_query_files=query_files[1:],
                       schema_files=tuple(schema_files), function_files=tuple(function_files),
                       udf_module=udf_module, outputs=_pairs(outputs, "--output"),
                       format=fmt, overrides=_pairs(sets, "--set"),
                       params=_pairs(params, "--param"), master=master,
                       checkpoint=checkpoint, speed=1.0, progress=False, keep_results=False)
    with StopRequest() as stop:
        summary = run_collector(CollectConfig(
            config, spool, names, expect_agents,
            None if agent_timeout is None else agent_timeout / 1e9), stop)
    click.echo(summary.format(), err=True)
    if summary.problems:
        raise RunError(f"{len(summary.problems)} link problem(s), see above")
