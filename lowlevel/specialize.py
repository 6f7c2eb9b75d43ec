"""Per-query kernels: an append kernel with the query's sub-aggregate updates written out.

The generic kernels fold a packet into its slot with `aggregates.update_slot`, a loop over the
`ops` rows that dispatches each on its op code. For a given `ops` table, `specialized(kernel,
ops)` returns the same kernel with that loop replaced by one call per row, with constant
arguments, of `update_op` cut down to that row's op (`op_update_source`), so the compiler
sees only the code of each row's op and computes the state addresses once: no dispatch per
sub-aggregate and packet, which matters most for a query with many sub-aggregates (the flow
table of netflow.gsql has 9).

The specialized kernel is generated as the source of a module (the kernel's own source with
the one `update_slot` line replaced, importing the names it uses from the kernel's module),
written once to `lowlevel/__pycache__/kernels/` (or `~/.cache/oopscope/kernels` when the
package is not writable) and imported from there (either only while it is ours and nobody else
can write to it: `common.cachedir`), so Numba caches its machine code on disk
as it does the package's kernels. The module name carries a digest of the lowlevel sources
and of the generated text: a changed kernel, helper or ops table makes a new module, never a
stale one, and modules of older sources are removed. If no directory can be written, the
generic kernel is used (same results). OOPSCOPE_SPECIALIZE=0 turns this off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import os
import re
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from common import cachedir, settings
from common.jit import sources_digest
from lowlevel.aggregates import OP_UDAF, update_op

log = logging.getLogger(__name__)

#: the line of a kernel that `specialized` replaces (exactly one per kernel)
_UPDATE = re.compile(r"^(?P<indent>[ ]+)update_slot\(ri, ru, rf, th, (?P<slot>\w+), i, ops, ts, "
                     r"ai, au, af, ad\)$", re.M)
_KERNELS: dict[tuple[str, bytes], object] = {}
_SOURCES: str | None = None
_REFUSED: set[Path] = set()


def _kernel_dirs() -> Iterator[Path]:
    """Where generated kernels may be written and imported from, in order. Importing runs
    them, so a directory counts only while nobody but its owner can write to it, and the
    owner is this user (or root, for an installed package): the rule of the cache directory,
    `common.cachedir`. The private cache's `kernels/` is made only when the package's own
    directory did not serve."""
    here = Path(__file__).resolve().parent / "__pycache__" / "kernels"
    try:
        st = os.stat(here)
    except OSError:
        yield here                    # not made yet: `_write` makes it private
    else:
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid not in (os.getuid(), 0):
            if not _REFUSED:
                _REFUSED.add(here)
                log.warning("kernel directory %s is writable by others or not ours (mode "
                            "%04o, uid %d): not used", here, stat.S_IMODE(st.st_mode), st.st_uid)
        else:
            yield here
    cache = cachedir.private_subdir("kernels")
    if cache is not None:
        yield cache


def module_text(kernel, ops: np.ndarray, name: str, udafs=()) -> str:
    """Source of a module defining `name`: `kernel` with its update loop written out for
    `ops` (rows: op, argument column, state column, aux). `udafs`: the user-defined
    aggregates (`aggregates.AggSpec`) an OP_UDAF row's aux numbers: a call of the jitted
    `update` of each over its state words (a slice of the record row) and its argument."""
    func = kernel.py_func
    source = textwrap.dedent(inspect.getsource(func))
    found = list(_UPDATE.finditer(source))
    if len(found) != 1:
        raise ValueError(f"kernel {func.__name__} has {len(found)} update_slot lines, not one")
    m = found[0]
    calls = ""
    for op, src, dst, aux in ops:
        if op == OP_UDAF:
            spec = udafs[int(aux)]
            bank, arg = spec.bank, spec.arg_bank
            calls += (f"{m['indent']}_udaf{int(aux)}(r{bank}[{m['slot']}, {int(dst)}:"
                      f"{int(dst) + spec.udaf.size}], a{arg}[i, {int(src)}])\n")
            continue
        calls += (f"{m['indent']}op{int(op)}_update_op(ri, ru, rf, th, {m['slot']}, i, "
                  f"{int(op)}, {int(src)}, {int(dst)}, {int(aux)}, ts, ai, au, af, ad)\n")
    if not calls:
        calls = f"{m['indent']}pass\n"
    body = source[:m.start()] + calls + source[m.end() + 1:]
    body = re.sub(rf"^def {func.__name__}\(", f"def {name}(", body, count=1, flags=re.M)
    names = sorted(n for n in func.__code__.co_names
                   if n in func.__globals__ and n not in ("update_slot", "ngjit"))
    imports = "".join(f"from {func.__module__} import {n}\n" for n in names)
    if udafs:
        # the module's digest is in the text: a changed UDAF makes a new kernel module
        imports += "from queries.udf import jitted as _jitted\n"
        for k, spec in enumerate(udafs):
            u = spec.udaf
            digest = hashlib.sha1(Path(u.module).read_bytes()).hexdigest()
            imports += (f"_udaf{k} = _jitted({u.module!r}, {u.name!r}, 'update')  "
                        f"# {digest}\n")
    codes = sorted({int(op) for op, _, _, _ in ops if op != OP_UDAF})
    imports += "".join(f"from lowlevel.aggregates import {n}\n" for n in _op_names())
    helpers = "".join(f"@ngjit_inline\n{op_update_source(code)}\n\n\n" for code in codes)
    return (f'"""Generated by lowlevel.specialize from {func.__module__}.{func.__name__} for '
            f'ops {ops.tolist()}."""\n# flake8: noqa\n{imports}'
            f"from common.jit import ngjit, ngjit_inline\n\n\n{helpers}{body}")


