"""User-defined scalar functions: GS-lite declarations (external_fcns.def syntax) and their Python module.

A declarations file lists functions as GS-lite's `cfg/external_fcns.def` does (Tigon SQL user
manual, chapter 8):

    // comments start with // or --
    float FUN [LFTA_LEGAL, COST LOW] scaled(uint, float HANDLE);
    uint FUN is_web(uint);
    PRED [LFTA_LEGAL] is_http_port[uint];              -- parsed, refused when used

Every entry kind is parsed (FUN, PRED, UDAF, EXTR, STATE, SFUN), so GS-lite's own file can be
given as it is; FUN and UDAF entries run (UDAFs: docs/gsql.md "User-defined aggregates"), and a
query using another kind gets a located error.
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
from typing import Any

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
    #: the names after the first: a UDAF's storage type, an EXTR's UDAF and function
    names: tuple[str, ...] = ()

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
                       path, line, tuple(w.lower() for w in rest[1:names]))


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
        if isinstance(node, E.Aggregate) and node.udaf is not None:
            return ""           # a UDAF call (`udaf_calls`), resolved by the analyser
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
    module = _module_of(library, decl, name, node, error)
    _defined(module, decl, name, node, error, "function ")
    external = ExternalFunction(
        name=name, module=module,
        params=tuple(TYPES[p.type.lower()] for p in decl.params),
        handles=tuple(p.handle for p in decl.params), returns=returns,
        lfta_legal=bool({"LFTA_LEGAL", "LFTA_ONLY"} & decl.modifiers), declared_at=decl.where)
    return node.replace(name=name, args=args, external=external)


# --- user-defined aggregates (docs/gsql.md "User-defined aggregates") -------------------------

#: numpy dtype of a UDAF's argument per declared (oopscope) parameter type
ARG_DTYPES = {"uint": "uint64", "ullong": "uint64", "ipv4": "uint64", "bool": "uint64",
              "int": "int64", "llong": "int64", "float": "float64"}
STATE_DTYPES = ("int64", "uint64", "float64")
MAX_STATE_WORDS = 16


@dataclass(frozen=True)
class ExternalAggregate:
    """A resolved UDAF call's aggregate, carried by the `E.Aggregate` node (`udaf`) and the
    plan's sub-aggregate to every evaluator; plain data (the module is imported where it
    runs). `identity` is the state `init` gives (`init(state, *handles)`: the call's HANDLE
    constants), `lfta` whether Numba compiles `update` (then the low level runs it in its
    hash-table kernel); `running`: declared RUNNING, its state spans the windows of a running
    aggregation (`window_change(state)` between them)."""

    name: str
    module: str                     # absolute path of the Python module
    param: str                      # the oopscope type the argument is passed as
    returns: str
    dtype: str                      # the state words' dtype (STATE_DTYPES)
    size: int                       # how many words
    identity: tuple                 # the state of an empty group
    lfta: bool
    declared_at: str
    handles: tuple = ()             # the call's HANDLE constants, after the value
    running: bool = False
    #: an EXTR call: (extraction function, its further constants, the extractor's name); the
    #: result is `function(state, *constants)` instead of `output(state)`
    extract: tuple = ()

    def output_function(self):
        """The Python callable giving the result of a combined state."""
        if self.extract:
            fn, rest = implementation(self.module, self.extract[0]), self.extract[1]
            return lambda state: fn(state, *rest)
        return self.implementation().output

    @property
    def arg_dtype(self) -> str:
        return ARG_DTYPES[self.param]

    def implementation(self):
        """The module's object for this UDAF (state, init, update, combine, output)."""
        obj = implementation(self.module, self.name)
        assert obj is not None          # checked when the call was resolved
        return obj


def udaf_calls(statement: E.Node, library: FunctionLibrary | None) -> E.Node:
    """`statement` with every call of a declared UDAF (and of no FUN of that name) turned into
    an `E.Aggregate` marked `udaf=True`, so the analyser treats it as the aggregate it is;
    `resolve_aggregate` resolves it."""
    if library is None or not any(d.kind == "UDAF" for d in library.declarations):
        return statement

    def rewrite(node: E.Node) -> E.Node:
        if not isinstance(node, E.Func):
            return node
        extr = next((d for d in library.declared(node.name) if d.kind == "EXTR"), None)
        if extr is not None and len(extr.names) == 2 and not any(
                d.kind in ("FUN", "UDAF") for d in library.declared(node.name)):
            return _extraction(library, node, extr)
        decls = library.declared(node.name)
        if not decls or any(d.kind == "FUN" for d in decls) \
                or not any(d.kind == "UDAF" for d in decls):
            return node
        args = node.args["args"] or []
        if not args:
            # an Aggregate has an argument: the call keeps its form and fails in resolution
            return E.Aggregate(pos=node.pos, name=node.name.lower(), arg=E.Star(pos=node.pos),
                               udaf=("arity", 0))
        if len(args) > 1:
            # the value, then HANDLE constants (`moving_avg(len, 5)`), checked in resolution
            return E.Aggregate(pos=node.pos, name=node.name.lower(), arg=args[0],
                               udaf=("handles", tuple(args[1:])))
        return E.Aggregate(pos=node.pos, name=node.name.lower(), arg=args[0], udaf=True)

    return statement.transform(rewrite)


