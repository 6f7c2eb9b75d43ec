"""The spool between the levels: partial rows and punctuation as atomic Parquet files per link.

Layout: `ROOT/<query>/partials/<link>-<seq>.parquet`, one file per `SpoolWriter.write` call,
`seq` counting 0, 1, 2 ... per link. Every file holds the call's partial rows plus exactly one
*marker row* (`window` null) carrying `__link`, `__seq` and `__punct` (the link's punctuation
after this write, or null). Putting the punctuation in the same file as the partials it follows
makes the pair atomic; the sequence number lets the reader apply a link's punctuation only when
every earlier file of that link has been read (a directory listing racing a writer can return
file n+1 without file n).

Physical types are normalised so Spark (which has no unsigned types) reads every file with one
fixed schema: integers become int64 (uint64 by bit reinterpretation, so IP halves and bit masks
keep their bits), floats float64, and a fixed-size binary HyperLogLog register array of width m
becomes m int32 columns `name__r0 .. name__r<m-1>`.
Files whose names start with `.` are temporaries; Spark's file source ignores them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import SpoolError, os_error_text
from common.units import INT64_MAX

log = logging.getLogger(__name__)

LINK, SEQ, PUNCT = "__link", "__seq", "__punct"
META_COLUMNS = (LINK, SEQ, PUNCT)
#: extra marker columns of a spool fed by an inner join to a reader grouping by both sides'
#: times (highlevel.joint): the individual punctuation on the second time, and the joint
#: punctuation (a pair, both null until the join has one); PUNCT holds the first time's
JOINT_MARKERS = ("__punct2", "__joint1", "__joint2")
#: a data column of an aggregation's partial rows: true when the row is its (window, group)'s
#: only one from its link (lowlevel.finality); the footer counts them (FINAL_ROWS_KEY)
FINAL = "__final"
FINAL_ROWS_KEY = b"oopscope.final_rows"
#: the punctuation a link writes when its input has ended: every window can close
END_OF_INPUT = INT64_MAX
_NAME = re.compile(r"^(?P<link>.+)-(?P<seq>\d{12})\.parquet$")


def partials_dir(root: str | os.PathLike, query: str) -> Path:
    return Path(root) / query / "partials"


def spool_file_name(link: str, seq: int) -> str:
    # links are user names (files, interfaces): quote so any name is one safe path component
    return f"{quote(link, safe='')}-{seq:012d}.parquet"


def normalise_column(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """One column in its spool (Spark-readable) physical type. A chunked column stays
    chunked (the partial rows of one write come in many batches: combining them first would
    copy every column); uint64 is a view of the same bits."""
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([normalise_column(c) for c in array.chunks],
                                type=_spool_type(array.type))
    t = array.type
    if pa.types.is_uint64(t):
        if array.null_count:
            raise SpoolError("uint64 partial column with nulls cannot be reinterpreted as int64")
        return array.view(pa.int64())
    target = _spool_type(t)
    return array if target == t else array.cast(target)


def _spool_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.string()
    return t


def register_column(name: str, i: int) -> str:
    return f"{name}__r{i}"


def spool_columns(name: str, array) -> list[tuple[str, pa.Array]]:
    """The spool column(s) of one partial column: HyperLogLog registers (fixed-size binary)
    become one int32 column per register, so Spark combines them with plain `max` aggregates
    (higher-order functions over arrays are interpreted and cost seconds per micro-batch)."""
    if pa.types.is_fixed_size_binary(array.type):
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        m = array.type.byte_width
        if array.null_count:
            raise SpoolError(f"register column `{name}` has nulls")
        regs = np.frombuffer(array.buffers()[1], dtype=np.uint8,
                             count=(array.offset + len(array)) * m)[array.offset * m:]
        regs = regs.reshape(len(array), m)
        return [(register_column(name, i), pa.array(regs[:, i].astype(np.int32)))
                for i in range(m)]
    return [(name, normalise_column(array))]


#: Data rows of spool files kept in memory for a reader in the same process (a stage that
#: closes flow records on the driver, `highlevel.flowrecords`): it takes them from here instead
#: of decoding the file it was just written to. The file is written
#: all the same (Spark's file source lists it; other readers and restarts read it). At most
#: CACHE_BYTES are kept, the oldest dropped first; a query whose stage reads with Spark's
#: job says so (`not_kept`) and its rows are dropped.
CACHE_BYTES = 1 << 30
_CACHE: OrderedDict[str, tuple[str, pa.Table]] = OrderedDict()    # path -> (query, rows)
_CACHE_LOCK = threading.Lock()
_NOT_KEPT: set[str] = set()
_cached_bytes = 0


def _remember(path: Path, query: str, table: pa.Table) -> None:
    global _cached_bytes
    size = table.nbytes
    with _CACHE_LOCK:
        if size > CACHE_BYTES or query in _NOT_KEPT:
            return
        _CACHE[str(path)] = (query, table)
        _cached_bytes += size
        while _cached_bytes > CACHE_BYTES:
            _cached_bytes -= _CACHE.popitem(last=False)[1][1].nbytes


def cached_rows(path: str | os.PathLike, keep: bool = False) -> pa.Table | None:
    """The data rows of the spool file at `path` as written by this process (and forgets
    them unless `keep`: a batch computed ahead leaves them for the batch itself), or None
    when they are not kept."""
    global _cached_bytes
    with _CACHE_LOCK:
        entry = _CACHE.get(str(path)) if keep else _CACHE.pop(str(path), None)
        if entry is None:
            return None
        if not keep:
            _cached_bytes -= entry[1].nbytes
        return entry[1]


def not_kept(query: str) -> None:
    """The stage of `query` reads its spool files with Spark's job: keep none of its rows."""
    global _cached_bytes
    with _CACHE_LOCK:
        _NOT_KEPT.add(query)
        for path in [p for p, (q, _) in _CACHE.items() if q == query]:
            _cached_bytes -= _CACHE.pop(path)[1].nbytes


