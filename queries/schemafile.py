"""Schema files: GS-lite's `packet_schema.txt` format read into a `capture.schema.Schema`.

A schema file declares protocols of records (csv or gdat, read by GS-lite's built-in access
functions `get_csv_<type>_pos<N>` / `get_gdat_<type>_pos<N>`) that queries read like packet
protocols: `FROM [csv].CSV_EXAMPLE`. The format (Tigon SQL manual, chapter 5):

    PROTOCOL name [(parent, ...)] [[unpack, ...]] {
        type field accessor [(attribute [value], ...)] [[unpack, ...]];
        ...
    }
    UNPACK_FCNS { name function cost; ... }

with `--` and `//` comments to the end of the line (GS-lite reads schema files with its
query lexer, which knows no other comment). `load_schema(paths)` reads files,
`schema_for(query_paths, schema_paths)` adds the `packet_schema.txt` beside each query file as
GS-lite does. Every mistake is a `SchemaError` at file:line:col.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capture.schema import (
    BUILTIN,
    PROTOCOLS,
    SYSTEM_ACCESSORS,
    Field,
    Protocol,
    Schema,
    record_accessor,
    record_column,
)
from queries.errors import SchemaError

log = logging.getLogger(__name__)

#: the schema file GS-lite reads beside a query set
PACKET_SCHEMA = "packet_schema.txt"

#: GS-lite's type names (manual table 4, spelled as its type parser accepts them) -> ours.
#: GS-lite's IP is a 32-bit IPv4 address (our ipv4), its IPV6 a 128-bit one (our ip); a
#: ushort is read as a uint (no 16-bit type here: the values are the same).
TYPES: dict[str, str] = {
    **dict.fromkeys(("bool", "Bool", "BOOL"), "bool"),
    **dict.fromkeys(("ushort", "Ushort", "USHORT"), "uint"),
    **dict.fromkeys(("uint", "Uint", "UINT"), "uint"),
    **dict.fromkeys(("int", "Int", "INT"), "int"),
    **dict.fromkeys(("ullong", "Ullong", "ULLONG"), "ullong"),
    **dict.fromkeys(("llong", "Llong", "LLONG"), "llong"),
    **dict.fromkeys(("float", "Float", "FLOAT"), "float"),
    **dict.fromkeys(("string", "String", "STRING", "v_str", "V_str", "V_STR"), "string"),
    "IP": "ipv4",
    **dict.fromkeys(("IPV6", "IPv6"), "ip"),
}
#: GS-lite's fixed-length strings (fstringN): strings here (a value is at most N bytes there)
_FSTRING_TYPE = re.compile(r"(fstring|Fstring|FSTRING)[0-9]+")
#: GS-lite types with no oopscope counterpart yet: a protocol declaring one is unreadable
_UNSUPPORTED_TYPE = re.compile(r"(timeval|Timeval|TIMEVAL)")

#: field attributes (manual table 5): name -> whether it takes a value
PROPERTIES: dict[str, bool] = {"increasing": False, "decreasing": False, "required": False,
                               "low_cardinality": False, "snap_len": True, "subtype": True}

_INTEGER_TYPES = ("uint", "int", "ullong", "llong")


# --- tokens -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Token:
    kind: str           # name | int | string | op | end
    value: str
    line: int
    col: int


_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f]+)
  | (?P<newline>\n)
  | (?P<comment>(--|//)[^\n]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<int>[0-9]+)
  | (?P<string>'[^'\n]*')
  | (?P<op>[{}()\[\],;])
""", re.VERBOSE)


@dataclass
class _File:
    """One schema file being read: its path, text and tokens."""

    path: str
    text: str
    tokens: list[_Token] = field(default_factory=list)

    def error(self, message: str, line: int | None = None, col: int | None = None,
              length: int = 1) -> SchemaError:
        return SchemaError(message, path=self.path, line=line, column=col, source=self.text,
                           length=length)

    def error_at(self, tok: _Token, message: str) -> SchemaError:
        return self.error(message, tok.line, tok.col, max(1, len(tok.value)))

    def place(self, tok: _Token) -> str:
        return f"{self.path}:{tok.line}:{tok.col}"


