"""The plan-driven low-level operator: one query on one link, packet batches in, partial rows out.

A thin layer over `engine.HashAggregator`: per batch it selects the rows of the plan's
protocol (rows lacking the protocol's layer bits are skipped; counted as malformed when their
decode `reason` is not benign), evaluates WHERE, the group keys and the sub-aggregate
arguments with `lowlevel.evaluate.evaluate` (vectorised, once per batch), and hands plain
arrays to the jitted kernel. Partial rows come back as Arrow RecordBatches (`partials.py`
describes the layout) together with the operator's punctuation.

Late packets (time below the input punctuation already seen) follow the plan's `late` policy
(docs/semantics.md "Late data"). Under `drop` (the default) they are counted in `late` and dropped:
they must not reappear in a window the operator has declared complete. Under `correct` they go
to a *late partition*: a second `HashAggregator` of the same plan (oop_lazy: order does not
matter there), created on the first late packet, progressing on its own data (collisions
evict), and flushed whole by every advancing input punctuation and by `finish()`. Its partial
rows carry the same (window, keys) columns; under `correct` every output batch has one more
column, `__late` (int8: 1 for rows of the late partition, 0 for the main table), the marker
the spool keeps. The operator's punctuation stays the main table's: late rows may violate it
by design, and the high level turns those into correction rows (`highlevel.aggregate`). Counters:
`late` = late packets dropped, `late_corrected` = late packets routed to the late partition,
`late_rows_out` = partial rows of the late partition. Flow plans and selections always drop.

A plan without a window (a selection query) passes its `projections` of the accepted rows
through, one output row per packet, and forwards the input punctuation.

A plan with `flow` settings (a flow query: DEFINE idle_timeout / flow_end) runs the flow
table of `flowtable.py` instead: its last key is the hidden flow id the kernel writes, the
other keys are hashed; TCP packets with FIN or RST end their flow when `fin_rst` is set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from capture.batch import PacketBatch
from capture.schema import BENIGN_REASONS, L_TCP, protocol_mask
from capture.strings import StringTable
from common.jit import ngjit
from lowlevel.aggregates import AggSpec, StateLayout, distinct_hashes
from lowlevel.engine import HashAggregator, Partials
from lowlevel.errors import LowLevelError
from lowlevel.flowtable import FlowAggregator
from lowlevel.partials import KeySpec, PartialSchema, encode_key, key_width
from lowlevel.sizing import ADAPTIVE_PROBES, TableSizer, first_slots
from lowlevel.strings import StringOrder, move_ranks
from lowlevel.values import StringCodes, promote_ip
from queries.plan import FLUSH_POLICIES, LowLevelPlan

log = logging.getLogger(__name__)

_SUPPORTED_KEY_TYPES = {"uint", "ullong", "llong", "int", "bool", "ipv4", "ip", "mac", "float"}
_BENIGN = np.array(sorted(BENIGN_REASONS), dtype=np.uint8)
_LOW32 = np.uint64(0xFFFF_FFFF)
_ALL64 = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
#: the marker column of late-partition rows under `late 'correct'` (int8 1, else 0)
LATE_MARKER = "__late"


@ngjit
def put_key_column(out, j, col, mask):
    """out[:, j] = col & mask as uint64 (a plain packet-field key, no temporaries)."""
    for i in range(col.shape[0]):
        out[i, j] = np.uint64(col[i]) & mask


@ngjit
def count_in_protocol(layers, mask):
    """How many rows have one of the `mask` layer bits (the common all-in case needs no mask
    array)."""
    n = 0
    for i in range(layers.shape[0]):
        if layers[i] & mask:
            n += 1
    return n


def _default_evaluate():
    from lowlevel.evaluate import evaluate  # written beside this package; imported late

    return evaluate


#: rows `oopscope run` lets an operator hold before handing them out (see `hold_rows`)
HOLD_ROWS = 8192
#: the probes of a fixed table and a flow table (an adaptive one: `sizing.ADAPTIVE_PROBES`)
FIXED_PROBES = 2


class LowLevelOperator:
    """Run one `LowLevelPlan` over the packet batches of its link.

    `evaluate(expr, batch) -> np.ndarray` (an `(hi, lo)` tuple for ip values) defaults to
    `lowlevel.evaluate.evaluate`; an expression that is a plain Python callable is called
    with the batch instead (handy for tools that build plans without GSQL text).
    """

    def __init__(self, plan: LowLevelPlan, *, probes: int | None = None,
                 evaluate: Callable | None = None, hold_rows: int = 0,
                 punctuation_flush: bool = False,
                 allow_slots: Callable[[int], bool] | None = None,
                 start_slots: int | None = None):
        self.plan = plan
        # probes: slots a packet tries before evicting; None: ADAPTIVE_PROBES for an adaptive
        # table (`lowlevel.sizing`), FIXED_PROBES for a fixed one and a flow table
        # allow_slots(n): whether the memory budget lets this operator's table grow to n
        # slots (an adaptive table's, `lowlevel.sizing`; None: no budget but the plan's cap)
        # start_slots: the size an adaptive table had when its query last ran (a resumed run,
        # a restarted appliance): it starts there (`lowlevel.sizing.first_slots`)
        # hold_rows > 0: `process` keeps the rows that leave the table until this many are
        # held, and `punctuate`/`finish` hand out what is held before their own rows; one
        # Arrow conversion per `hold_rows` rows instead of one per packet batch (a fixed
        # cost per call, which dominates small batches off a packet ring). Every row still
        # comes out before the punctuation that covers it. 0: rows come out at once. A plain
        # aggregate plan holds its rows in the engine's output buffer (`engine.py`), the
        # others in `_held`.
        self.hold_rows = int(hold_rows)
        self._punctuation_flush = punctuation_flush
        # punctuation_flush: a pane's entries leave as soon as punctuation closes it
        # (`lowlevel.engine.HashAggregator`), for latency over a smoothed flush
        self._held: list[Partials] = []
        self._held_n = 0
        where = f"query {plan.query!r} on link {plan.link!r}"
        if plan.flush not in FLUSH_POLICIES:
            raise LowLevelError(f"{where}: flush policy {plan.flush!r} is not one of "
                                f"{', '.join(FLUSH_POLICIES)}")
        if plan.record is not None:
            self._mask = 0           # a record link: every row is a record of the protocol
        else:
            try:
                self._mask = protocol_mask(plan.protocol)
            except KeyError:
                raise LowLevelError(f"{where}: unknown protocol {plan.protocol!r}") from None
        self._evaluate_fn = evaluate
        cols = plan.keys if plan.window is not None else plan.projections
        # a packet link's string keys are computed from payloads (str_extract_regex(TCP_data,
        # ...)): interned into a table of the operator's own, once per distinct string
        supported = _SUPPORTED_KEY_TYPES | {"string"}
        # string keys are a record link's codes, decoded through its intern table (taken
        # from the first batch) when partial rows are made
        self._string_keys = any(k.type == "string" for k in cols)
        for k in cols:
            if k.type not in supported:
                raise LowLevelError(f"{where}: column {k.name!r} has type {k.type!r}; the low "
                                    f"level takes {', '.join(sorted(supported))}")
        self._keys = [KeySpec(k.name, k.type) for k in cols]
        specs = [AggSpec(s.name, s.kind, s.dtype, plan.distinct_registers, s.udaf)
                 for s in plan.subaggs]
        try:
            self.layout = StateLayout(specs)
        except ValueError as exc:
            raise LowLevelError(f"{where}: {exc}") from None
        w = plan.window
        self.schema = PartialSchema(self._keys, self.layout, query=plan.query, link=plan.link,
                                    pane_ns=w.pane_ns if w else 0,
                                    offset_ns=w.offset_ns if w else 0, flush=plan.flush,
                                    final=w is not None and plan.flow is None)
        self.engine: HashAggregator | None = None
        self._flow = plan.flow
        self._hashed = len(self._keys)
        if self._flow is not None:
            if w is None or not self._keys or self._keys[-1].name != self._flow.key:
                raise LowLevelError(f"{where}: a flow plan needs a window and the flow id "
                                    f"{self._flow.key!r} as its last key")
            self._hashed = len(self._keys) - 1
            try:
                self.engine = FlowAggregator(
                    self.layout, self.schema.nkeys - 1, plan.slots, pane_ns=w.pane_ns,
                    offset_ns=w.offset_ns, idle_ns=self._flow.idle_ns,
                    reason_state=self._flow.reason, link=plan.link,
                    probes=FIXED_PROBES if probes is None else probes)
            except ValueError as exc:
                raise LowLevelError(f"{where}: {exc}") from None
        elif w is not None:
            slots = first_slots(plan.slots, plan.max_slots, start_slots, allow_slots) \
                if plan.max_slots else plan.slots
            try:
                self.engine = HashAggregator(
                    self.layout, self.schema.nkeys, slots, pane_ns=w.pane_ns,
                    offset_ns=w.offset_ns, flush=plan.flush, slow_flush=plan.slow_flush,
                    max_disorder=plan.max_disorder,
                    probes=probes if probes is not None
                    else ADAPTIVE_PROBES if plan.max_slots else FIXED_PROBES,
                    hold_rows=self.hold_rows if plan.late != "correct" else 0,
                    punctuation_flush=punctuation_flush,
                    sizer=TableSizer(slots, plan.max_slots, allow=allow_slots)
                    if plan.max_slots else None)
            except ValueError as exc:
                raise LowLevelError(f"{where}: {exc}") from None
        self._engine_holds = self.engine is not None and self._flow is None \
            and self.engine.hold_rows > 0
        # CUBE / ROLLUP / GROUPING_SETS: each batch is folded in once per grouping pattern,
        # with that pattern's key expressions (`LowLevelPlan.patterns`); None between batches
        self._pattern: int | None = None
        self._direct = self._direct_keys()
        self._pattern_direct = [self._direct_keys(exprs) for exprs in plan.patterns]
        self._direct_arg = self._direct_args()
        # per-batch arrays reused across batches, grown to the largest one (`_grow`)
        self._key_words = sum(key_width(s.type) for s in self._keys[:self._hashed])
        self._cap = 0
        # docs/semantics.md "Late data": the late partition (built on the first late packet)
        self._correct = plan.late == "correct" and self.engine is not None
        if self._correct and self._flow is not None:
            log.warning("%s: late 'correct' is not supported by flow tables; late packets are "
                        "dropped and counted", where)
            self._correct = False
        self.late_engine: HashAggregator | None = None
        self._late_counts = dict(late_corrected=0, late_rows_out=0)
        self._in_punct: int | None = None
        self._out_punct: int | None = None
        self._counts = dict(packets_in=0, packets_protocol=0, packets_where=0, malformed=0,
                            late=0, rows_out=0, zero_divisors=0)
        # a query that divides learns, per batch, which packets met a zero divisor (their
        # quotient is the defined 0): `zero_divisors` counts them, once per packet
        from lowlevel.evaluate import divides

        self._divides = evaluate is None and any(
            divides(e) for e in [plan.predicate, *(k.expr for k in (*plan.keys,
                                                                     *plan.projections)),
                                 *(s.arg for s in plan.subaggs)])
        self._zeros: np.ndarray | None = None
        #: MIN/MAX over strings: their u-bank columns (`lowlevel.strings.StringOrder`)
        self._rank_columns = [self.layout.columns[s.name][1] for s in plan.subaggs
                              if s.dtype == "string"]

    @property
    def read_columns(self) -> tuple[str, ...] | None:
        """The physical packet columns this operator reads (for `open_capture(columns=...)`,
        which then decodes only those), or None when it cannot tell (a callable expression)."""
        return plan_read_columns(self.plan)

    # --- expression evaluation ---------------------------------------------------------------
    def _eval(self, expr, batch: PacketBatch):
        if callable(expr) and not hasattr(expr, "arg_types"):
            return expr(batch)
        if self._evaluate_fn is None:
            self._evaluate_fn = _default_evaluate()
        if self._zeros is not None:
            return self._evaluate_fn(expr, batch, zeros=self._zeros)
        return self._evaluate_fn(expr, batch)

    def _key_exprs(self) -> list:
        """The expressions of the hashed keys (of the grouping pattern being folded in)."""
        if self._pattern is not None:
            return list(self.plan.patterns[self._pattern])
        return [k.expr for k in (self.plan.keys if self.plan.window else self.plan.projections)]

    def _direct_keys(self, exprs=None) -> list:
        """Per key, the (physical column, mask) pairs it is when it is a plain packet field
        of unsigned columns (srcIP, ports, ...), else None (an expression): such keys are
        written straight into the key matrix without the evaluator's temporaries."""
        from capture.schema import COLUMN_BY_NAME

        out = []
        for spec, e in zip(self._keys[:self._hashed], exprs if exprs is not None
                           else self._key_exprs()):
            cols = getattr(e, "columns", None)
            direct = None
            if (callable(e) and not hasattr(e, "arg_types")) or type(e).__name__ != "Field" \
                    or getattr(e, "table", None) is not None or not cols \
                    or any(c not in COLUMN_BY_NAME or COLUMN_BY_NAME[c].dtype.kind != "u"
                           for c in cols):
                pass
            elif spec.type == "ip" and e.type == "ip" and len(cols) == 2:
                direct = [(cols[0], _ALL64), (cols[1], _ALL64)]
            elif spec.type == "ipv4" and e.type == "ipv4" and len(cols) == 1:
                direct = [(cols[0], _LOW32)]
            elif spec.type in ("uint", "ullong") and e.type == spec.type and len(cols) == 1:
                direct = [(cols[0], _ALL64)]
            out.append(direct)
        return out

    def _direct_args(self) -> dict[str, str]:
        """Sub-aggregate name -> the physical column its argument is, when the argument is a
        plain packet field (len, flags, timestamp, ...) whose evaluated value is that column
        widened to its argument bank's kind: written straight into the bank (numpy casts on
        assignment, as the evaluator's astype does) without the evaluator's copy."""
        from capture.schema import COLUMN_BY_NAME

        out = {}
        for sub in self.plan.subaggs:
            if sub.name not in self.layout.arg_columns:
                continue
            bank = self.layout.arg_columns[sub.name][0]
            e = sub.arg
            if (bank == "d" or e is None or type(e).__name__ != "Field"
                    or e.name in ("link", "time", "timestamp_ms")    # derived values
                    or getattr(e, "table", None) is not None
                    or e.type in ("ip", "ipv4", "bool")):
                continue
            cols = e.columns or (e.name,)          # as `batch_field` reads it
            if len(cols) != 1 or cols[0] not in COLUMN_BY_NAME \
                    or COLUMN_BY_NAME[cols[0]].dtype.kind not in "iu":
                continue
            if (e.type == "float") != (bank == "f"):
                continue        # a float value into an integer bank (or back): not the same
            out[sub.name] = cols[0]
        return out

    def _grow(self, n: int) -> None:
        """Make the reused key matrix, argument banks and all-true mask hold n packets (the
        callers slice them to the batch and overwrite keys and arguments whole)."""
        if n > self._cap:
            self._cap = n
            self._keybuf = np.empty(n * self._key_words, np.uint64)
            self._argbuf = tuple(np.zeros(a.size, a.dtype)
                                 for a in self.layout.empty_args(n))
            self._ones = np.ones(n, bool)

    def _stack_keys(self, batch: PacketBatch) -> np.ndarray:
        """The uint64 key matrix [n, key words] (a view of a buffer the next batch reuses)."""
        n = len(batch)
        specs = self._keys[:self._hashed]
        self._grow(n)
        out = column_major(self._keybuf, n, self._key_words)
        j = 0
        directs = self._direct if self._pattern is None else self._pattern_direct[self._pattern]
        for spec, expr, direct in zip(specs, self._key_exprs(), directs):
            if direct is not None:
                for col, mask in direct:
                    put_key_column(out, j, batch[col], mask)
                    j += 1
                continue
            value = self._eval(expr, batch)
            if spec.type == "string" and isinstance(value, pa.Array):
                table = self.schema.strings
                assert table is not None        # set from the first batch (`_process`)
                value = StringCodes(table.intern_array(value), table)
            for col in encode_key(value, spec.type):
                out[:, j] = col  # broadcasts constants
                j += 1
        return out

    def _args(self, batch: PacketBatch):
        """The argument banks (views of buffers the next batch reuses; every column of them is
        a sub-aggregate's argument, written whole here)."""
        n = len(batch)
        self._grow(n)
        banks = tuple(column_major(flat, n, self.layout.arg_width[w])
                      for flat, w in zip(self._argbuf, "iufd"))
        for s in self.plan.subaggs:
            if s.name not in self.layout.arg_columns:
                continue
            bank, col = self.layout.arg_columns[s.name]
            direct = self._direct_arg.get(s.name)
            if direct is not None:
                banks["iufd".index(bank)][:, col] = batch[direct]
                continue
            v = self._eval(s.arg, batch)
            if isinstance(v, StringCodes) and s.dtype == "string":
                v = self._string_ranks(v)
            if isinstance(v, StringCodes):
                raise LowLevelError(f"query {self.plan.query!r}: {s.kind}({s.name}) over a "
                                    "string is not supported; group by it instead")
            if bank == "d":
                v = distinct_hashes(v)
            elif s.dtype == "ip":        # MIN/MAX over an address: its (hi, lo) words
                hi, lo = promote_ip(v)
                banks[1][:, col] = hi
                banks[1][:, col + 1] = lo
                continue
            else:
                if isinstance(v, tuple):
                    raise LowLevelError(f"query {self.plan.query!r}: {s.kind}({s.name}) over "
                                        "an ip value is not supported; use distinct or a key")
                v = np.asarray(v)
            banks["iufd".index(bank)][:, col] = v
        return banks

    def _string_ranks(self, v: StringCodes) -> np.ndarray:
        """The ranks of string codes for a MIN/MAX state; when the link's table has grown,
        first moves every state held (table, output buffer, held rows) to the new ranks."""
        order = self.schema.order
        if order is None:
            order = self.schema.order = StringOrder(v.table)
        moved = order.refresh()
        if moved is not None:
            for engine in (self.engine, self.late_engine):
                if engine is None:
                    continue
                base = engine._base["u"]
                for col in self._rank_columns:
                    move_ranks(engine.table[1][:, base + col], moved)
                    move_ranks(engine.out[1][:engine.held, base + col], moved)
            for chunk in self._held:
                for col in self._rank_columns:
                    move_ranks(chunk.banks[1][:, col], moved)
        return order.ranks_of(v.codes)

    # --- the pipeline steps ------------------------------------------------------------------
    def warm(self, sample: PacketBatch) -> bool:
        """Load (or compile) the kernels this operator runs, for batches of `sample`'s
        column types (a link's made-up batch), by running a twin of it over `sample` to its
        finish: a live link's first batch then costs what the next ones do, where it paid
        ~0.05 s of kernel loads while its input queued. This operator is left untouched; a
        plan that calls user functions (they would see the made-up rows) or a custom
        `evaluate` is not warmed. Whether it was."""
        from lowlevel.evaluate import calls_user_function

        plan = self.plan
        exprs = [plan.predicate, *(k.expr for k in (*plan.keys, *plan.projections)),
                 *(s.arg for s in plan.subaggs)]
        if self._evaluate_fn is not None or any(s.udaf for s in plan.subaggs) or \
                any(calls_user_function(e) for e in exprs) or not len(sample):
            return False
        try:
            twin = LowLevelOperator(plan, hold_rows=self.hold_rows,
                                    punctuation_flush=self._punctuation_flush)
            twin.process(sample)
            if twin.engine is not None and plan.window is not None:
                twin.punctuate(int(sample["timestamp"].max()) + 2 * plan.window.pane_ns)
            twin.finish()
        except Exception as exc:  # noqa: BLE001 - a warm-up never stops a run: the first
            # batch then loads the kernels itself, and says what is wrong with the plan
            log.debug("query %s on link %s: not warmed (%s)", plan.query, plan.link, exc)
            return False
        return True

    def process(self, batch: PacketBatch) -> list[pa.RecordBatch]:
        """Fold a packet batch in; returns the partial rows that left the table meanwhile."""
        if not self._divides:
            return self._process(batch)
        try:
            return self._process(batch)
        finally:
            self._zeros = None

    def _count_zeros(self, where_zeros: np.ndarray | None, valid: np.ndarray) -> None:
        """Packets that met a zero divisor: in WHERE (every packet of the protocol), or in a
        key or argument of a packet WHERE kept."""
        rows = self._zeros & valid
        if where_zeros is not None:
            rows |= where_zeros
        self._counts["zero_divisors"] += int(np.count_nonzero(rows))

    def _process(self, batch: PacketBatch) -> list[pa.RecordBatch]:
        c = self._counts
        n = len(batch)
        c["packets_in"] += n
        if n == 0:
            return []
        if self._string_keys and self.schema.strings is None:
            self.schema.strings = _link_strings(batch) or StringTable()
        if self._flow is not None:
            assert isinstance(self.engine, FlowAggregator)   # a flow plan runs a flow table
            self.engine.observe(int(batch["timestamp"].max()))
        if self._mask:
            layers = batch["layers"]
            nproto = count_in_protocol(layers, self._mask)
            if nproto < n:
                inproto = (layers & self._mask) != 0
                bad = ~inproto & ~np.isin(batch["reason"], _BENIGN)
                c["malformed"] += int(np.count_nonzero(bad))
                batch = batch.take(inproto)
        else:
            nproto = n
        c["packets_protocol"] += nproto
        if nproto == 0:
            return []
        where_zeros = None
        if self._divides:
            self._zeros = where_zeros = np.zeros(nproto, bool)
        if self.plan.predicate is not None:
            valid = np.asarray(self._eval(self.plan.predicate, batch), dtype=bool)
            if valid.shape != (nproto,):
                valid = np.broadcast_to(valid, (nproto,))
            valid = np.ascontiguousarray(valid)
            c["packets_where"] += int(np.count_nonzero(valid))
        else:
            self._grow(nproto)
            valid = self._ones[:nproto]     # never written: the kernels only read it
            c["packets_where"] += nproto
        if self._divides:
            self._zeros = np.zeros(nproto, bool)
            try:
                return self._aggregate(batch, valid)
            finally:
                self._count_zeros(where_zeros, valid)
        return self._aggregate(batch, valid)

    def _aggregate(self, batch: PacketBatch, valid: np.ndarray) -> list[pa.RecordBatch]:
        if not self.plan.patterns or self.engine is None:
            return self._aggregate_keys(batch, valid)
        # one pass of the kernel per grouping pattern over the same packets: a packet
        # updates one group per pattern (the loop is per batch, never per packet)
        out: list[pa.RecordBatch] = []
        try:
            for number in range(len(self.plan.patterns)):
                self._pattern = number
                out += self._aggregate_keys(batch, valid)
        finally:
            self._pattern = None
        return out

    def _aggregate_keys(self, batch: PacketBatch, valid: np.ndarray) -> list[pa.RecordBatch]:
        nproto = len(batch)
        if self.engine is None:
            return self._select(batch, valid)
        if self._flow is not None:
            assert isinstance(self.engine, FlowAggregator)   # a flow plan runs a flow table
            ends = np.zeros(nproto, bool)
            if self._flow.fin_rst:
                # FIN (0x01) or RST (0x04) of a TCP packet ends its flow
                ends = ((batch["layers"] & L_TCP) != 0) & ((batch["flags"] & 0x05) != 0)
            chunks = self.engine.append(batch["timestamp"], self._stack_keys(batch),
                                        self._args(batch), valid, ends)
        elif self._correct:
            return self._append_correcting(batch, valid)
        else:
            chunks = self.engine.append_prepared(
                np.ascontiguousarray(batch["timestamp"], dtype=np.int64),
                self._stack_keys(batch), self._args(batch), valid)
            if not chunks:
                return []
            if self._engine_holds:
                return self._to_arrow(chunks)   # held there: what comes is due now
        return self._to_arrow(chunks, hold=True)

    # --- late 'correct': the late partition -----------------------------------------------------
    def _append_correcting(self, batch: PacketBatch, valid: np.ndarray) -> list[pa.RecordBatch]:
        assert self.engine is not None   # late 'correct' needs a table (`process` checked)
        ts = batch["timestamp"]
        keys, args = self._stack_keys(batch), self._args(batch)
        late = None
        if self._in_punct is not None:
            late = valid & (ts < self._in_punct)
            if not late.any():
                late = None
        if late is None:
            return self._to_arrow(self.engine.append(ts, keys, args, valid))
        out = self._to_arrow(self.engine.append(ts, keys, args, valid & ~late))
        if self.late_engine is None:
            p, w = self.plan, self.plan.window
            assert w is not None   # a table implies a window
            self.late_engine = HashAggregator(
                self.layout, self.schema.nkeys, p.slots, pane_ns=w.pane_ns,
                offset_ns=w.offset_ns, flush="oop_lazy", max_disorder=p.max_disorder,
                probes=self.engine.probes)
        self._late_counts["late_corrected"] += int(np.count_nonzero(late))
        return out + self._to_arrow(self.late_engine.append(ts, keys, args, late), late=True)

    def _flush_late(self) -> list[pa.RecordBatch]:
        """Every entry of the late partition (each advancing punctuation and the end flush it:
        its rows are for windows the main table has already let go, or soon will)."""
        if self.late_engine is None or self.late_engine.counters["resident"] == 0:
            return []
        chunks, _ = self.late_engine.finish()
        return self._to_arrow(chunks, late=True)

    def _select(self, batch: PacketBatch, valid: np.ndarray) -> list[pa.RecordBatch]:
        ts = batch["timestamp"]
        if self._in_punct is not None:
            late = valid & (ts < self._in_punct)
            self._counts["late"] += int(np.count_nonzero(late))
            valid = valid & ~late
        if not valid.any():
            return []
        keys = self._stack_keys(batch)[valid]
        chunk = Partials(self.engine_window_ts(ts[valid]), keys, self.layout.empty_banks(len(keys)),
                         np.zeros(len(keys), np.uint8))
        return self._to_arrow([chunk], hold=True)

    @staticmethod
    def engine_window_ts(ts: np.ndarray) -> np.ndarray:
        """Selection queries put the packet timestamp (ns) in the `window` column."""
        return np.asarray(ts, np.int64)

    def _to_arrow(self, chunks: list[Partials], late: bool = False,
                  hold: bool = False) -> list[pa.RecordBatch]:
        chunks = [ch for ch in chunks if len(ch)]
        if self.hold_rows and not self._correct:
            self._held += chunks
            self._held_n += sum(len(ch) for ch in chunks)
            if hold and self._held_n < self.hold_rows:
                return []
            chunks = [Partials.concat(self._held, self.layout, self.schema.nkeys)] \
                if len(self._held) > 1 else self._held
            self._held, self._held_n = [], 0
        out = [self.schema.record_batch(ch) for ch in chunks]
        n = sum(b.num_rows for b in out)
        self._counts["rows_out"] += n
        if self._correct:
            # the marker column: every batch of a `correct` operator has it (one spool schema)
            out = [b.append_column(LATE_MARKER, pa.array(np.full(b.num_rows, int(late), np.int8)))
                   for b in out]
            if late:
                self._late_counts["late_rows_out"] += n
        return out

    def punctuate(self, p_ns: int) -> tuple[list[pa.RecordBatch], int | None]:
        """Input punctuation p (ns); returns partial rows and the new output punctuation
        (None when it did not advance)."""
        p_ns = int(p_ns)
        if self._in_punct is not None and p_ns <= self._in_punct:
            return [], None
        self._in_punct = p_ns
        if self.engine is None:
            return self._to_arrow([]), self._raise(p_ns)
        chunks, p = self.engine.punctuate(p_ns)
        rows = self._to_arrow(chunks)
        if self._correct:
            rows += self._flush_late()
        return rows, (None if p is None else self._raise(p))

    def _raise(self, p: int) -> int | None:
        if self._out_punct is None or p > self._out_punct:
            self._out_punct = p
            return p
        return None

    def finish(self) -> tuple[list[pa.RecordBatch], int]:
        """End of input: every entry flushed; the final punctuation (nothing follows it)."""
        if self.engine is None:
            final = self._in_punct if self._in_punct is not None else np.iinfo(np.int64).min
            self._out_punct = max(final, self._out_punct or final)
            return self._to_arrow([]), self._out_punct
        chunks, p = self.engine.finish()
        self._out_punct = p
        rows = self._to_arrow(chunks)
        if self._correct:
            rows += self._flush_late()
        return rows, p

    @property
    def punctuation(self) -> int | None:
        """The last punctuation this operator emitted."""
        return self._out_punct

    @property
    def adaptive_slots(self) -> int | None:
        """The slots of its adaptive table now (None: a fixed table, a flow table, none)."""
        e = self.engine
        return e.slots if isinstance(e, HashAggregator) and e.sizer is not None else None

    @property
    def counters(self) -> dict[str, int]:
        """packets_in, packets_protocol, packets_where, malformed, zero_divisors, late (dropped),
        late_corrected, late_rows_out, rows_out, evictions, flushed, final_rows,
        forced_full_flushes, windows, resident and rows per cause (the main table's;
        `rows_out` counts both)."""
        out = dict(self._counts)
        if self.engine is not None:
            e = self.engine.counters
            out["late"] = e.pop("late")
            e.pop("rows_out")
            out.update(e)
        out.update(self._late_counts)
        return out


