"""`oopscope bench`: benchmark subcommands (a click group; heavy imports stay inside the bodies)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from tools.commands.params import Duration

log = logging.getLogger(__name__)


@click.group()
def bench() -> None:
    """Benchmarks that reproduce the thesis' experiments (tables on stdout, progress on stderr)."""


@bench.command("iop-vs-oop")
@click.option("--quick", is_flag=True,
              help="Smaller sizes (33K and 130K groups, short probes, 16K-group union, 1K tuples/s "
                   "join): under two minutes on 2 cores.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the whole report (every probe) as JSON here.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write iop_oop_throughput.png and iop_oop_memory.png into this directory.")
@click.option("--groups", type=str, default=None,
              help="Experiment 1 group counts, comma-separated (default 66000,130000,260000,520000).")
@click.option("--ring-rows", type=int, default=None, help="Packet ring capacity in rows (default 8192).")
@click.option("--no-pin", is_flag=True, help="Do not pin the producer and the consumer to cores 0 and 1.")
def iop_vs_oop(quick: bool, json_out: Path | None, plot_dir: Path | None, groups: str | None,
               ring_rows: int | None, no_pin: bool) -> None:
    """IOP vs OOP (thesis 8.4.1): Q8-1 max loss-free rate through a packet ring, Q8-2 union
    memory (Meld vs Merge) and Q8-3 join memory under arrival skew."""
    from dataclasses import replace

    from common.errors import ConfigError
    from tools.experiments import iop_oop as bio

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench: %(message)s")
    logging.getLogger("tools").setLevel(logging.INFO)
    tcfg = bio.QUICK if quick else bio.ThroughputConfig()
    changes: dict[str, Any] = {}   # ThroughputConfig fields to replace (of several types)
    if groups:
        try:
            changes["groups"] = tuple(int(g) for g in groups.split(","))
        except ValueError:
            raise ConfigError(f"--groups takes comma-separated integers (got {groups!r})") from None
        if any(g < 100 for g in changes["groups"]):
            raise ConfigError(f"--groups values must be at least 100 (got {groups!r})")
    if ring_rows is not None:
        if ring_rows < 1024:
            raise ConfigError(f"--ring-rows must be at least 1024 (got {ring_rows})")
        changes["ring_rows"] = ring_rows
    if no_pin:
        changes["pin"] = False
    report = bio.run_all(quick, plot_dir, throughput=replace(tcfg, **changes))
    click.echo(report["tables"])
    t = report["timings_s"]
    click.echo(f"\n{report['mode']} run: {t['total']:.0f} s (throughput {t['throughput']:.0f} s, "
               f"union {t['union_memory']:.0f} s, join {t['join_memory']:.0f} s); load average "
               f"{report['load_avg_start'][0]:.1f} at start, {report['load_avg_end'][0]:.1f} at end "
               f"on {report['cpus']} CPUs")
    if json_out:
        json_out.write_text(json.dumps(report, indent=1, default=str))
        log.info("report written to %s", json_out)


@bench.command("disorder")
@click.option("--quick", is_flag=True, help="Shorter inputs (same windows, slacks and disorder).")
@click.option("--case", "cases", multiple=True, type=click.Choice(["band", "block", "netflow"]),
              help="Run only these experiments (repeatable; default all three).")
@click.option("--netflow-in", "netflow_in", default=None, metavar="FILE.pcap",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The netflow case's input: a capture of exported NetFlow v5/v9/IPFIX "
                   "datagrams (default: a router's minute purges made by oopscope's exporter).")
@click.option("--netflow-timeout", "netflow_timeout", type=Duration(), default="60s",
              show_default=True, help="The netflow case: the exporter's active timeout, the "
                                      "bound of its disorder (the generated router's purge "
                                      "interval is 60 s).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the report as JSON here.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Write bench_disorder.png into this directory (matplotlib).")
def disorder(quick: bool, cases: tuple[str, ...], netflow_in: Path | None,
             netflow_timeout: int, json_path: Path | None, plot_dir: Path | None) -> None:
    """Buffering with slack (consistent, generous) vs punctuation on band and block disorder,
    and on exported NetFlow records (windows on flow start)."""
    import tempfile

    from tools.experiments import nfdisorder
    from tools.experiments.disorder import format_report, plain_json, plot_report, run

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="bench: %(message)s")
    cases = cases or ("band", "block", "netflow")
    report = run(quick, [c for c in cases if c != "netflow"])
    if report["workloads"]:
        click.echo(format_report(report))
    if "netflow" in cases:
        case = nfdisorder.NetflowCase(timeout_s=netflow_timeout / 1e9)
        with tempfile.TemporaryDirectory(prefix="oopscope-nfdisorder-") as tmp:
            pcap = netflow_in or nfdisorder.make_input(Path(tmp), quick)
            report["netflow"] = nfdisorder.run_case(pcap, case)
        click.echo(nfdisorder.format_case(report["netflow"]))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1, default=plain_json))
        log.info("report written to %s", json_path)
    if plot_dir is not None and report["workloads"]:
        path = plot_report(report, plot_dir)
        click.echo(f"plot: {path}", err=True)