def _tokenize(f: _File) -> None:
    pos, line, line_start = 0, 1, 0
    text = f.text
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            if text[pos] == "'":
                raise f.error("unterminated string (a string ends with ' on the same line)",
                              line, col)
            raise f.error(f"unexpected character {text[pos]!r} in a schema file (comments "
                          f"start with -- or //)", line, col)
        kind = m.lastgroup
        assert kind is not None   # every alternative is a named group
        if kind == "newline":
            line, line_start = line + 1, m.end()
        elif kind in ("name", "int", "string", "op"):
            f.tokens.append(_Token(kind, m.group(), line, col))
        pos = m.end()
    f.tokens.append(_Token("end", "", line, pos - line_start + 1))


# --- declarations ----------------------------------------------------------------------------

@dataclass
class _FieldDecl:
    type: _Token
    name: _Token
    accessor: _Token | None
    properties: list[tuple[_Token, _Token | None]]
    file: _File


@dataclass
class _ProtocolDecl:
    name: _Token
    parents: list[_Token]
    fields: list[_FieldDecl]
    file: _File


class _Parser:
    """One `_parse_<rule>` per rule of GS-lite's schema grammar (its fta.y `table_def`)."""

    def __init__(self, f: _File):
        self.f = f
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.f.tokens[self.i]

    def advance(self) -> _Token:
        t = self.tok
        self.i += 1
        return t

    def at(self, value: str) -> bool:
        return self.tok.kind == "op" and self.tok.value == value

    def expect(self, value: str, why: str) -> _Token:
        if not self.at(value):
            raise self.unexpected(f"{value!r} {why}")
        return self.advance()

    def expect_name(self, what: str) -> _Token:
        if self.tok.kind != "name":
            raise self.unexpected(what)
        return self.advance()

    def unexpected(self, expected: str) -> SchemaError:
        t = self.tok
        found = "the end of the file" if t.kind == "end" else repr(t.value)
        return self.f.error_at(t, f"expected {expected}, found {found}")

    def parse(self) -> list[_ProtocolDecl]:
        out = []
        while self.tok.kind != "end":
            t = self.tok
            if t.kind == "name" and t.value == "PROTOCOL":
                out.append(self._parse_protocol())
            elif t.kind == "name" and t.value == "UNPACK_FCNS":
                self._parse_unpack_fcns()
            elif t.kind == "name" and t.value in ("STREAM", "OPERATOR_VIEW"):
                raise self.f.error_at(t, f"{t.value} declarations are not supported: a schema "
                                      f"file for oopscope declares PROTOCOL and UNPACK_FCNS")
            elif t.kind == "name" and t.value.upper() in ("PROTOCOL", "UNPACK_FCNS"):
                raise self.f.error_at(t, f"write {t.value.upper()} in capitals (GS-lite's "
                                      f"schema keywords are upper case)")
            else:
                raise self.unexpected("PROTOCOL or UNPACK_FCNS")
        return out

    def _parse_names(self, close: str, what: str) -> list[_Token]:
        names = [self.expect_name(what)]
        while self.at(","):
            self.advance()
            names.append(self.expect_name(what))
        self.expect(close, f"to close the list of {what}s")
        return names

    def _parse_protocol(self) -> _ProtocolDecl:
        self.advance()
        name = self.expect_name("a protocol name after PROTOCOL")
        parents: list[_Token] = []
        if self.at("("):
            self.advance()
            parents = self._parse_names(")", "parent protocol name")
        if self.at("["):
            self.advance()
            self._parse_names("]", "unpacking function name")   # an optimisation hint: ignored
        self.expect("{", f"to open the fields of protocol {name.value}")
        fields = []
        while not self.at("}"):
            if self.tok.kind == "end":
                raise self.unexpected(f"'}}' to close protocol {name.value}")
            fields.append(self._parse_field())
        if not fields:
            raise self.f.error_at(self.tok, f"protocol {name.value} declares no field (GS-lite "
                                  f"needs at least one)")
        self.advance()
        return _ProtocolDecl(name, parents, fields, self.f)

    def _parse_field(self) -> _FieldDecl:
        type_ = self.expect_name("a field: type name access_function;")
        name = self.expect_name(f"the field's name after its type {type_.value}")
        accessor = self.advance() if self.tok.kind == "name" else None
        properties: list[tuple[_Token, _Token | None]] = []
        if self.at("("):
            self.advance()
            while True:
                key = self.expect_name("a field attribute (increasing, required, snap_len N, "
                                       "...)")
                value = self.advance() if self.tok.kind in ("name", "int", "string") else None
                properties.append((key, value))
                if not self.at(","):
                    break
                self.advance()
            self.expect(")", "to close the field attributes")
        if self.at("["):
            self.advance()
            self._parse_names("]", "unpacking function name")
        self.expect(";", f"after the declaration of field {name.value}")
        return _FieldDecl(type_, name, accessor, properties, self.f)

    def _parse_unpack_fcns(self) -> None:
        """`UNPACK_FCNS { name function cost; ... }`: GS-lite's field-unpacking optimisation;
        read for its syntax, then ignored."""
        self.advance()
        self.expect("{", "after UNPACK_FCNS")
        while True:
            self.expect_name("an unpacking function: name function cost")
            self.expect_name("the unpacking function's C function")
            if self.tok.kind != "int":
                raise self.unexpected("the unpacking function's cost (an integer)")
            self.advance()
            if self.at(";"):
                self.advance()
            if self.at("}"):
                self.advance()
                return