def _extraction(library: FunctionLibrary, node: E.Func, extr: Declaration) -> E.Node:
    """`extr(a, b, c)` of `EXTR extr udaf fcn (...)`: the UDAF's aggregate over the first
    arguments (as many as the UDAF declares), marked ("extract", EXTR declaration, the rest:
    the extraction function's further arguments); resolution checks the rest."""
    args = node.args["args"] or []
    udafs = [d for d in library.declared(extr.names[0]) if d.kind == "UDAF"]
    k = len(udafs[0].params) if udafs else 1
    if not args:
        return E.Aggregate(pos=node.pos, name=extr.names[0], arg=E.Star(pos=node.pos),
                           udaf=("arity", 0))
    return E.Aggregate(pos=node.pos, name=extr.names[0], arg=args[0],
                       udaf=("extract", tuple(args[1:k]), extr, tuple(args[k:])))


def resolve_aggregate(library: FunctionLibrary, node: E.Aggregate, arg: E.Expr, type_: str,
                      error: ErrorAt) -> E.Aggregate:
    """The resolved UDAF call (`udaf` set to its `ExternalAggregate`), errors located."""
    name = node.name.lower()
    udafs = [d for d in library.declared(name) if d.kind == "UDAF"]
    extras: tuple = node.udaf[1] if isinstance(node.udaf, tuple) and \
        node.udaf[0] in ("handles", "extract") else ()
    extract = node.udaf if isinstance(node.udaf, tuple) and node.udaf[0] == "extract" else None
    if not udafs:
        raise error(node, f"{name} is an extractor's UDAF but is not declared as a UDAF")
    if (isinstance(node.udaf, tuple) and node.udaf[0] == "arity") or isinstance(arg, E.Star):
        raise error(node, f"{name} is called without an argument: a user-defined aggregate "
                    f"takes a value, then its HANDLE constants (declared at {udafs[0].where})")
    fits = [d for d in udafs if len(d.params) == 1 + len(extras)
            and not d.params[0].handle and all(p.handle for p in d.params[1:])
            and _accepts(TYPES.get(d.params[0].type.lower(), ""), type_)]
    if not fits:
        shown = "; ".join(f"{d.signature()} at {d.where}" for d in udafs)
        raise error(node, f"{name} does not take ({type_}{', ...' * bool(extras)}): declared "
                    f"{shown} (a UDAF takes one value of type "
                    f"{', '.join(sorted(ARG_DTYPES))}, then HANDLE constants)")
    decl = fits[0]
    handles: list[int | float] = []
    for written in extras:
        if not isinstance(written, E.Literal) or not isinstance(written.value, (int, float)):
            raise error(written, f"argument {len(handles) + 2} of {name} is a HANDLE "
                        f"parameter (declared at {decl.where}): it must be a number literal")
        handles.append(written.value)
    param = TYPES[decl.params[0].type.lower()]
    returns = TYPES.get((decl.returns or "").lower())
    extraction: tuple = ()
    if extract is not None:
        # the extractor's result is its function's over the UDAF's state: the UDAF's own
        # declared result (GS-lite's string of its state) does not matter
        extr, rest = extract[2], extract[3]
        returns = TYPES.get((extr.returns or "").lower())
        values = []
        for written in rest:
            if not isinstance(written, E.Literal) or not isinstance(written.value, (int, float)):
                raise error(written, f"the arguments of extractor {extr.name} after its UDAF's "
                            f"must be number literals (declared at {extr.where})")
            values.append(written.value)
        if returns not in ("uint", "ullong", "int", "llong", "float", "bool"):
            raise error(node, f"extractor {extr.name} (declared at {extr.where}) must return a "
                        f"number")
        extraction = (extr.names[1], tuple(values), extr.name)
    if param not in ARG_DTYPES or returns not in ("uint", "ullong", "int", "llong", "float",
                                                  "bool"):
        raise error(node, f"{name} (declared at {decl.where}): a UDAF takes and returns a "
                    f"number (uint, int, ullong, llong, float, bool)")
    module = _module_of(library, decl, name, node, error)
    obj = _defined(module, decl, name, node, error)
    problem = _udaf_problem(obj)
    if problem:
        raise error(node, f"user-defined aggregate {name} in {module}: {problem} (e.g. "
                    f"class {name}: state = ('float64', 2); def init(state): ...; def "
                    f"update(state, value): ...; def combine(state, other): ...; def "
                    f"output(state): ...)")
    udaf: Any = obj                 # a class or object with the four parts, checked above
    running = "RUNNING" in decl.modifiers
    if running and not callable(getattr(obj, "window_change", None)):
        raise error(node, f"{name} is declared RUNNING (at {decl.where}): {module} "
                    f"must give it `window_change(state)`, called when its group is carried "
                    f"into the next window (GS-lite's _HFTA_AGGR_REINIT_)")
    dtype, size = udaf.state
    try:
        identity = _identity(obj, dtype, size, tuple(handles))
    except Exception as exc:   # the user's init refused the constants
        raise error(node, f"{name}'s init({', '.join(['state'] + [str(h) for h in handles])}) "
                    f"failed: {type(exc).__name__}: {exc}") from None
    lfta = update_compiles(module, decl.name, dtype, ARG_DTYPES[param])
    if extraction and implementation(module, extraction[0]) is None:
        raise error(node, f"extractor {extraction[2]}: {module} defines no function "
                    f"{extraction[0]} (it gets the UDAF's state, then "
                    f"{len(extraction[1])} more argument(s))")
    ext = ExternalAggregate(name, module, param, returns, dtype, int(size),
                            identity, lfta, decl.where, tuple(handles), running, extraction)
    return node.replace(name=name, arg=arg, udaf=ext)


