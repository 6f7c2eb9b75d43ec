"""`oopscope gen OUT.pcap`: write synthetic captures (one file per link) and a JSON manifest beside them."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import click

from common.units import NS_PER_S as _NS
from tools.commands.params import COUNT, DURATION, parse_duration

log = logging.getLogger(__name__)

DEFAULT_DURATION_NS = 60 * _NS
DEFAULT_PACKETS = 100_000


def resolve_volume(packets: int | None, rate: int | None, duration_ns: int | None) -> tuple[int, int]:
    """(packets per link, duration ns) from any two of packets, rate (pkts/s) and duration.

    With one of them, the defaults fill in (duration 60 s, else 100,000 packets); all three must
    agree to within one packet. Raises click.UsageError naming the conflict.
    """
    if rate is not None and rate <= 0:
        raise click.UsageError("--rate must be positive")
    if duration_ns is not None and duration_ns <= 0:
        raise click.UsageError("--duration must be positive")
    if packets is not None and rate is not None:
        implied = int(round(packets / rate * _NS))
        if duration_ns is not None and abs(duration_ns * rate / _NS - packets) > 1:
            raise click.UsageError(
                f"--packets {packets}, --rate {rate} and --duration {duration_ns / _NS:g}s disagree "
                f"(give two of the three; these packets at this rate last {implied / _NS:g}s)")
        return packets, duration_ns if duration_ns is not None else implied
    if rate is not None:
        d = DEFAULT_DURATION_NS if duration_ns is None else duration_ns
        return max(1, int(round(rate * d / _NS))), d
    return (DEFAULT_PACKETS if packets is None else packets,
            DEFAULT_DURATION_NS if duration_ns is None else duration_ns)


def parse_start(text: str) -> int:
    """Epoch nanoseconds from epoch seconds (`1767225600`) or an ISO 8601 UTC time (`2026-01-01T00:00:00Z`)."""
    try:
        return int(round(float(text) * _NS))
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither epoch seconds nor an ISO 8601 time",
                                 param_hint="--start") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)   # a capture clock is UTC; never local time
    return int(dt.timestamp()) * _NS + dt.microsecond * 1000


@click.command("gen", context_settings={"show_default": True})
@click.argument("out", type=click.Path(dir_okay=False, writable=False))
@click.option("-n", "--packets", type=COUNT, default=None,
              help="Packets per link (5M, 260k ...). Default 100k, or rate x duration.")
@click.option("--rate", type=COUNT, default=None, help="Packets per second per link (110k ...).")
@click.option("--duration", type=DURATION, default=None, help="Data time covered (10s, 1min, 2h). Default 60s.")
@click.option("--groups", type=COUNT, default=1000, help="Distinct (srcIP, destIP) pairs.")
@click.option("--flows", type=COUNT, default=None, help="Distinct 5-tuples (>= groups). Default: = groups.")
@click.option("--tcp", type=click.FloatRange(0, 1), default=0.8, help="Share of flows that are TCP.")
@click.option("--udp", type=click.FloatRange(0, 1), default=0.18, help="Share of flows that are UDP.")
@click.option("--icmp", type=click.FloatRange(0, 1), default=0.02, help="Share of flows that are ICMP echo.")
@click.option("--sizes", default="imix", metavar="MIX",
              help="Wire sizes: imix | bimodal | trimodal | fixed:N | uniform:A-B.")
@click.option("--ipv6", type=click.FloatRange(0, 1), default=0.0, help="Share of groups that are IPv6.")
@click.option("--snaplen", type=click.IntRange(1, 262144), default=65535, help="Snap length (caplen <= it).")
@click.option("--nanosecond", is_flag=True, help="Nanosecond timestamps (magic a1b23c4d).")
@click.option("--links", type=click.IntRange(1, 64), default=1,
              help="Files to write; with more than one: OUT's stem + -l<i> (out-l0.pcap, out-l1.pcap).")
@click.option("--skew", type=DURATION, default="0s", help="Link i's data lags link 0's by i x skew.")
@click.option("--disorder", type=click.Choice(["none", "band", "block"]), default="none",
              help="Disorder model (record order = arrival order).")
@click.option("--max-delay", type=DURATION, default=None, help="Band disorder: the largest lateness.")
@click.option("--late-share", type=click.FloatRange(0, 1), default=1.0, help="Band disorder: share of late packets.")
@click.option("--block", "block", type=DURATION, default=None, help="Block-sorted disorder: block length.")
@click.option("--reverse", type=click.FloatRange(0, 1), default=0.0,
              help="Share of flows with packets in both directions (SYN-ACK, replies).")
@click.option("--zipf", type=click.FloatRange(0), default=0.0, help="Flow popularity exponent (0: uniform).")
@click.option("--flow-duration", type=DURATION, default=None,
              help="Mean flow lifetime: each flow's packets fall within an exponential life "
                   "of this mean from a random start, as in bursty real traffic (5s: a flow "
                   "is one NetFlow record). Default: every flow spans the capture.")
@click.option("--quiet-link", "quiet_links", type=int, multiple=True,
              help="A low-volume link (index; repeatable).")
@click.option("--quiet-rate", type=click.FloatRange(min=0, min_open=True), default=1.0,
              help="Packets per second on a quiet link.")
@click.option("--lulls", type=click.IntRange(0), default=0,
              help="Silent gaps per quiet link (every link if there is no quiet link).")
@click.option("--lull", type=DURATION, default=None, help="Length of each silent gap (default 10s when --lulls is given).")
@click.option("--start", default=None, help="First timestamp: epoch seconds or ISO 8601 UTC. Default 2026-01-01T00:00:00Z.")
@click.option("--seed", type=int, default=0, help="Random seed (same seed, same bytes).")
@click.option("-q", "--quiet", is_flag=True, help="No summary line on stderr.")
def gen(out, packets, rate, duration, groups, flows, tcp, udp, icmp, sizes, ipv6, snaplen, nanosecond,
        links, skew, disorder, max_delay, late_share, block, reverse, zipf, flow_duration, quiet_links,
        quiet_rate, lulls, lull, start, seed, quiet):
    """Write a synthetic capture OUT (classic pcap, Ethernet) and its manifest OUT.manifest.json.

    With --links N > 1 the files are OUT's stem + -l<i> (out.pcap: out-l0.pcap, out-l1.pcap ...).
    Every link draws from the same flows, so with --reverse the server-to-client packets of one
    link match client-to-server packets of another (joins on reverse 5-tuples, thesis Q8-3).

    \b
    The benchmark workload (5M packets, 260K groups, 64-byte snaps, 10 minutes):
      oopscope gen bench.pcap -n 5M --duration 10min --groups 260k --snaplen 64 --icmp 0 --udp 0.3 --tcp 0.7
    Many short flows, as NetFlow meters see them (the NetFlow benchmark's capture):
      oopscope gen nf.pcap -n 5M --duration 10min --flows 500k --groups 62500 --flow-duration 5s
    Two links with 20 s arrival skew, 110k pkts/s each (thesis Q8-2):
      oopscope gen q82.pcap --links 2 --rate 110k --duration 2min --groups 65536 --skew 20s
    """
    from common.errors import ConfigError
    from tools.gen.traffic import DEFAULT_START_NS, TrafficConfig, generate

    n, dur = resolve_volume(packets, rate, duration)
    if lulls and lull is None:
        lull = parse_duration("10s")
    if lull and not lulls:
        lulls = 1
    cfg = TrafficConfig(
        packets=n, duration_ns=dur, groups=groups, flows=flows, tcp=tcp, udp=udp, icmp=icmp, sizes=sizes,
        ipv6=ipv6, snaplen=snaplen, nanosecond=nanosecond, links=links, skew_ns=skew, disorder=disorder,
        max_delay_ns=max_delay or 0, disorder_share=late_share, block_ns=block or 0, reverse=reverse,
        zipf=zipf, flow_duration_ns=flow_duration or 0, quiet_links=tuple(sorted(set(quiet_links))),
        quiet_rate=quiet_rate, lulls=lulls, lull_ns=lull or 0,
        start_ns=DEFAULT_START_NS if start is None else parse_start(start), seed=seed)
    try:
        cfg.validate()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    from pathlib import Path

    # `oopscope gen demo/demo.pcap` (the README's): the folder is made, as a new file would be
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: cannot create its folder {Path(out).parent}: "
                          f"{exc.strerror or exc}") from None
    t0 = time.perf_counter()
    paths = generate(cfg, out)
    secs = time.perf_counter() - t0
    total = sum(cfg.link_packets_count(i) for i in range(cfg.links))
    files = ", ".join(str(p) for p in paths.values())
    log.info("config: %s", cfg)
    if not quiet:
        click.echo(f"oopscope gen: {total:,} packets, {cfg.groups:,} groups, {cfg.n_flows:,} flows, "
                   f"{cfg.links} link(s), {cfg.duration_ns / _NS:g}s, disorder {cfg.disorder}, seed {cfg.seed} "
                   f"-> {files} in {secs:.2f}s ({total / max(secs, 1e-9) / 1e6:.2f} M pkts/s)", err=True)