# --- from declarations to protocols ----------------------------------------------------------

@dataclass
class _Checked:
    """A declared field, checked: the `Field`, where it was declared and how it is read."""

    field: Field
    decl: _FieldDecl | None   # None: a field of a protocol read by an earlier load
    kind: str | None          # csv | gdat for a record accessor, None for a system one

    def place(self) -> str:
        if self.decl is None:
            return "a schema file read before"
        return self.decl.file.place(self.decl.name)


class _Unreadable(Exception):
    """A declaration oopscope cannot read (an access function or a type it does not know):
    the protocol is kept, and reading it is an error (`Protocol.unreadable`)."""


def _field_type(d: _FieldDecl) -> str:
    t = d.type.value
    if t in TYPES:
        return TYPES[t]
    if _FSTRING_TYPE.fullmatch(t):
        return "string"
    f = d.file
    if _UNSUPPORTED_TYPE.fullmatch(t):
        raise _Unreadable(f"field {d.name.value} is a {t}, a type oopscope does not read yet "
                          f"({f.place(d.type)})")
    close = [k for k in TYPES if k.lower() == t.lower()]
    hint = f"; did you mean {close[0]}?" if close else ""
    raise f.error_at(d.type, f"unknown type {t!r} for field {d.name.value}{hint} (types: bool, "
                     f"ushort, uint, int, ullong, llong, float, string or v_str, fstringN, IP "
                     f"for IPv4, IPV6)")


def _properties(d: _FieldDecl) -> frozenset[str]:
    f = d.file
    out = []
    for key, value in d.properties:
        name = key.value.lower()
        if name not in PROPERTIES:
            log.warning("%s: unknown field attribute %r of field %s, ignored (known: %s)",
                        f.place(key), key.value, d.name.value, ", ".join(PROPERTIES))
            out.append(key.value if value is None else f"{key.value} {value.value}")
            continue
        if PROPERTIES[name] and value is None:
            raise f.error_at(key, f"field attribute {name} needs a value (e.g. {name} "
                             f"{'0' if name == 'snap_len' else 'name'})")
        if not PROPERTIES[name] and value is not None:
            raise f.error_at(value, f"field attribute {name} takes no value")
        if name == "snap_len" and value is not None and value.kind != "int":
            raise f.error_at(value, "snap_len takes a byte count (an integer)")
        if value is None:
            out.append(name)
        else:
            text = value.value.strip("'")
            out.append(f"{name} {text}")
    if "increasing" in out and "decreasing" in out:
        raise f.error_at(d.name, f"field {d.name.value} cannot be both increasing and "
                         f"decreasing")
    return frozenset(out)