def _link_strings(batch):
    """The intern table of a record batch's link (every string column shares it), or None."""
    tables = getattr(batch, "strings", None)
    return next(iter(tables.values()), None) if tables else None


def column_major(flat: np.ndarray, n: int, width: int) -> np.ndarray:
    """An [n, width] column-major view of the first n * width items of `flat`: each column
    is written whole by one contiguous copy (row-major, the copies strode by `width` words:
    a third of the flow low level's time)."""
    return flat[:n * width].reshape(width, n).T


def plan_read_columns(plan) -> tuple[str, ...] | None:
    """The physical packet columns a low-level plan's operator reads (for
    `open_capture(columns=...)`, which then decodes only those; `capture.payload.PAYLOAD`
    among them when it reads payloads), or None when it cannot tell (a callable
    expression)."""
    from capture.schema import PROTOCOLS

    if plan.record is not None:
        from dataclasses import replace

        from capture.recordsource import field_columns

        fields = {f.name: replace(f, columns=field_columns(f)) for f in plan.record.fields}
    else:
        fields = {f.name: f for p in PROTOCOLS.values() for f in p.fields}
    names = {"timestamp", "layers", "reason"}
    if plan.flow is not None and plan.flow.fin_rst:
        names.add("flags")
    exprs = [plan.predicate] + [k.expr for k in (*plan.keys, *plan.projections)]
    exprs += [s.arg for s in plan.subaggs]
    for e in exprs:
        if e is None:
            continue
        if not hasattr(e, "walk"):
            return None
        for node in e.walk():
            kind = type(node).__name__
            if kind == "Field" and node.columns:
                names.update(node.columns)
            elif kind in ("Field", "Column"):
                f = fields.get(node.name)
                if f is None:
                    if node.name in ("time", "timestamp_ms", "link"):
                        continue
                    return None
                names.update(f.columns)
    return tuple(sorted(names))
