"""User-defined scalar functions: GS-lite declarations (external_fcns.def syntax) and their Python module.

A declarations file lists functions as GS-lite's `cfg/external_fcns.def` does (Tigon SQL user
manual, chapter 8):

    // comments start with // or --
    float FUN [LFTA_LEGAL, COST LOW] scaled(uint, float HANDLE);
    uint FUN is_web(uint);
    PRED [LFTA_LEGAL] is_http_port[uint];              -- parsed, refused when used

Every entry kind is parsed (FUN, PRED, UDAF, EXTR, STATE, SFUN), so GS-lite's own file can be
given as it is; only FUN entries run, and a query using another kind gets a located error.
Names are case-insensitive and may be overloaded by parameter types. A built-in function of
the same name (`UMAX`, `INT`, ...) wins over a declaration: oopscope runs its own.

The Python module (`--udf udfs.py`) defines one callable per declared name (the name as
declared, or in any case). It is called once per batch with one numpy array per argument: uint64
for uint/ullong/IP (an IPv4 address), int64 for int/llong, float64, bool, an object array of
str for string, a (hi, lo) pair of uint64 arrays for IPV6; a HANDLE argument is passed as its
constant value (str, int or float), which must be a literal. It returns an array of one value
per row (or one value for all). `numba.vectorize` functions fit this as they are.

A function declared LFTA_LEGAL may run in the low level (WHERE, group keys, aggregate
arguments); any other runs in the high level only: in SELECT and HAVING, and in WHERE of a
join (`queries.types.high_level_only`). PARTIAL functions (GS-lite drops the row when they
return no value) are refused when used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType

from common.errors import ConfigError
from queries import expressions as E

#: GS-lite's type names -> oopscope types (IP is GS-lite's 32-bit IPv4 address)
TYPES = {"uint": "uint", "int": "int", "ullong": "ullong", "llong": "llong", "float": "float",
         "bool": "bool", "string": "string", "v_str": "string", "ip": "ipv4", "ipv6": "ip"}
KINDS = ("FUN", "PRED", "UDAF", "EXTR", "STATE", "SFUN")
KIND_NAMES = {"PRED": "a predicate", "UDAF": "a user-defined aggregate",
              "EXTR": "an aggregate extraction function", "SFUN": "a stateful function",
              "STATE": "a state"}
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z_0-9]*)|([\[\](),;])|(\S))")


class DeclarationError(ConfigError):
    """A declarations file that cannot be read or parsed (names the file and line)."""


@dataclass(frozen=True)
class Parameter:
    type: str                       # as declared (uint, IP, fstring12 ...)
    modifiers: frozenset[str] = frozenset()

    @property
    def handle(self) -> bool:
        return bool({"HANDLE", "CONST"} & self.modifiers)


@dataclass(frozen=True)
class Declaration:
    kind: str                       # FUN, PRED, UDAF, EXTR, STATE, SFUN
    name: str                       # lower case
    returns: str | None
    params: tuple[Parameter, ...]
    modifiers: frozenset[str]       # first word of each: LFTA_LEGAL, COST, PARTIAL ...
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def signature(self) -> str:
        params = ", ".join(" ".join([p.type, *sorted(p.modifiers)]) for p in self.params)
        return f"{self.returns} {self.name}({params})"


def parse_declarations(text: str, path: str = "<declarations>") -> list[Declaration]:
    """The entries of a declarations file (DeclarationError at the first bad one)."""
    tokens: list[tuple[str, int]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = re.split(r"//|--", line, maxsplit=1)[0]
        pos = 0
        while pos < len(line):
            m = _TOKEN.match(line, pos)
            if m is None:   # only blanks are left
                break
            pos = m.end()
            if m.group(3):
                raise DeclarationError(f"{path}:{number}: unexpected {m.group(3)!r}")
            tokens.append((m.group(1) or m.group(2), number))
    out = []
    entry: list[tuple[str, int]] = []
    for tok in tokens:
        if tok[0] == ";":
            if entry:
                out.append(_entry(entry, path))
            entry = []
        else:
            entry.append(tok)
    if entry:
        raise DeclarationError(f"{path}:{entry[0][1]}: declaration without its closing ';'")
    return out


def _entry(tokens: list[tuple[str, int]], path: str) -> Declaration:
    words = [t for t, _ in tokens]
    line = tokens[0][1]

    def fail(message: str) -> DeclarationError:
        return DeclarationError(f"{path}:{line}: {message} in `{' '.join(words)};` (e.g. "
                                f"`float FUN [LFTA_LEGAL] my_func(uint, float HANDLE);`)")

    upper = [w.upper() for w in words]
    kind_at = next((i for i in (0, 1) if i < len(upper) and upper[i] in KINDS), None)
    if kind_at is None:
        raise fail("expected a return type then FUN (or PRED, UDAF, EXTR, STATE, SFUN)")
    kind = upper[kind_at]
    returns = words[0] if kind_at == 1 else None
    rest = words[kind_at + 1:]
    modifiers: set[str] = set()
    if rest and rest[0] == "[":
        if "]" not in rest:
            raise fail("modifiers without their closing ']'")
        close = rest.index("]")
        group: list[str] = []
        for w in rest[1:close] + [","]:
            if w == ",":
                if group:
                    modifiers.add(group[0].upper())
                group = []
            else:
                group.append(w)
        rest = rest[close + 1:]
    if kind == "STATE":
        if len(rest) != 1:
            raise fail("expected the state's name")
        return Declaration(kind, rest[0].lower(), returns, (), frozenset(modifiers), path, line)
    # the names before the parameters: FUN and PRED one, UDAF its storage type too (the
    # manual's moving_avg omits it), EXTR three, SFUN its state
    names = next((i for i, w in enumerate(rest) if w in ("(", "[")), len(rest))
    if names == 0 or any(not _ident(w) for w in rest[:names]):
        raise fail("expected the name and a parameter list")
    if names == len(rest):
        raise fail("expected the parameter list in parentheses")
    closing = {"(": ")", "[": "]"}[rest[names]]
    end = rest.index(closing, names) if closing in rest[names:] else None
    if end is None:
        raise fail(f"the parameter list has no closing {closing!r}")
    if end != len(rest) - 1:
        raise fail(f"expected ';' after the parameter list of {rest[0]}")
    params: list[Parameter] = []
    group = []
    for w in rest[names + 1:-1] + [","]:
        if w == ",":
            if not group and params:
                raise fail("an empty parameter")
            if group:
                params.append(Parameter(group[0], frozenset(x.upper() for x in group[1:])))
            group = []
        elif not _ident(w):
            raise fail(f"unexpected {w!r} among the parameters")
        else:
            group.append(w)
    return Declaration(kind, rest[0].lower(), returns, tuple(params), frozenset(modifiers),
                       path, line)


def _ident(w: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", w) is not None


def load_declarations(path: str) -> list[Declaration]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise DeclarationError(f"cannot read the declarations file {path}: {exc}") from None
    return parse_declarations(text, path)


# --- the Python module ----------------------------------------------------------------------

def load_module(path: str) -> ModuleType:
    """The module of user functions at `path`, imported once per version of the file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the functions module {path}: {exc}") from None
    return _import(os.path.abspath(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _import(path: str, mtime_ns: int, size: int) -> ModuleType:  # noqa: ARG001 (cache key)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"oopscope_udf_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"the functions module {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # numba and pickle look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ConfigError(f"the functions module {path} failed to import: "
                          f"{type(exc).__name__}: {exc}") from exc
    return module


def implementation(module_path: str, name: str) -> Callable | None:
    """The callable a module defines for a declared name (exact name first, then any case)."""
    module = load_module(module_path)
    fn = getattr(module, name, None)
    if fn is None:
        lowered = [v for k, v in vars(module).items() if k.lower() == name.lower()]
        fn = lowered[0] if len(lowered) == 1 else None
    return fn if callable(fn) else None


# --- the library a run uses -----------------------------------------------------------------

@dataclass(frozen=True)
class ExternalFunction:
    """A resolved call's function, carried by the `E.Func` node (`external`) to every
    evaluator; plain data, so plans pickle to Spark's workers, which import the module."""

    name: str
    module: str                     # absolute path of the Python module
    params: tuple[str, ...]         # the oopscope type each argument is passed as
    handles: tuple[bool, ...]
    returns: str
    lfta_legal: bool
    declared_at: str


@dataclass(frozen=True)
class FunctionLibrary:
    """The declarations of a run and the module implementing them."""

    declarations: tuple[Declaration, ...] = ()
    module: str | None = None
    files: tuple[str, ...] = field(default=())

    @classmethod
    def load(cls, declaration_files=(), module: str | None = None) -> FunctionLibrary:
        decls: list[Declaration] = []
        for path in declaration_files:
            decls += load_declarations(str(path))
        if module is not None:
            load_module(str(module))        # a broken module fails now, not mid-run
            module = os.path.abspath(str(module))
        return cls(tuple(decls), module, tuple(str(p) for p in declaration_files))

    def declared(self, name: str) -> list[Declaration]:
        return [d for d in self.declarations if d.name == name.lower()]

    def verdict(self, node: E.Node) -> str | None:
        """For `queries.gslite.check_constructs`: None when `node` is not a declared name, ""
        when it is a declared function the analyser resolves, else why it cannot run."""
        if isinstance(node, E.PredicateCall):
            decls = self.declared(node.name)
            if any(d.kind == "PRED" for d in decls):
                d = next(d for d in decls if d.kind == "PRED")
                return (f"predicate {node.name}[...] (declared at {d.where}) is not supported: "
                        f"declare it as a function returning uint (uint FUN {d.name}(...);) "
                        f"and write {d.name}(...) = 1")
            return None
        if not isinstance(node, (E.Func, E.Aggregate)):
            return None
        decls = self.declared(node.name)
        if not decls:
            return None
        if isinstance(node, E.Func) and any(d.kind == "FUN" for d in decls):
            return ""
        d = decls[0]
        return (f"{node.name} is declared as {KIND_NAMES.get(d.kind, d.kind)} ({d.kind}, at "
                f"{d.where}): oopscope runs user-defined scalar functions (FUN) only")


def _accepts(declared: str, given: str) -> bool:
    if declared == given:
        return True
    if declared in ("uint", "ullong", "int", "llong"):
        return given in ("uint", "ullong", "int", "llong", "bool")
    if declared == "float":
        return given in ("uint", "ullong", "int", "llong", "bool", "float")
    if declared == "bool":
        return given in ("uint", "ullong", "int", "llong")
    if declared == "ip":
        return given == "ipv4"
    return False


ErrorAt = Callable[[E.Node, str], Exception]


def resolve_call(library: FunctionLibrary, node: E.Func, args: list[E.Expr],
                 types: list[str], error: ErrorAt) -> E.Func:
    """The resolved call of a declared function, its `external` set (errors located at the
    call or the argument)."""
    name = node.name.lower()
    funs = [d for d in library.declared(name) if d.kind == "FUN"]
    fits = [d for d in funs if len(d.params) == len(args)]
    if not fits:
        shown = "; ".join(f"{d.signature()} at {d.where}" for d in funs)
        raise error(node, f"{name} takes {' or '.join(str(len(d.params)) for d in funs)} "
                    f"argument(s), not {len(args)}: {shown}")
    best: tuple[int, Declaration] | None = None
    for d in fits:
        mapped = [TYPES.get(p.type.lower(), "") for p in d.params]
        if "" in mapped or not all(_accepts(m, t) for m, t in zip(mapped, types)):
            continue
        exact = sum(m == t for m, t in zip(mapped, types))
        if best is None or exact > best[0]:
            best = (exact, d)
    if best is None:
        shown = "; ".join(f"{d.signature()} at {d.where}" for d in fits)
        unknown = [p.type for d in fits for p in d.params if p.type.lower() not in TYPES]
        why = f" (type {unknown[0]} has no oopscope counterpart)" if unknown else ""
        raise error(node, f"{name} does not take ({', '.join(types)}): declared {shown}{why}")
    decl = best[1]
    returns = TYPES.get((decl.returns or "").lower())
    if returns is None:
        raise error(node, f"{name} returns {decl.returns} (declared at {decl.where}), a type "
                    f"with no oopscope counterpart (types: {', '.join(sorted(TYPES))})")
    if "PARTIAL" in decl.modifiers:
        raise error(node, f"{name} is PARTIAL (declared at {decl.where}): a function that may "
                    f"return no value is not supported")
    for arg, written, p in zip(args, node.args["args"], decl.params):
        if p.handle and not isinstance(arg, E.Literal):
            raise error(written, f"argument {decl.params.index(p) + 1} of {name} is a HANDLE "
                        f"parameter (declared at {decl.where}): it must be a literal")
    if library.module is None:
        raise error(node, f"{name} is declared at {decl.where} but no Python module implements "
                    f"it (give one: --udf MODULE.py)")
    try:
        fn = implementation(library.module, decl.name)
    except ConfigError as exc:
        raise error(node, str(exc)) from None
    if fn is None:
        raise error(node, f"{name} is declared at {decl.where} but {library.module} defines no "
                    f"function {decl.name}")
    external = ExternalFunction(
        name=name, module=library.module,
        params=tuple(TYPES[p.type.lower()] for p in decl.params),
        handles=tuple(p.handle for p in decl.params), returns=returns,
        lfta_legal=bool({"LFTA_LEGAL", "LFTA_ONLY"} & decl.modifiers), declared_at=decl.where)
    return node.replace(name=name, args=args, external=external)
