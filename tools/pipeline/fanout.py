"""One link faster than one core: N capture processes in one PACKET_FANOUT group.

`--interface NAME=IFACE --fanout N` (on `agent` and `run`) opens N capture sockets on IFACE in
one fanout group in hash mode (`capture.live.Fanout`): the kernel gives each packet to one
socket, both directions of a flow to the same one. Each socket is read by its own process, an
agent (`oopscope agent --fanout-member K/N/GROUP`), with its own low-level operators on its own
core: Python threads would share one interpreter lock between the N decoders and operators.
Member K spools as sub-link `NAME#K` (`highlevel.graph.sublink_names`), with its own
punctuation; the stages meld the sub-links of NAME as they meld links, so the rows are those of
one socket (a group is exact per window whichever socket its packets came through, as it is
across links).

`FanoutMembers` starts, watches and stops the member processes of one parent. The appliance
(`oopscope serve --fanout N`) uses it too: its members are agents in watch mode (no query
file, `tools.cluster.watch`), each offering its share of the interface as `NAME#K` and running
the low level of the submitted queries that read NAME.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from tools.errors import RunConfigError, RunError

log = logging.getLogger(__name__)

#: a member's sub-link and host id: NAME#K, HOST.K
SUBLINK = "{link}#{k}"


@dataclass(frozen=True)
class Member:
    """Which member of a fanout group an agent is: index k of n, the group id."""

    k: int
    n: int
    group: int

    @classmethod
    def parse(cls, text: str) -> Member:
        try:
            k, n, group = (int(x) for x in text.split("/"))
        except ValueError:
            raise RunConfigError(f"--fanout-member {text!r}: write K/N/GROUP") from None
        if not (0 <= k < n and 0 <= group <= 0xFFFF):
            raise RunConfigError(f"--fanout-member {text!r}: K in 0..N-1, GROUP in 0..65535")
        return cls(k, n, group)

    def __str__(self) -> str:
        return f"{self.k}/{self.n}/{self.group}"

    def sublink(self, link: str) -> str:
        return SUBLINK.format(link=link, k=self.k)

    def capture(self, interfaces, options) -> tuple[tuple, tuple]:
        """(interfaces, capture options) of this member: its one interface offered as the
        sub-link, captured through its own socket of the group."""
        from capture.live import Fanout

        if len(interfaces) != 1:
            raise RunConfigError("--fanout-member captures one interface: give one "
                                 "--interface NAME=IFACE and no --link")
        ((link, iface),) = interfaces
        return ((self.sublink(link), iface),), (*options, ("fanout", Fanout(self.group, "hash")))


def member_argv(config, spool: str, host: str, member: Member) -> list[str]:
    """The command line of one member agent for the run or agent `config` (one interface),
    or for the appliance's `ServeConfig` (no query file: a member in watch mode)."""
    from tools.pipeline.heartbeat import check_host_id

    ((link, iface),) = config.interfaces
    query_files = getattr(config, "query_files", ())
    argv = [sys.executable, "-m", "tools.cli", "agent", *map(str, query_files),
            "--interface", f"{link}={iface}", "--spool", str(spool),
            "--host-id", check_host_id(f"{host}.{member.k}"),
            "--fanout-member", str(member),
            "--punctuate-every", f"{config.punctuate_every_ns}ns",
            "--lull-slack", f"{config.lull_slack_ns}ns"]
    for key, value in getattr(config, "overrides", ()):
        argv += ["--set", f"{key}={value}"]
    for key, value in getattr(config, "params", ()):
        argv += ["--param", f"{key}={value}"]
    for schema in getattr(config, "schema_files", ()):
        argv += ["--schema", str(schema)]
    for declarations in getattr(config, "function_files", ()):
        argv += ["--functions", str(declarations)]
    if getattr(config, "udf_module", None):
        argv += ["--udf", str(config.udf_module)]
    options = dict(config.capture_options)
    flags = {"promiscuous": "--promiscuous"}
    valued = {"direction": "--direction", "snaplen": "--snaplen",
              "block_count": "--ring-blocks", "block_size": "--ring-block-size"}
    for key, flag in flags.items():
        if options.get(key):
            argv.append(flag)
    for key, flag in valued.items():
        if options.get(key) is not None:
            argv += [flag, str(options[key])]
    if "frame_timeout_ms" in options:
        argv += ["--ring-timeout", f"{int(options['frame_timeout_ms'])}ms"]
    return argv


