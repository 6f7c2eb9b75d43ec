"""Partial rows as Arrow: the lowlevel -> highlevel contract, and its combine step.

Layout of a partial-row RecordBatch (one row per (window, group) piece that left the table):

| column | Arrow type | meaning |
|---|---|---|
| `window` | int64 | pane id `(timestamp_ns + offset_ns) // pane_ns` |
| `<key>` | uint64 / int64 / float64 / bool | a group key (`KeyColumn.name`) |
| `<key>__hi`, `<key>__lo` | uint64, uint64 | an `ip` key: the two halves |
| `<agg>` | int64 / uint64 / float64 | a sub-aggregate state (`SubAggregate.name`) |
| `<agg>__t` | int64 | first/last: time (ns) of the value |
| `<agg>__hi`, `<agg>__lo` | uint64, uint64 | min/max over an `ip` value: its two halves |
| `<agg>` | fixed_size_binary(R) | distinct: R HyperLogLog registers (one byte each) |
| `__final` | bool | an aggregation table's rows only: the row is the only one of its (window, group) from this table (`lowlevel.finality`) |

Schema metadata: `oopscope.query`, `oopscope.link`, `oopscope.pane_ns`, `oopscope.offset_ns`,
`oopscope.flush`; each state field carries `oopscope.kind` (count, sum, ...) so a consumer
knows the super-aggregate (count/sum -> sum, min -> min, max -> max, and/or/xor -> same,
distinct -> register-wise max, first/last -> by `__t`). Several rows of one (window, group) are
normal; `combine_partials` merges them (the high level's job, offered here vectorised).
Key types: `ip` is two uint64 columns; `llong`/`int` are int64, `float` float64, `bool` bool,
`string` Arrow string (a record link's string codes in the table, decoded here through the
link's `capture.strings.StringTable`); every other GSQL type (uint, ullong, ipv4, mac) is
uint64. The table stores every key as uint64 bits (signed and float keys bit-cast; so -0.0 and
0.0 are different float keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from common.spool import FINAL
from lowlevel.aggregates import StateLayout, combine_states
from lowlevel.engine import Partials
from queries.plan import ip_words, udaf_words

if TYPE_CHECKING:
    from capture.strings import StringTable
    from lowlevel.strings import StringOrder

_KEY_DTYPES = {"llong": np.int64, "int": np.int64, "float": np.float64, "bool": np.bool_}
_BANK_ARROW = {"i": pa.int64(), "u": pa.uint64(), "f": pa.float64()}


def key_width(type_: str) -> int:
    """How many uint64 table columns a key of this GSQL type takes."""
    return 2 if type_ == "ip" else 1


def key_dtype(type_: str) -> np.dtype:
    return np.dtype(_KEY_DTYPES.get(type_, np.uint64))


def encode_key(values, type_: str) -> list[np.ndarray]:
    """Evaluated key values -> the uint64 table columns (1, or 2 for ip: hi, lo; a string:
    its codes in the link's intern table)."""
    if type_ == "string":
        codes = getattr(values, "codes", None)
        if codes is None:
            raise TypeError("a string key must be a record link's string (codes into its "
                            "intern table)")
        return [np.asarray(codes, dtype=np.uint64)]
    if type_ == "ip":
        hi, lo = values
        return [np.asarray(hi, dtype=np.uint64), np.asarray(lo, dtype=np.uint64)]
    v = np.asarray(values)
    dt = key_dtype(type_)
    if dt == np.float64:
        return [v.astype(np.float64).view(np.uint64)]
    if dt == np.int64:
        return [v.astype(np.int64).view(np.uint64)]
    return [v.astype(np.uint64)]


def decode_key(cols: list[np.ndarray], type_: str) -> list[np.ndarray]:
    if type_ in ("ip", "string"):       # string: codes, decoded by the schema's table
        return cols
    dt = key_dtype(type_)
    c = np.ascontiguousarray(cols[0])
    if dt == np.bool_:
        return [c != 0]
    return [c.view(dt) if dt != np.uint64 else c]


@dataclass(frozen=True)
class KeySpec:
    name: str
    type: str


class PartialSchema:
    """The Arrow schema of one operator's partial rows, and conversions to and from it."""

    def __init__(self, keys: list[KeySpec], layout: StateLayout, *, query: str = "",
                 link: str = "", pane_ns: int = 0, offset_ns: int = 0, flush: str = "",
                 final: bool = False):
        self.keys = list(keys)
        self.layout = layout
        #: the link's intern table (`capture.strings.StringTable`) string keys decode with;
        #: set by the operator from its first record batch
        self.strings: StringTable | None = None
        #: the order MIN/MAX states over strings hold ranks in (`lowlevel.strings.StringOrder`);
        #: set by the operator with its first string state
        self.order: StringOrder | None = None
        fields = [pa.field("window", pa.int64(), nullable=False)]
        self.key_names: list[str] = []
        for k in self.keys:
            if k.type == "ip":
                names = [f"{k.name}__hi", f"{k.name}__lo"]
                types = [pa.uint64(), pa.uint64()]
            else:
                names = [k.name]
                types = [pa.string() if k.type == "string" else
                         pa.from_numpy_dtype(key_dtype(k.type))]
            for nm, t in zip(names, types):
                fields.append(pa.field(nm, t, nullable=False))
            self.key_names += names
        self.state_names: list[str] = []
        for spec in layout.specs:
            meta = {b"oopscope.kind": spec.kind.encode()}
            if spec.dtype == "ip":      # MIN/MAX over an address: its two halves
                for w in ip_words(spec.name):
                    fields.append(pa.field(w, pa.uint64(), nullable=False, metadata=meta))
                    self.state_names.append(w)
                continue
            bank, _, width = layout.columns[spec.name]
            t = pa.binary(width) if bank == "h" else \
                pa.string() if spec.dtype == "string" else _BANK_ARROW[bank]
            fields.append(pa.field(spec.name, t, nullable=False, metadata=meta))
            self.state_names.append(spec.name)
            if spec.kind in ("first", "last"):
                fields.append(pa.field(spec.name + "__t", pa.int64(), nullable=False,
                                       metadata={b"oopscope.kind": b"time"}))
                self.state_names.append(spec.name + "__t")
            if spec.kind == "udaf":     # its further state words
                for w in udaf_words(spec.name, spec.ext.size)[1:]:
                    fields.append(pa.field(w, _BANK_ARROW[bank], nullable=False,
                                           metadata={b"oopscope.kind": b"udaf_word"}))
                    self.state_names.append(w)
        #: the rows carry the `FINAL` column (an aggregation table's rows)
        self.final = final
        self.combined_schema = pa.schema(fields)     # combined rows: no final flag
        if final:
            fields.append(pa.field(FINAL, pa.bool_(), nullable=False))
        schema_meta = {"oopscope.query": query, "oopscope.link": link,
                       "oopscope.pane_ns": str(pane_ns), "oopscope.offset_ns": str(offset_ns),
                       "oopscope.flush": flush}
        self.schema = pa.schema(fields, metadata={k.encode(): v.encode() for k, v in schema_meta.items()})
        self.nkeys = len(self.key_names)

    def record_batch(self, chunk: Partials) -> pa.RecordBatch:
        arrays: list[pa.Array] = [pa.array(chunk.window, pa.int64())]
        j = 0
        for k in self.keys:
            w = key_width(k.type)
            for col in decode_key([chunk.keys[:, j + x] for x in range(w)], k.type):
                if k.type == "string":
                    arrays.append(self._texts(col, k.name))
                    continue
                arrays.append(pa.array(np.ascontiguousarray(col)))
            j += w
        states = self.layout.state_columns(chunk.banks)
        for name in self.state_names:
            t = self.schema.field(name).type
            if pa.types.is_string(t) and not isinstance(states[name], pa.Array):
                arrays.append(self._state_texts(states[name], name))
                continue
            arrays.append(_state_array(states[name], t))
        if self.final:
            final = chunk.final if chunk.final is not None else np.zeros(len(chunk), np.bool_)
            arrays.append(pa.array(final, pa.bool_()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _state_texts(self, ranks: np.ndarray, name: str) -> pa.Array:
        if self.order is None:
            if len(ranks) == 0:
                return pa.array([], pa.string())
            raise ValueError(f"string state {name!r}: no string order to decode its ranks with")
        return self.order.texts(ranks)

    def _texts(self, codes: np.ndarray, name: str) -> pa.Array:
        if self.strings is None:
            if len(codes) == 0:
                return pa.array([], pa.string())
            raise ValueError(f"string key {name!r}: no intern table to decode its codes with")
        return self.strings.decode(codes)

    def to_numpy(self, table) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray]]:
        """(window, key columns, named state columns) of partial rows (Table or batches)."""
        if not isinstance(table, pa.Table):
            table = pa.Table.from_batches(list(table), schema=self.schema)
        window = table.column("window").to_numpy()
        keys = [table.column(nm).to_numpy() for nm in self.key_names]
        states = {}
        for name in self.state_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_fixed_size_binary(col.type):
                w = col.type.byte_width
                buf = col.buffers()[1]
                raw = np.frombuffer(buf, np.uint8)[col.offset * w:(col.offset + len(col)) * w]
                states[name] = raw.reshape(len(col), w)
            else:
                states[name] = col.to_numpy(zero_copy_only=False)
        return window, keys, states


def _state_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    if pa.types.is_string(type_):
        return pa.array(values, type_)
    if pa.types.is_fixed_size_binary(type_):
        regs = np.ascontiguousarray(values, dtype=np.uint8)
        return pa.FixedSizeBinaryArray.from_buffers(type_, len(regs),
                                                    [None, pa.py_buffer(regs.tobytes())])
    return pa.array(np.ascontiguousarray(values), type_)


def combine_partials(batches, pschema: PartialSchema) -> pa.Table:
    """One row per (window, group): the super-aggregates over every partial row given."""
    window, keys, states = pschema.to_numpy(batches)
    out_keys, out_states = combine_states(pschema.layout, [window] + keys, states)
    arrays = [pa.array(c) for c in out_keys]
    for name in pschema.state_names:
        arrays.append(_state_array(out_states[name], pschema.schema.field(name).type))
    schema = pschema.combined_schema.with_metadata(pschema.schema.metadata)
    return pa.Table.from_arrays(arrays, schema=schema)
