"""`oopscope cache info|clear`: the cache directory of the driver JVM's start-up
(`highlevel.jvmcache`): Spark's class-data archive, remembered JVM launches, the log profile and
specialized kernels."""

from __future__ import annotations

import click


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@click.group()
def cache() -> None:
    """The caches of the driver JVM's start-up in ~/.cache/oopscope ($XDG_CACHE_HOME/oopscope):
    Spark's class-data archive, remembered JVM launches, the log profile, specialized
    kernels. `oopscope warmup` fills them."""


@cache.command()
def info() -> None:
    """Where the cache directory is, whether it is used, and what it holds."""
    import os
    import time

    from highlevel import jvmcache

    path = jvmcache.cache_root()
    if not path.exists():
        click.echo(f"{path}: does not exist yet (`oopscope warmup` or the first run makes it)")
        return
    why = jvmcache.problem(path)
    click.echo(f"{path}: " + (f"mode {os.stat(path).st_mode & 0o777:04o}, in use"
                              if why is None else
                              f"NOT USED: it {why} (`chmod 700 {path}` or remove it)"))
    if not os.access(path, os.R_OK | os.X_OK):
        return
    found = jvmcache.entries(path)
    width = max((len(e.path.name) for e in found), default=0)
    for e in found:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime))
        click.echo(f"  {e.path.name:<{width}}  {_size(e.size):>9}  {when}  {e.kind}")
    click.echo(f"{len(found)} entries, {_size(sum(e.size for e in found))}")


@cache.command()
def clear() -> None:
    """Remove everything in the cache directory (the next run, or `oopscope warmup`, makes
    what it needs again)."""
    from highlevel import jvmcache
    from highlevel.errors import CacheError

    path = jvmcache.cache_root()
    if not path.exists():
        click.echo(f"{path}: nothing to remove (no such directory)")
        return
    if not jvmcache.owned(path):
        # one writable by others goes like ours; somebody else's, or not a directory, stays
        raise CacheError(f"cache directory {path} {jvmcache.problem(path)}: not removed")
    try:
        removed, kept = jvmcache.clear(path)
    except OSError as exc:
        raise CacheError(f"cache directory {path}: {exc.strerror} ({exc.filename})") from None
    for e in removed:
        click.echo(f"removed {e.path}  {_size(e.size)}  {e.kind}")
    for e in kept:
        click.echo(f"kept {e.path}: another oopscope process is writing the class-data "
                   f"archive")
    click.echo(f"{path}: {len(removed)} entries removed, "
               f"{_size(sum(e.size for e in removed))}" + ("" if kept else
                                                             "; the directory too"))