def _check_field(d: _FieldDecl, proto: _ProtocolDecl) -> _Checked | None:
    """The field, or None when its access function is not one we read (the caller decides
    whether that is an error)."""
    f = d.file
    type_ = _field_type(d)
    properties = _properties(d)
    name = d.name.value
    if d.accessor is None:
        raise f.error_at(d.name, f"field {name} of protocol {proto.name.value} has no access "
                         f"function (write: {d.type.value} {name} get_csv_<type>_pos<N>;)")
    accessor = d.accessor.value
    columns = (record_column(name) + "_hi", record_column(name) + "_lo") if type_ == "ip" \
        else (record_column(name),)
    made = Field(name, type_, columns, f"read by {accessor}", accessor, properties)
    if accessor in SYSTEM_ACCESSORS:
        if type_ not in _INTEGER_TYPES:
            raise f.error_at(d.type, f"field {name}: {accessor} gives an integer, not a "
                             f"{type_} (declare it uint)")
        return _Checked(made, d, None)
    reads = record_accessor(accessor)
    if reads is None:
        return None
    if reads.position < 1:
        raise f.error_at(d.accessor, f"field {name}: {accessor} reads position "
                         f"{reads.position}, but record positions start at 1")
    if reads.type != type_:
        right = f"get_{reads.kind}_{_gs_type(type_, d.type.value)}_pos{reads.position}"
        raise f.error_at(d.accessor, f"field {name} is declared {d.type.value} but {accessor} "
                         f"reads a {reads.gs_type} (GS-lite parses the value by the access "
                         f"function): declare it {_declared(reads.gs_type)} or read it with "
                         f"{right}")
    return _Checked(made, d, reads.kind)


def _gs_type(ours: str, declared: str) -> str:
    """The access-function type reading a value of our type `ours`."""
    back = {"ipv4": "ip", "ip": "ipv6"}
    return back.get(ours, ours)


def _declared(gs_type: str) -> str:
    return {"ip": "IP", "ipv6": "IPV6"}.get(gs_type, gs_type)


_UNREADABLE_HINT = ("oopscope reads records with get_csv_<type>_pos<N>, "
                    "get_gdat_<type>_pos<N>, get_system_time and get_schemaId")


