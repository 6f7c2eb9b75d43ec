"""`oopscope serve` as a process: the appliance, its HTTP server, signals and shutdown.

The control API listens on loopback (`127.0.0.1:7405`) or a Unix socket (`unix:PATH`, made
mode 0600) unless told otherwise; any other address needs a token (`--token-file`). The
socket is bound before anything starts, so a port in use is an error at once.

The HTTP server runs on a thread of its own; the main thread waits for SIGTERM, SIGINT or an
`oopscope shutdown` and then closes every window of every query before the process ends.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from tools.errors import RunConfigError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Listen:
    host: str | None = None
    port: int | None = None
    path: str | None = None           # a Unix socket

    @property
    def url(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def loopback(self) -> bool:
        if self.path is not None:
            return True
        try:
            return ipaddress.ip_address(self.host or "").is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_listen(text: str, state_dir: Path) -> Listen:
    """`HOST:PORT`, `[V6]:PORT`, `:PORT` (loopback), `unix:PATH` or `unix` (in the state
    directory)."""
    if text == "unix":
        return Listen(path=str(state_dir / "oopscope.sock"))
    if text.startswith("unix:"):
        return Listen(path=str(Path(text[5:]).resolve()))
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise RunConfigError(f"--listen {text}: give HOST:PORT, :PORT or unix:PATH")
    host = host.strip("[]") or "127.0.0.1"
    return Listen(host=host, port=int(port))


def read_token(path: str | None, private: bool = False) -> str | None:
    """The token in `path`; with `private` (the server's) a file others may read is refused,
    else (a client's) it is only warned about."""
    if path is None:
        return None
    try:
        mode = Path(path).stat().st_mode
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise RunConfigError(f"--token-file {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        # another user who read it would hold the server's every right
        if private:
            raise RunConfigError(f"--token-file {path}: readable by others than its owner "
                                 f"(mode {stat.S_IMODE(mode):04o}): chmod 600 it")
        log.warning("--token-file %s: readable by others than its owner (mode %04o): "
                    "chmod 600 it", path, stat.S_IMODE(mode))
    if len(token) < 16:
        raise RunConfigError(f"--token-file {path}: the token is shorter than 16 characters")
    return token


def bind(listen: Listen) -> socket.socket:
    if listen.path is not None:
        path = Path(listen.path)
        _remove_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        except OSError as exc:
            raise RunConfigError(f"--listen unix:{path}: {exc.strerror or exc}") from None
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
    else:
        family = socket.AF_INET6 if listen.host and ":" in listen.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((listen.host, listen.port))
        except OSError as exc:
            raise RunConfigError(f"--listen {listen.host}:{listen.port}: "
                                 f"{exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def _remove_stale_socket(path: Path) -> None:
    """A socket file left by a server that is gone is removed; RunConfigError (one line)
    when a server answers on it, or it is not a socket, or it cannot be removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RunConfigError(f"--listen unix:{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise RunConfigError(f"--listen unix:{path}: exists and is not a socket (remove it "
                             f"or choose another path)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        pass                         # nothing listens: a killed server's socket
    except OSError as exc:           # a full backlog times out: someone listens
        raise RunConfigError(f"--listen unix:{path}: cannot tell whether a server listens "
                             f"on it ({exc.strerror or 'no answer'}); remove it if none "
                             f"does") from None
    else:
        raise RunConfigError(f"--listen unix:{path}: another server listens on it")
    finally:
        probe.close()
    try:
        path.unlink()
    except OSError as exc:
        raise RunConfigError(f"--listen unix:{path}: cannot remove the stale socket of a "
                             f"server that is gone: {exc.strerror}") from None


def serve(config, listen: Listen, token: str | None, ready_file: str | None = None,
          limits=None) -> int:
    """Run the appliance until a stop; 0 when every window was written. `limits`: the HTTP
    face's (`tools.serve.guard.HttpLimits`)."""
    import uvicorn

    from tools.serve.api import make_app
    from tools.serve.appliance import Appliance
    from tools.serve.connections import uvicorn_options
    from tools.serve.guard import Hosts, HttpLimits
    from tools.serve.metrics import Metrics

    limits = limits or HttpLimits()
    # the appliance's own news (serving, Spark up, queries submitted and resumed, stopping)
    # is shown by default; other libraries' stay at the level -v sets
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        logging.getLogger("tools.serve").setLevel(logging.INFO)

    if not listen.loopback and token is None:
        raise RunConfigError(f"--listen {listen.host}:{listen.port} is not a loopback "
                             f"address: give --token-file (clients then send the token)")
    # what it writes is its user's alone unless the operator says otherwise (`--umask`)
    os.umask(config.umask)
    appliance = Appliance(config)
    appliance.claim()                # the state directory locked before the socket is taken
    sock = bind(listen)
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum, frame):
        signals.append(signum)
        if len(signals) > 1 and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        appliance.start()
    except BaseException:
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
        raise
    try:
        metrics = Metrics(appliance)
        appliance.watch_with(metrics)
        port = None if listen.path is not None else sock.getsockname()[1]
        hosts = Hosts(listen.host, port, listen.path is not None, limits.allow_hosts)
        app = make_app(appliance, metrics, stop.set, token, hosts, limits)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                               access_log=False, timeout_graceful_shutdown=2,
                                               **uvicorn_options(limits)))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                  name="oopscope-http", daemon=True)
        thread.start()
        log.info("serving on %s (state %s; links %s)", listen.url, appliance.state_dir,
                    ", ".join(appliance.link_sources()))
        if ready_file:
            Path(ready_file).write_text(listen.url)
        while not stop.wait(0.5):
            if not thread.is_alive():
                log.error("the HTTP server stopped; shutting down")
                break
        appliance.shutdown()
        server.should_exit = True
        thread.join(timeout=5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if not stop.is_set():
            appliance.shutdown()
        sock.close()
        if listen.path is not None:
            Path(listen.path).unlink(missing_ok=True)
    # the server's report, as `oopscope run` prints its summary: always shown, on stderr
    print(summary(appliance), file=sys.stderr, flush=True)
    return 0


def summary(appliance) -> str:
    """Links, queries and gaps at the end of the server's life."""
    from tools.pipeline.windows import when

    st = appliance.status()
    lines = []
    for link in st["links"]:
        lines.append(f"link {link['name']}: {link['packets']} packets, {link['bytes']} bytes, "
                     f"{link['malformed']} malformed, {link['ring_drops']} ring drops, "
                     f"{link['kernel_drops']} kernel drops [{link['source']}]")
    for q in appliance.queries():
        lines.append(f"query {q['name']}: {q['state']}, {q['rows_out']} rows, "
                     f"{q['partial_rows']} partial rows"
                     + (f" ({q['partials_per_row']:.2f} per row)"
                        if q.get("partials_per_row") is not None else "")
                     + f", {q.get('slots', 0)} table slots, {q['evictions']} evictions, "
                     f"{q['late_packets']} late packets"
                     + (f"; gap {when(q['gaps'][-1]['from_ns'])} to {when(q['gaps'][-1]['to_ns'])}"
                        if q.get("gaps") and q["gaps"][-1]["from_ns"] is not None else ""))
    for gap in st["gaps"]:
        lines.append(f"down from {when(gap['from_ns'])} to {when(gap['to_ns'])} "
                     f"({gap['reason']})")
    return "\n".join(lines)
