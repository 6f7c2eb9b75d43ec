"""The `oopscope` command: a click group whose subcommands live one per module in tools/.

Subcommand modules import only click at top level; Numba, Spark and numpy are imported inside
the command bodies so that `--help` answers at once.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

# command name -> (module, attribute); loaded on first use
COMMANDS: dict[str, tuple[str, str]] = {
    "decode": ("tools.commands.decode", "decode"),
    "gen": ("tools.commands.gen", "gen"),
    "example": ("tools.commands.example", "example"),
    "explain": ("tools.commands.explain", "explain"),
    "run": ("tools.commands.run", "run"),
    "bench": ("tools.commands.bench", "bench"),
    "export": ("tools.commands.export", "export"),
    "warmup": ("tools.commands.warmup", "warmup"),
    "cache": ("tools.commands.cache", "cache"),
    "serve": ("tools.commands.serve", "serve"),
    "submit": ("tools.commands.control", "submit"),
    "queries": ("tools.commands.control", "queries"),
    "tail": ("tools.commands.control", "tail"),
    "cancel": ("tools.commands.control", "cancel"),
    "status": ("tools.commands.control", "status"),
    "shutdown": ("tools.commands.control", "shutdown"),
    "agent": ("tools.commands.cluster", "agent"),
    "collect": ("tools.commands.cluster", "collect"),
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when the subcommand is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(super().list_commands(ctx)))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, cmd_name)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("oopscope")
    except Exception:  # not installed (running from a source tree)
        return "0+unknown"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True,
              help="More log output on stderr (-vv for debug, -vvv with every call to the JVM).")
@click.version_option(version=_version(), prog_name="oopscope")
def cli(verbose: int) -> None:
    """oopscope: GSQL queries over pcap files and live interfaces, the out-of-order way."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LevelFormatter())
    logging.basicConfig(level=level, handlers=[handler])
    # the Python-JVM bridge logs every call it makes ("Received command c on object id
    # p0"), thousands a second, which slows what -vv's timings measure: only with -vvv
    logging.getLogger("py4j").setLevel(logging.DEBUG if verbose >= 3 else logging.WARNING)


class LevelFormatter(logging.Formatter):
    """`oopscope: MESSAGE` for news (INFO), `oopscope: WARNING: MESSAGE` for what needs a
    look (and ERROR, DEBUG)."""

    def __init__(self):
        super().__init__("oopscope: %(levelname)s: %(message)s")
        self._news = logging.Formatter("oopscope: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return self._news.format(record) if record.levelno == logging.INFO \
            else super().format(record)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and exit status 1, never a traceback."""
    from common.errors import OopscopeError

    # Numba imports scipy.linalg, when SciPy is installed, to look for a BLAS the first time it
    # loads a kernel, a noticeable part of every run's start. No oopscope kernel uses a BLAS (np.dot,
    # np.linalg), so the command's own process goes without it.
    # (a None entry makes the import fail, as documented; typeshed's sys.modules has no None)
    sys.modules.setdefault("scipy.linalg", None)  # type: ignore[arg-type]
    # Arrow's default allocator (mimalloc) hands freed memory back to the system at once, and
    # every later buffer is page-faulted in afresh: reading and copying a large run's spool
    # files spends several times the system time it does with the system allocator. A user's
    # own choice of pool stands.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        cli.main(args=argv, prog_name="oopscope", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("oopscope: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OopscopeError as exc:
        click.echo(f"oopscope: error: {exc}", err=True)
        sys.exit(1)
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error of ours
        sys.stderr.close()
        sys.exit(0)


def entry() -> None:
    """The `oopscope` command's process: `main`, then a quick exit. Python's own teardown
    (freeing every module, array and thread state one by one) only delays the exit after a
    run's last output. What a normal exit does first is done here too: the threads that are not
    daemons are joined, the atexit handlers run (py4j's ends the JVM), logging and the
    standard streams are flushed. Tests call `main`, which returns or raises as usual."""
    import atexit
    import threading

    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:                                  # sys.exit("message"), as Python prints it
            print(exc.code, file=sys.stderr)
            code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):          # closed (a broken pipe)
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