class SpoolWriter:
    """Writes one link's partial rows and punctuation for one query, one atomic file per call.

    The low-level driver calls `write(partials, punctuation)` after each flush. A writer
    restarted on the same spool continues the link's sequence numbers.

    `compression`: the Parquet codec. Snappy by default: a kept spool (`--spool`, the files
    of a live run, which are never pruned) is a third of the size. A bounded run's temporary
    spool is written and read once and then removed, so it goes uncompressed ("none"), which
    is much faster to write and to read. Column
    statistics are never written; nothing reads them (the footer carries the markers).
    `keep_in_memory`: each file's data rows stay in memory for `cached_rows`.
    """

    def __init__(self, root: str | os.PathLike, query: str, link: str, *, fsync: bool = True,
                 compression: str = "snappy", keep_in_memory: bool = False):
        self.query, self.link, self.fsync = query, link, fsync
        self.compression = compression
        self.keep_in_memory = keep_in_memory     # see `cached_rows`
        self.dir = partials_dir(root, query)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.seq = self._next_seq()
        self.last_punctuation: int | None = None
        self.rows_written = 0

    def _next_seq(self) -> int:
        prefix = quote(self.link, safe="") + "-"
        seqs = [int(m["seq"]) for name in os.listdir(self.dir)
                if name.startswith(prefix) and (m := _NAME.match(name))
                and m["link"] == quote(self.link, safe="")]
        return max(seqs) + 1 if seqs else 0

    def write(self, partials: list[pa.RecordBatch] | pa.RecordBatch | pa.Table | None,
              punctuation: int | None = None, markers: dict | None = None) -> Path:
        """Write partial rows and (optionally) the link's new punctuation as one file.

        `punctuation` p promises that no later partial row of this link has a window ending at
        or before p. A smaller or equal value than the last one carries no information (kept
        in the file, ignored by the reader's Meld). `markers`: further int64 marker columns
        (name -> value or None, e.g. `JOINT_MARKERS`), null on the data rows.
        """
        table = self._table(partials)
        n = table.num_rows
        marker_punct = None if punctuation is None else int(punctuation)
        # the data rows and the marker row go in as two row groups of one file: no copy of
        # the data columns to append the marker row
        data = {LINK: pa.repeat(self.link, n), SEQ: pa.array(np.full(n, self.seq, np.int64)),
                PUNCT: pa.nulls(n, pa.int64())}
        marker = {LINK: pa.array([self.link]), SEQ: pa.array([self.seq], pa.int64()),
                  PUNCT: pa.array([marker_punct], pa.int64())}
        for name, value in (markers or {}).items():
            data[name] = pa.nulls(n, pa.int64())
            marker[name] = pa.array([None if value is None else int(value)], pa.int64())
        for name in table.column_names:
            for out_name, col in spool_columns(name, table.column(name)):
                data[out_name] = col
                marker[out_name] = pa.nulls(1, col.type)     # null in every data column
        if "window" not in data:
            data["window"] = pa.nulls(n, pa.int64())
            marker["window"] = pa.nulls(1, pa.int64())
        out, last = pa.table(data), pa.table(marker)
        meta = dict(table.schema.metadata or {})
        meta.update({b"oopscope.query": self.query.encode(), b"oopscope.link": self.link.encode()})
        # the markers again, in the footer: a stage reads them without a Spark job
        # (highlevel.batchfiles); the min window tells it no row of the file can be late
        windows = data["window"]
        low = pc.min(windows).as_py() if n and windows.null_count < n else None
        meta.update({b"oopscope.punct": b"" if marker_punct is None else b"%d" % marker_punct,
                     b"oopscope.rows": b"%d" % n,
                     b"oopscope.min_window": b"" if low is None else b"%d" % low})
        if FINAL in data:
            meta[FINAL_ROWS_KEY] = b"%d" % (pc.sum(data[FINAL]).as_py() or 0)
        out = out.replace_schema_metadata(meta)
        path = self.dir / spool_file_name(self.link, self.seq)
        tmp = self.dir / f".{path.name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                # no dictionary pages: partial columns are mostly distinct values, and trying
                # a dictionary first cost a third of the write
                with pq.ParquetWriter(fh, out.schema, use_dictionary=False,
                                      compression=self.compression,
                                      write_statistics=False) as writer:
                    if n:
                        writer.write_table(out)
                    writer.write_table(last.cast(out.schema))
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
            if self.fsync:
                _fsync_dir(self.dir)
        except OSError as exc:     # a full or read-only disk (pyarrow's IO errors are OSErrors)
            # no temporary left behind; the file itself is either whole or absent
            try:
                tmp.unlink(missing_ok=True)
            except OSError as gone:
                log.debug("cannot remove the spool temporary %s: %s", tmp, gone)
            raise SpoolError(f"cannot write the spool file {path}: {os_error_text(exc)}") \
                from None
        if self.keep_in_memory and n:
            _remember(path, self.query, out)
        self.seq += 1
        self.rows_written += n
        if punctuation is not None:
            self.last_punctuation = marker_punct
        return path

    def _table(self, partials) -> pa.Table:
        if partials is None:
            return pa.table({})
        if isinstance(partials, pa.RecordBatch):
            partials = [partials]
        if isinstance(partials, pa.Table):
            table = partials
        else:
            batches = [b for b in partials if b is not None]
            if not batches:
                return pa.table({})
            schemas = {b.schema.remove_metadata() for b in batches}
            if len(schemas) > 1:
                raise SpoolError(f"query {self.query!r} link {self.link!r}: partial batches of "
                                 f"one write differ in schema: {[str(s) for s in schemas]}")
            table = pa.Table.from_batches(batches)
        meta = table.schema.metadata or {}
        query = meta.get(b"oopscope.query", meta.get(b"query"))
        if query is not None and query.decode() != self.query:
            raise SpoolError(f"partial rows of query {query.decode()!r} written to the spool of "
                             f"query {self.query!r} (link {self.link!r})")
        if table.num_rows and "window" not in table.column_names:
            raise SpoolError(f"query {self.query!r} link {self.link!r}: partial rows have no "
                             f"`window` column (columns: {table.column_names})")
        return table


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_spool_name(name: str) -> tuple[str, int] | None:
    """(link, seq) of a spool file name, or None when it is not one."""
    m = _NAME.match(name)
    return (unquote(m["link"]), int(m["seq"])) if m else None


