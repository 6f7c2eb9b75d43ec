"""The appliance's configuration (`ServeConfig`) and the error a refused request gets."""

from __future__ import annotations

from dataclasses import dataclass

from common.datafiles import DataFiles
from common.units import NS_PER_S
from tools.errors import RunError


class ServeError(RunError):
    """A request the appliance refuses (the reply says why); `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServeConfig:
    """What `oopscope serve` was started with: links, state, Spark, agents, fanout."""

    state: str
    links: tuple[tuple[str, str], ...] = ()          # (name, capture file) replayed
    interfaces: tuple[tuple[str, str], ...] = ()     # (name, interface) live
    speed: float = 1.0
    loop: bool = False
    master: str | None = None
    output_root: str | None = None                   # None: the state directory
    punctuate_every_ns: int = NS_PER_S
    lull_slack_ns: int = NS_PER_S
    capture_options: tuple[tuple[str, object], ...] = ()
    spool: str | None = None                          # the directory shared with agents
    agent_timeout_s: float | None = None              # None: 3 of the agent's periods
    #: each interface captured by this many member processes (`serve --fanout N`)
    fanout: int = 1
    #: GS-lite schema files (`--schema`) declaring the record protocols of `records`, and
    #: read by every submission
    schema_files: tuple[str, ...] = ()
    #: (name, protocol, path) of the record links (`--records NAME=PROTOCOL:PATH`)
    records: tuple[tuple[str, str, str], ...] = ()
    csv_separator: str | None = None
    #: (name, HOST:PORT or capture file) of the NETFLOW links (`--netflow-in`)
    netflow: tuple[tuple[str, str], ...] = ()
    #: the exporters' active timeout of the NETFLOW links (`--netflow-in-active-timeout`)
    flow_timeout_ns: int = 30 * 60 * NS_PER_S
    #: the operator's active timeout of some exporters ((address, ns)), before their own
    flow_exporter_timeouts: tuple[tuple[str, int], ...] = ()
    #: the directories whose files a submitted query may name (`--data-dir`; none: no file)
    data_dirs: tuple[str, ...] = ()
    #: bytes the running queries' tables may take together (`--memory-budget`; None: the
    #: machine's default, `tools.serve.budget.default_budget`)
    memory_budget: int | None = None
    #: the process's umask (`serve --umask`): state files and outputs 0600, directories 0700
    umask: int = 0o077

    @property
    def data_files(self) -> DataFiles:
        """Which files a submitted query may read (`common.datafiles`)."""
        return DataFiles.under(self.data_dirs)

    @property
    def live(self) -> bool:
        """Whether a link is live (an interface, or a NETFLOW collector's socket)."""
        from capture.flowreader import collector_address

        return bool(self.interfaces) or any(collector_address(path) is not None
                                            for _, path in self.netflow)

    @property
    def link_names(self) -> list[str]:
        return [n for n, _ in self.links] + [n for n, _ in self.interfaces] + \
            [n for n, _, _ in self.records] + [n for n, _ in self.netflow]
