"""A throw-away network namespace joined to this one by a veth pair: a quiet wire for live-capture tests and benchmarks.

    with VethPair() as pair:                 # needs root and `ip` (iproute2)
        cap = open_interface(pair.outer)     # capture here ...
        pair.run_inside(["tcpreplay", "-i", pair.inner, "--pps", "1000", "x.pcap"])   # ... send from there

The inner end lives in the namespace `pair.netns`; the outer end in the caller's namespace.
IPv6 is disabled on both ends before they come up and neither has an address, so the kernel
sends nothing of its own (no router solicitations, no DAD, no ARP): what crosses the wire is
what the caller sends. Names are unique per process and object; `close()` (also on errors in
the `with` body) deletes the pair and the namespace.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from common.errors import OopscopeError

log = logging.getLogger(__name__)

_serial = itertools.count()


class NamespaceError(OopscopeError):
    """The namespace or the veth pair could not be made (not root, no iproute2, no netns support)."""


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def can_make_pairs() -> str | None:
    """None when this process can make a VethPair, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and packet sockets)"
    if shutil.which("ip") is None:
        return "iproute2 `ip` is not installed"
    if not Path("/proc/self/ns/net").exists():
        return "the kernel has no network namespaces"
    return None


class VethPair:
    """A namespace `netns` holding veth end `inner`, its peer `outer` here (see the module doc)."""

    def __init__(self, prefix: str = "oop"):
        n = next(_serial)
        tag = f"{os.getpid() % 100000}{n}"
        self.netns = f"{prefix}-ns-{tag}"
        self.outer = f"{prefix}o{tag}"[:15]   # IFNAMSIZ - 1
        self.inner = f"{prefix}i{tag}"[:15]
        self._made_ns = self._made_link = False
        why = can_make_pairs()
        if why:
            raise NamespaceError(f"cannot make a veth pair: {why}")
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _check(self, cmd: list[str]) -> None:
        res = _run(cmd)
        if res.returncode != 0:
            raise NamespaceError(f"`{' '.join(cmd)}` failed: {res.stderr.strip() or res.returncode}")

    def _setup(self) -> None:
        self._check(["ip", "netns", "add", self.netns])
        self._made_ns = True
        self._check(["ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner,
                     "netns", self.netns])
        self._made_link = True
        self._disable_ipv6(self.outer, inside=False)
        self._disable_ipv6(self.inner, inside=True)
        self._check(["ip", "link", "set", self.outer, "up"])
        self._check(self.inside(["ip", "link", "set", self.inner, "up"]))

    def _disable_ipv6(self, name: str, inside: bool) -> None:
        if not Path("/proc/sys/net/ipv6").is_dir():
            return  # no IPv6 in this kernel: nothing to silence
        cmd = ["sysctl", "-q", "-w", f"net.ipv6.conf.{name}.disable_ipv6=1"]
        self._check(self.inside(cmd) if inside else cmd)

    def inside(self, cmd: list[str]) -> list[str]:
        """`cmd` as run in the namespace."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def run_inside(self, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `cmd` in the namespace, wait for it; raises NamespaceError when it fails."""
        res = subprocess.run(self.inside(cmd), capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise NamespaceError(f"`{' '.join(cmd)}` in {self.netns} failed ({res.returncode}): "
                                 f"{res.stderr.strip()[-500:]}")
        return res

    def close(self) -> None:
        """Delete the pair (deleting one end deletes both) and the namespace; idempotent."""
        if self._made_link:
            res = _run(["ip", "link", "del", self.outer])
            if res.returncode != 0:
                log.debug("deleting %s: %s", self.outer, res.stderr.strip())
            self._made_link = False
        if self._made_ns:
            res = _run(["ip", "netns", "del", self.netns])
            if res.returncode != 0:
                log.warning("could not delete network namespace %s: %s", self.netns, res.stderr.strip())
            self._made_ns = False

    def __enter__(self) -> VethPair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