class _Builder:
    """Turns the declarations of every file into protocols: inheritance, field clashes,
    record formats."""

    def __init__(self, decls: list[_ProtocolDecl], base: Schema, replace: bool = False):
        self.base = base
        self.decls: dict[str, _ProtocolDecl] = {}
        self.checked: dict[str, list[_Checked]] = {}
        #: protocol -> why oopscope cannot read it (its first unreadable declaration)
        self.unreadable: dict[str, str] = {}
        self.all_fields: dict[str, dict[str, _Checked]] = {}
        for d in decls:
            key = d.name.value.upper()
            f = d.file
            if key in PROTOCOLS:
                log.warning("%s: protocol %s is built in: its declaration is skipped and "
                            "oopscope's own %s is used (see docs/gsql.md, the packet schema)",
                            f.place(d.name), d.name.value, PROTOCOLS[key].name)
                continue
            if key in self.decls:
                first = self.decls[key]
                raise f.error_at(d.name, f"protocol {d.name.value} is declared twice: here "
                                 f"and at {first.file.place(first.name)}")
            if key in base and not replace:
                raise f.error_at(d.name, f"protocol {d.name.value} is already declared (at "
                                 f"{base.protocol(key).where or 'a schema file read before'})")
            self.decls[key] = d

    def build(self) -> list[Protocol]:
        for key in self.decls:
            self._resolve(key, [])
        for key, why in self.unreadable.items():
            d = self.decls[key]
            # one warning per protocol: the file stays usable for every other protocol
            log.warning("%s: protocol %s cannot be read by oopscope: %s; a query reading it "
                        "is refused", d.file.place(d.name), d.name.value, why)
        return [self._protocol(key) for key in self.decls]

    def _parents(self, d: _ProtocolDecl) -> list[str]:
        out = []
        for p in d.parents:
            key = p.value.upper()
            if key in PROTOCOLS:
                raise d.file.error_at(p, f"protocol {d.name.value} inherits from the built-in "
                                      f"packet protocol {PROTOCOLS[key].name}: a schema file's "
                                      f"protocols describe records and extend only protocols "
                                      f"of schema files")
            if key not in self.decls and key not in self.base:
                known = sorted(d2.name.value for d2 in self.decls.values())
                raise d.file.error_at(p, f"unknown parent protocol {p.value!r} of "
                                      f"{d.name.value} (schema-file protocols: "
                                      f"{', '.join(known) or 'none'})")
            if key in out:
                raise d.file.error_at(p, f"protocol {d.name.value} names parent {p.value} "
                                      f"twice")
            out.append(key)
        return out

    def _inherited(self, key: str) -> dict[str, _Checked]:
        """Fields of a parent (from this load, or of a protocol the base schema already
        holds: those carry no declaration place)."""
        if key in self.decls:
            return self.all_fields[key]
        out = {}
        for f in self.base.fields(key).values():
            reads = record_accessor(f.accessor)
            out[f.name] = _Checked(f, None, reads.kind if reads is not None else None)
        return out

    def _resolve(self, key: str, stack: list[str]) -> None:
        """Check `key`'s fields and compute all of them (ancestors first), parents first."""
        if key in self.all_fields:
            return
        d = self.decls[key]
        if key in stack:
            cycle = stack[stack.index(key):] + [key]
            names = " -> ".join(self.decls[k].name.value for k in cycle)
            raise d.file.error_at(d.name, f"inheritance cycle: {names} (a protocol cannot be "
                                  f"its own ancestor)")
        parents = self._parents(d)
        for p in parents:
            if p in self.decls:
                self._resolve(p, stack + [key])
        own = []
        for fd in d.fields:
            try:
                c = _check_field(fd, d)
            except _Unreadable as e:
                self._note_unreadable(key, str(e))
                continue
            if c is None:
                assert fd.accessor is not None   # _check_field refuses a missing accessor
                self._note_unreadable(key, f"field {fd.name.value} is read by "
                                      f"{fd.accessor.value}, which is not a record access "
                                      f"function ({_UNREADABLE_HINT}; only the built-in packet "
                                      f"protocols PACKET IP IPV4 IPV6 TCP UDP ICMP read "
                                      f"packets) ({d.file.place(fd.accessor)})")
                continue
            own.append(c)
        for p in parents:
            if p in self.unreadable:
                self._note_unreadable(key, f"it inherits from {self.decls[p].name.value}, "
                                      f"which oopscope cannot read")
        fields: dict[str, _Checked] = {}
        for p in parents:
            for c in self._inherited(p).values():
                self._add(d, fields, c, own=False)
        for c in own:
            self._add(d, fields, c, own=True)
        self.checked[key] = own
        self.all_fields[key] = fields

    def _note_unreadable(self, key: str, why: str) -> None:
        if key not in self.unreadable:
            self.unreadable[key] = why

    def _add(self, d: _ProtocolDecl, fields: dict[str, _Checked], c: _Checked, own: bool) -> None:
        name = c.field.name
        prev = fields.get(name)
        if prev is None:
            fields[name] = c
            return
        if prev.decl is not None and prev.decl is c.decl or prev.field is c.field:
            return    # the same declaration reached through two parents (a diamond)
        where_prev = prev.place()
        if own:
            assert c.decl is not None   # own fields come from this load's declarations
            raise d.file.error_at(c.decl.name, f"field {name} is declared twice in protocol "
                                  f"{d.name.value}: here and at {where_prev}")
        where = c.place()
        raise d.file.error_at(d.name, f"protocol {d.name.value} has field {name} twice, "
                              f"through its parents: at {where_prev} and at {where}")

    def _protocol(self, key: str) -> Protocol:
        d = self.decls[key]
        if key in self.unreadable:
            names = [self.decls[p].name.value if p in self.decls else self.base.canonical(p)
                     for p in self._parents(d)]
            return Protocol(d.name.value, names[0] if names else None, 0,
                            tuple(c.field for c in self.checked[key]), parents=tuple(names[1:]),
                            where=f"{d.file.path}:{d.name.line}",
                            unreadable=self.unreadable[key])
        fields = list(self.all_fields[key].values())
        kinds = [c for c in fields if c.kind is not None]
        if kinds:
            first = kinds[0]
            other = next((c for c in kinds if c.kind != first.kind), None)
            if other is not None:
                # point at the offending access function when this protocol declares it
                at = other.decl.accessor if other in self.checked[key] and other.decl \
                    is not None and other.decl.accessor is not None else d.name
                raise d.file.error_at(at, f"protocol {d.name.value} mixes record formats: "
                                      f"{other.field.name} is read by {other.field.accessor} "
                                      f"(at {other.place()}) but {first.field.name} by "
                                      f"{first.field.accessor} (at {first.place()}); a "
                                      f"protocol reads csv or gdat records, not both")
        parents = self._parents(d)
        names = [self.decls[p].name.value if p in self.decls else self.base.canonical(p)
                 for p in parents]
        return Protocol(d.name.value, names[0] if names else None, 0,
                        tuple(c.field for c in self.checked[key]), parents=tuple(names[1:]),
                        record=kinds[0].kind if kinds else None,
                        where=f"{d.file.path}:{d.name.line}", queryable=bool(kinds))