def _module_of(library: FunctionLibrary, decl: Declaration, name: str, node,
               error: ErrorAt) -> str:
    """The --udf module that implements a declared name (a located error without one)."""
    if library.module is None:
        raise error(node, f"{name} is declared at {decl.where} but no Python module implements "
                    f"it (give one: --udf MODULE.py)")
    return library.module


def _defined(module: str, decl: Declaration, name: str, node, error: ErrorAt,
             what: str = ""):
    """The module's object for a declared name (a located error when it defines none)."""
    try:
        obj = implementation(module, decl.name)
    except ConfigError as exc:
        raise error(node, str(exc)) from None
    if obj is None:
        raise error(node, f"{name} is declared at {decl.where} but {module} defines no "
                    f"{what}{decl.name}")
    return obj


def _udaf_problem(obj) -> str:
    state = getattr(obj, "state", None)
    if not (isinstance(state, tuple) and len(state) == 2 and state[0] in STATE_DTYPES
            and isinstance(state[1], int) and 1 <= state[1] <= MAX_STATE_WORDS):
        return (f"`state` must be (dtype, words) with dtype one of {', '.join(STATE_DTYPES)} "
                f"and 1 to {MAX_STATE_WORDS} words, not {state!r}")
    missing = [f for f in ("init", "update", "combine", "output")
               if not callable(getattr(obj, f, None))]
    return f"it defines no {', '.join(missing)}" if missing else ""


def _identity(obj, dtype: str, size: int, handles: tuple = ()) -> tuple:
    """The state `init` gives (with the call's HANDLE constants after the state)."""
    import numpy as np

    state = np.zeros(size, dtype)
    obj.init(state, *handles)
    return tuple(state.tolist())


@lru_cache(maxsize=64)
def jitted(module: str, name: str, part: str):
    """Numba's dispatcher of a UDAF's `part` (update, combine, output), one per function."""
    import numba

    fn = getattr(implementation(module, name), part)
    return fn if isinstance(fn, numba.core.dispatcher.Dispatcher) else \
        numba.njit(nogil=True)(fn)


@lru_cache(maxsize=64)
def update_compiles(module: str, name: str, dtype: str, arg_dtype: str) -> bool:
    """Whether Numba compiles the UDAF's `update` for a state row and one argument value:
    then the low level runs it; otherwise the UDAF runs in the high level only (logged)."""
    import logging

    from numba import from_dtype, types

    try:
        jitted(module, name, "update").compile(
            (types.Array(from_dtype(np_dtype(dtype)), 1, "A"), from_dtype(np_dtype(arg_dtype))))
    except Exception as exc:     # any typing or lowering error: not compilable
        logging.getLogger(__name__).info(
            "user-defined aggregate %s: Numba cannot compile its update (%s: %s); it runs in "
            "the high level only", name, type(exc).__name__, str(exc).splitlines()[0][:200])
        return False
    return True


def np_dtype(name: str):
    import numpy as np

    return np.dtype(name)