def _op_names() -> list[str]:
    """The module-level names `aggregates.update_op` uses (its op codes and helpers)."""
    func = update_op.py_func
    return sorted(n for n in func.__code__.co_names if n in func.__globals__)


def op_update_source(code: int) -> str:
    """Source of `op<code>_update_op`: `aggregates.update_op` with every `if` on the op code
    alone decided for `code`, so only that op's statements are left. Numba inlines an
    `inline="always"` function as it is, before it knows any argument is constant: 25
    calls of the whole `update_op` (every op's branch in each) took ~50 s to compile, the
    pruned helpers a fraction of it (docs/performance.md)."""
    import ast

    func = update_op.py_func
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.decorator_list = []
    fn.name = f"op{code}_update_op"
    if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
        fn.body = fn.body[1:]                                  # the docstring
    known = {"op", *(n for n in _op_names() if isinstance(func.__globals__[n], int))}
    env = {**func.__globals__, "op": code}

    def prune(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for st in stmts:
            if isinstance(st, ast.If):
                names = {n.id for n in ast.walk(st.test) if isinstance(n, ast.Name)}
                if names <= known:
                    taken = eval(compile(ast.Expression(st.test), "<op>", "eval"), env)  # noqa: S307
                    out += prune(st.body if taken else st.orelse)
                    continue
                st.body, st.orelse = prune(st.body) or [ast.Pass()], prune(st.orelse)
            out.append(st)
        return out

    fn.body = prune(fn.body) or [ast.Pass()]
    return ast.unparse(fn)


def _write(directory: Path, stem: str, text: str, prefix: str) -> Path:
    assert _SOURCES is not None   # `specialized` sets it before writing
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o755)
            os.chmod(directory, 0o755)     # whatever the umask: writable by its owner only
        except FileExistsError:
            pass
        why = cachedir.problem(directory)
        if why is not None:    # someone else's, made in between: not ours to import from
            raise PermissionError(f"{directory} {why}")
    path = directory / f"{stem}.py"
    if not path.is_file() or path.read_text() != text:
        cachedir.write_private(path, text)
    for old in directory.glob(f"{prefix}*.py"):       # modules of older sources
        if not old.name.startswith(f"{prefix}{_SOURCES[:10]}"):
            old.unlink(missing_ok=True)
            for cached in (directory / "__pycache__").glob(f"{old.stem}.*"):
                cached.unlink(missing_ok=True)
    return path


def load_generated(prefix: str, text: str, digest: str = ""):
    """The module of generated kernel source `text`, written to the first kernel directory
    that can be written (there Numba's disk cache works) as `<prefix><sources><digest>_<sha>`
    and imported; None when no directory can be written. `digest`: of further sources the
    text depends on (a module it calls), so a change of them makes a new module."""
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = sources_digest(Path(__file__).resolve().parent)
    stem = f"{prefix}{_SOURCES[:10]}{digest}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    name = f"oopscope_kernels.{stem}"
    if name in sys.modules:
        return sys.modules[name]
    for directory in _kernel_dirs():
        try:
            path = _write(directory, stem, text, prefix)
        except OSError as exc:
            log.debug("no generated kernel in %s: %s", directory, exc)
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None   # a .py file always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return None


def load_in_memory(prefix: str, text: str) -> dict:
    """The namespace of generated kernel source `text`, compiled without Numba's disk cache
    (where `load_generated` finds no directory to write)."""
    stem = f"{prefix}{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    namespace: dict = {"__name__": f"oopscope_kernels.{stem}"}
    exec(compile(text.replace("from common.jit import ngjit\n",
                              "import numba\nngjit = numba.njit(nogil=True)\n"),
                 f"<{stem}>", "exec"), namespace)
    return namespace


def specialized(kernel, ops: np.ndarray, udafs=()):
    """`kernel` (a jitted append kernel with one `update_slot(...)` line) specialized for
    `ops`; the generic kernel when that cannot be done (logged). With user-defined aggregates
    (`udafs`, which the generic kernel cannot run) it is always specialized: compiled from
    memory, without Numba's disk cache, when no kernel directory can be written."""
    udafs = tuple(udafs)
    if not settings.specialize() and not udafs:
        return kernel
    ops = np.ascontiguousarray(ops, dtype=np.int64)
    key = (kernel.py_func.__qualname__, ops.tobytes())
    if udafs:
        key += tuple((s.udaf.module, s.udaf.name, os.stat(s.udaf.module).st_mtime_ns)
                     for s in udafs)
    if key in _KERNELS:
        return _KERNELS[key]
    prefix = f"{kernel.py_func.__name__}_"
    name = "kernel"
    text = module_text(kernel, ops, name, udafs)
    module = load_generated(prefix, text)
    result = kernel
    if module is not None:
        result = getattr(module, name)
    elif udafs:
        log.info("the %s kernel of user-defined aggregates is compiled without a disk "
                 "cache (no writable kernel directory)", kernel.py_func.__name__)
        result = load_in_memory(prefix, text)[name]
    else:
        log.info("the generic %s kernel is used (no writable kernel directory)",
                 kernel.py_func.__name__)
    _KERNELS[key] = result
    return result