# --- entry points ----------------------------------------------------------------------------

def parse_schema_text(text: str, path: str = "<schema>") -> list[_ProtocolDecl]:
    f = _File(path, text)
    _tokenize(f)
    return _Parser(f).parse()


def schema_from_text(text: str, path: str = "<schema>", base: Schema = BUILTIN) -> Schema:
    """The schema of one schema file's text (for tests and tools)."""
    protocols = _Builder(parse_schema_text(text, path), base).build()
    return base.with_protocols(protocols, (path,))


def load_schema(paths: Iterable[str | Path], base: Schema = BUILTIN) -> Schema:
    """`base` plus the protocols of the schema files `paths` (read together: a protocol may
    inherit from one of another file). SchemaError when a file is wrong or unreadable."""
    return schema_from_files([(str(p), read_schema_file(p)) for p in paths], base)


def read_schema_file(path: str | Path) -> str:
    """The text of a schema file (SchemaError naming it when it cannot be read)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SchemaError("no such schema file", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"cannot read the schema file: {exc}", path=str(path)) from None


def schema_from_files(files: Sequence[tuple[str, str]], base: Schema = BUILTIN, *,
                      replace: bool = False) -> Schema:
    """`base` plus the protocols of schema files given as (path, text) pairs: what a server
    keeps of the schema files a query was submitted with (`oopscope submit --schema`).
    `replace`: a protocol of `base` may be declared again (the new declaration wins)."""
    decls: list[_ProtocolDecl] = []
    for path, text in files:
        decls += parse_schema_text(text, path)
    if not files:
        return base
    protocols = _Builder(decls, base, replace).build()
    for proto in protocols:
        log.debug("%s: protocol %s (%s)", proto.where, proto.name,
                  f"{proto.record} records" if proto.record else "base of record protocols")
    return base.with_protocols(protocols, tuple(path for path, _ in files))


def layered_schema(layers: Sequence[Sequence[tuple[str, str]]],
                   base: Schema = BUILTIN) -> Schema:
    """`base`, then each layer of (path, text) schema files over the one before: a later
    layer's protocol replaces an earlier one of its name and may inherit from any (a server's
    schema files, then those a query was submitted with)."""
    schema = base
    for i, files in enumerate(layers):
        schema = schema_from_files(list(files), schema, replace=i > 0)
    return schema


def schema_for(query_paths: Sequence[str | Path | None],
               schema_paths: Sequence[str | Path] = (), base: Schema = BUILTIN) -> Schema:
    """The schema a run of `query_paths` uses: the `--schema` files when there are any,
    else the `packet_schema.txt` beside each query file when there is one (GS-lite reads
    the schema of a query set from there), each file once."""
    return load_schema(schema_files_for(query_paths, schema_paths), base)


def schema_files_for(query_paths: Sequence[str | Path | None],
                     schema_paths: Sequence[str | Path] = ()) -> list[Path]:
    """The schema files `schema_for` reads, in order. Files named with --schema replace
    the one beside the query: a user who names a schema file means that one, and could not
    otherwise try another declaration of a protocol the file beside the query declares."""
    chosen: list[Path] = [Path(p) for p in schema_paths]
    seen = {_same_file_key(p) for p in chosen}
    for q in query_paths:
        if q is None:
            continue
        beside = Path(q).parent / PACKET_SCHEMA
        if chosen and beside.is_file() and _same_file_key(beside) not in seen:
            log.info("not reading %s beside the query file %s: --schema names the schema "
                     "files (add --schema %s to read it too)", beside, q, beside)
            seen.add(_same_file_key(beside))
        if beside.is_file() and _same_file_key(beside) not in seen:
            log.info("reading %s beside the query file %s (as GS-lite does)", beside, q)
            chosen.append(beside)
            seen.add(_same_file_key(beside))
    return chosen


def _same_file_key(p: Path) -> str:
    try:
        return str(p.resolve())
    except OSError:
        return str(p)