def list_spool(root: str | os.PathLike, query: str) -> list[tuple[str, int, Path]]:
    """(link, seq, path) of every committed spool file of a query, in (link, seq) order."""
    d = partials_dir(root, query)
    if not d.is_dir():
        return []
    out = []
    for name in os.listdir(d):
        named = parse_spool_name(name)
        if named:
            out.append((*named, d / name))
    return sorted(out)


def read_spool(root: str | os.PathLike, query: str, schema: pa.Schema | None = None) -> pa.Table:
    """Every committed file of a query as one Arrow table (marker rows included); for tests,
    debugging and batch (non-streaming) use."""
    files = list_spool(root, query)
    if not files:
        if schema is None:
            raise SpoolError(f"spool of query {query!r} under {root} is empty")
        return schema.empty_table()
    tables = [pq.read_table(p) for _, _, p in files]
    if schema is not None:
        tables = [t.select(schema.names).cast(schema) for t in tables]
    return pa.concat_tables(tables, promote_options="permissive")


def prune_applied(root: str | os.PathLike, query: str,
                  applied: dict[str, int]) -> tuple[int, int]:
    """Remove the spool files of `query` that a stage has read and committed: per link, those
    of sequence below `applied[link]` (the next it applies), but the newest of them and the
    newest carrying a punctuation, which `last_punctuations` (a resumed run, a restarted
    server or agent) and a restarted writer's sequence read. A served query's spool would
    otherwise grow for as long as it runs (a 10-s window of 260K groups: ~8 MB of Parquet).
    Returns the files and the data rows removed."""
    by_link: dict[str, list[tuple[int, Path]]] = {}
    for link, seq, path in list_spool(root, query):
        if seq < applied.get(link, 0):
            by_link.setdefault(link, []).append((seq, path))
    files = rows = 0
    for items in by_link.values():
        items.sort()
        metas = {}
        for seq, path in reversed(items):
            metas[seq] = pq.read_schema(path).metadata or {}
            if metas[seq].get(b"oopscope.punct", b""):
                break
        # the newest, and the newest punctuated (the last one read above)
        keep = {items[-1][0], min(metas)}
        for seq, path in items:
            if seq in keep:
                continue
            if seq not in metas:
                metas[seq] = pq.read_schema(path).metadata or {}
            cached_rows(path)                  # its rows kept in memory, if any, go too
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            files += 1
            rows += int(metas[seq].get(b"oopscope.rows", b"0") or 0)
    return files, rows


def last_punctuations(root: str | os.PathLike, query: str) -> dict[str, tuple[int, int | None]]:
    """Per link of a query's spool: (its last file's sequence number, the last punctuation
    its files carry, None when none carries one), from the footers (no data is read). A run
    resumed over a kept spool continues each link from there; the appliance reports the gap
    from there."""
    out: dict[str, tuple[int, int | None]] = {}
    by_link: dict[str, list[tuple[int, Path]]] = {}
    for link, seq, path in list_spool(root, query):
        by_link.setdefault(link, []).append((seq, path))
    for link, files in by_link.items():
        files.sort()
        punct = None
        for _, path in reversed(files):
            value = (pq.read_schema(path).metadata or {}).get(b"oopscope.punct", b"")
            if value:
                punct = int(value)
                break
        out[link] = (files[-1][0], punct)
    return out