class FanoutMembers:
    """The member processes of every fanned-out interface of one parent (a run, an agent or
    the appliance). Each runs in its own process group, gets SIGTERM at `stop`, and dies with
    the parent (start them from a thread that lives as long as the parent: the kernel's
    parent-death signal follows the thread that forked)."""

    def __init__(self, config, spool: str, host: str, fanout: int):
        from capture.live import fanout_group_for_process

        if fanout < 2:
            raise RunConfigError(f"--fanout {fanout}: FanoutMembers needs at least 2")
        if not config.interfaces:
            raise RunConfigError("--fanout splits a live interface over N capture processes: "
                                 "give --interface NAME=IFACE")
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.commands: list[tuple[str, list[str]]] = []
        #: sub-link -> (link, member host id) of every member
        self.members: dict[str, tuple[str, str]] = {}
        base = fanout_group_for_process(os.getpid())
        for i, (link, iface) in enumerate(config.interfaces):
            group = (base + i) & 0xFFFF
            one = _one_interface(config, link, iface)
            for k in range(fanout):
                member = Member(k, fanout, group)
                self.commands.append((member.sublink(link),
                                      member_argv(one, spool, host, member)))
                self.members[member.sublink(link)] = (link, f"{host}.{k}")

    def start(self) -> None:
        from highlevel.cluster import _die_with_parent

        for sub, argv in self.commands:
            log.info("fanout member %s: %s", sub, " ".join(argv))
            self.procs.append((sub, subprocess.Popen(argv, start_new_session=True,
                                                     preexec_fn=_die_with_parent)))

    def failed(self) -> list[str]:
        """Members that have ended with an error (a message each)."""
        return [f"fanout member {sub} (pid {p.pid}) exited with {p.returncode}"
                for sub, p in self.procs if p.poll() not in (None, 0)]

    def running(self) -> bool:
        return any(p.poll() is None for _, p in self.procs)

    def exited(self) -> dict[str, tuple[int, int]]:
        """Sub-link -> (pid, exit code) of every member that has ended."""
        return {sub: (p.pid, p.returncode) for sub, p in self.procs if p.poll() is not None}

    def pids(self) -> dict[str, int]:
        return {sub: p.pid for sub, p in self.procs}

    def stop(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> None:
        """Wait for every member; kill those still there after `timeout`; raise if any
        failed."""
        deadline = time.monotonic() + timeout
        for sub, p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("fanout member %s (pid %d) did not end; killed", sub, p.pid)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        bad = self.failed()
        if bad:
            raise RunError("; ".join(bad) + " (its error is above)")

    def summarise(self, summary, spool) -> None:
        """Each fanned-out link's numbers in `summary.links`: its members' last heartbeats,
        added up (the members' own summaries are on stderr before)."""
        from tools.pipeline.heartbeat import add_link_totals, read_heartbeats

        n = len(self.procs)
        add_link_totals(summary.links, read_heartbeats(spool), source=lambda _: f"fanout of {n}")

    def drive(self, stop, duration_ns: int | None) -> str:
        """Until a stop request, the duration, or a member failing; then stop them all."""
        started = time.monotonic()
        reason = "stopped"
        while True:
            if stop():
                break
            if duration_ns is not None and (time.monotonic() - started) * 1e9 >= duration_ns:
                reason = "duration"
                break
            if self.failed() or not self.running():
                reason = "capture failed" if self.failed() else "end of input"
                break
            time.sleep(0.1)
        self.stop()
        self.wait()
        return reason


def _one_interface(config, link: str, iface: str):
    from dataclasses import replace

    return replace(config, interfaces=((link, iface),), links=())
