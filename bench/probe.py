"""Robustness probe: damaged captures through `oopscope decode` (beside tshark), mutated queries
through `oopscope explain` (and a few through `oopscope run`), and disk faults under `oopscope run`.

    python -m bench.probe [--captures 282] [--queries 511] [--run 3] [--seed 25] [--jobs 2]
                          [--pcaps ../shared/pcaps] [--sections captures,queries,faults]
                          [--dir DIR] [--json probe.json]

Rerunnable and deterministic: the corpus is derived from a seed.
- Damaged captures: seeded damage (truncation, bytes flipped in a record header or in packet
  data, a broken file or section header, a wrong or huge record / block length, a splice of two
  files, a zeroed, random, duplicated or inserted run of bytes, timestamps far off, several of
  these at once) to the real captures of --pcaps (a generated pcap and its pcapng copy when
  that folder is absent). Each file is decoded by `oopscope decode` in a fresh process and
  read by tshark: tracebacks, hangs (--timeout), deaths by a signal, non-zero exits without a
  one-line `oopscope: error:` message, and the packets of each beside tshark's.
- Mutated queries: seeded edits of the shipped queries and the tests' golden queries (the
  token and limit edits of the query fuzz tests, plus unicode, punctuation, comments, bad
  encodings), through `oopscope explain` in a worker process (killed and restarted on a hang):
  tracebacks, hangs, accepted, refused. With --run N, N accepted ones also go through
  `oopscope run` over a small generated capture.
- Disk faults: `oopscope run` writing its output or spool on a full or read-only tmpfs (mounted
  with the disk fault tests' helper: root only, else skipped), into a directory, and into a
  directory that does not exist. Each must exit non-zero with one line naming the path.

Every input that fails a check is copied to a fresh directory (printed) with its command line,
so it can be rerun by hand. Prints the report; --json writes it with every case. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from bench.workloads import REPO, cli, kept_capture, work_dir
from common import settings

log = logging.getLogger("bench.probe")

SHB = 0x0A0D0D0A
NG_MAGIC = b"\x0a\x0d\x0d\x0a"
Order = Literal["little", "big"]
UNSUPPORTED = "unsupported link type"
FIELD = "len"                          # the one column decode prints: its header line is "len"


# --- outcomes -------------------------------------------------------------------------------------

def outcome(code: int | None, stderr: str, *, one_line: bool = True) -> str:
    """ok | refused (non-zero, one `oopscope: error:` line; any number when not `one_line`) |
    traceback | hang (code None) | signal | unclear (non-zero without such a message)."""
    if code is None:
        return "hang"
    if "Traceback" in stderr or "py4j" in stderr:
        return "traceback"
    if code < 0:
        return "signal"
    if code == 0:
        return "ok"
    errors = [x for x in stderr.strip().splitlines() if not x.startswith("oopscope: warning: ")]
    if errors and errors[0].startswith(("oopscope: error: ", "Usage: ")) and (len(errors) == 1 or not one_line):
        return "refused"
    return "unclear"


def run_command(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None on a timeout, stdout, stderr) of a fresh process; on a timeout its
    whole session (a run's Spark JVM too) is killed."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def shell_line(argv: list[str]) -> str:
    """The command as one would type it in the repository (where the probe runs it)."""
    return " ".join(shlex.quote(a) for a in (["python"] + argv[1:] if argv[0] == sys.executable else argv))


# --- damaged captures ---------------------------------------------------------------------------

def capture_sources(pcaps: Path, workdir: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of the captures to damage: --pcaps, else a generated pcap and its pcapng."""
    if pcaps.is_dir():
        found = sorted(p for p in pcaps.iterdir() if p.suffix in {".pcap", ".pcapng", ".cap"})
        if found:
            return [(p.name, p.read_bytes()) for p in found]
    log.warning("no captures in %s: damaging a generated one instead", pcaps)
    gen = kept_capture(workdir / "source.pcap", "probe source 3000",
                       lambda p: subprocess.run(cli("gen", str(p), "-n", "3000", "--duration", "10s",
                                                    "--ipv6", "0.2", "-q"), cwd=REPO, check=True))
    out = [(gen.name, gen.read_bytes())]
    if shutil.which("editcap"):
        ng = workdir / "source.pcapng"
        subprocess.run(["editcap", "-F", "pcapng", str(gen), str(ng)], check=True)
        out.append((ng.name, ng.read_bytes()))
    return out


def records(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, header length, total length) of every record (pcap) or block (pcapng) the
    intact framing gives, up to the first impossible length."""
    out: list[tuple[int, int, int]] = []
    order: Order = "little"
    if data[:4] == NG_MAGIC:
        pos = 0
        while pos + 12 <= len(data):
            if data[pos:pos + 4] == NG_MAGIC:
                order = "big" if data[pos + 8:pos + 12] == b"\x1a\x2b\x3c\x4d" else "little"
            btype = int.from_bytes(data[pos:pos + 4], order)
            blen = int.from_bytes(data[pos + 4:pos + 8], order)
            if blen < 12 or blen % 4:
                break
            out.append((pos, {SHB: 24, 1: 16, 6: 28, 3: 12}.get(btype, 8), blen))
            pos += blen
        return out
    order = "little" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else "big"
    pos = 24
    while pos + 16 <= len(data):
        caplen = int.from_bytes(data[pos + 8:pos + 12], order)
        out.append((pos, 16, 16 + caplen))
        pos += 16 + caplen
    return out


CAPTURE_KINDS = ("truncate", "truncate-in-record", "record-header", "packet-data", "file-header",
                 "section", "length", "huge-length", "splice", "zero", "random-run", "duplicate",
                 "insert", "timestamp", "several")


def damage(data: bytes, other: bytes, kind: str, rnd: random.Random) -> bytes:
    """`data` with one kind of damage (`other`: a second capture, for splices)."""
    if not data:
        return data
    # the records whose header the (perhaps already damaged) data holds, clipped to its end
    recs = [(p, min(h, len(data) - p), min(t, len(data) - p)) for p, h, t in records(data)
            if p + h <= len(data)] or [(0, min(24, len(data)), len(data))]
    d = bytearray(data)
    pos, hlen, total = rnd.choice(recs)
    big = data[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d") or data[8:12] == b"\x1a\x2b\x3c\x4d"
    order: Order = "big" if big else "little"
    ng = data[:4] == NG_MAGIC
    length_at = pos + 4 if ng else pos + 8        # a pcapng block's, a pcap record's length
    if kind == "several":
        for k in rnd.sample(CAPTURE_KINDS[:-1], rnd.randint(2, 4)):
            d = bytearray(damage(bytes(d), other, k, rnd))
        return bytes(d)
    if kind == "truncate":
        return data[:rnd.randrange(len(data))]
    if kind == "truncate-in-record":
        return data[:pos + rnd.randrange(max(1, min(total, hlen + 8)))]
    if kind == "record-header":
        for _ in range(rnd.randint(1, 3)):
            d[pos + rnd.randrange(hlen)] ^= 1 << rnd.randrange(8)
    elif kind == "packet-data":
        for p, h, t in rnd.sample(recs, min(len(recs), 20)):
            if t > h:
                d[p + h + rnd.randrange(t - h)] = rnd.randrange(256)
    elif kind == "file-header":
        d[rnd.randrange(min(28, len(d)))] = rnd.randrange(256)
    elif kind == "section":      # a pcapng section header or interface description; a pcap's header
        heads = [(p, t) for p, _, t in recs if data[p:p + 4] == NG_MAGIC or
                 int.from_bytes(data[p:p + 4], order) == 1] if ng else [(0, 24)]
        p, t = rnd.choice(heads or [(0, 24)])
        at = p + rnd.randrange(4, max(5, min(t, 32)))
        d[at:at + 2] = rnd.randbytes(2)
    elif kind in ("length", "huge-length"):
        if kind == "length":
            value = rnd.choice([0, 1, 7, 13, 4095, rnd.randrange(2000), rnd.randrange(70_000),
                                rnd.randrange(300_000), rnd.randrange(1 << 32)])
        else:
            value = rnd.choice([0xFFFF_FFFF, 0xFFFF_FFF0, 0x8000_0000, 0x7FFF_FFFF, 1 << 24])
        at = rnd.choice([length_at, pos + 20]) if ng and total >= 28 else length_at
        d[at:at + 4] = value.to_bytes(4, rnd.choice([order, order, "little", "big"]))
        if not ng and rnd.random() < 0.5:
            d[pos + 12:pos + 16] = value.to_bytes(4, order)
    elif kind == "splice":
        cut = pos if rnd.random() < 0.5 else rnd.randrange(len(data))
        orecs = records(other)
        start = rnd.choice(orecs)[0] if orecs and rnd.random() < 0.5 else rnd.randrange(len(other))
        return data[:cut] + other[start:]
    elif kind in ("zero", "random-run"):
        at, n = rnd.randrange(len(d)), rnd.choice([1, 4, 16, 100, 1000, 4096])
        d[at:at + n] = bytes(n) if kind == "zero" else rnd.randbytes(n)
    elif kind == "duplicate":
        a = rnd.randrange(len(d))
        b = min(len(d), a + rnd.randrange(1, 5000))
        return data[:b] + data[a:b] + data[b:]
    elif kind == "insert":
        return data[:pos] + rnd.randbytes(rnd.randint(1, 7)) + data[pos:]
    elif kind == "timestamp":
        for p, _, _ in rnd.sample(recs, min(len(recs), 3)):
            at = p + (12 if ng else 0)
            d[at:at + 4] = rnd.choice([0, 0xFFFF_FFFF, rnd.randrange(1 << 32)]).to_bytes(4, order)
    return bytes(d)


def tshark_packets(path: Path, timeout: float) -> int | None:
    """Frames tshark reads (it stops at damage; a file it cannot read shows as a MIME frame)."""
    try:
        res = subprocess.run(["tshark", "-n", "-r", str(path), "-T", "fields", "-e", "frame.protocols"],
                             capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return None
    return sum(1 for line in res.stdout.splitlines() if not line.startswith("mime_dlt"))


def check_capture(case: dict, timeout: float) -> dict:
    argv = cli("decode", case["path"], "--fields", FIELD)
    start = time.monotonic()
    code, out, err = run_command(argv, timeout)
    lines = out.splitlines()
    case.update(command=shell_line(argv), code=code, seconds=round(time.monotonic() - start, 2),
                outcome=outcome(code, err), stderr=err.strip()[-3000:],
                packets=len(lines) - 1 if lines[:1] == [FIELD] else 0)
    case["tshark"] = tshark_packets(Path(case["path"]), timeout) if shutil.which("tshark") else None
    return case


def probe_captures(args, workdir: Path) -> dict:
    rnd = random.Random(args.seed)
    sources = capture_sources(Path(args.pcaps), workdir)
    corpus = workdir / "captures"
    corpus.mkdir(exist_ok=True)
    cases = []
    for i in range(args.captures):
        kind = CAPTURE_KINDS[i % len(CAPTURE_KINDS)]
        name, data = rnd.choice(sources)
        _, other = rnd.choice(sources)
        path = corpus / f"{i:03d}-{kind}-{name}"
        path.write_bytes(damage(data, other, kind, rnd))
        cases.append({"case": i, "kind": kind, "source": name, "path": str(path)})
    log.info("decoding %d damaged captures (%d sources), %d at a time", len(cases), len(sources), args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        done = []
        for k, case in enumerate(pool.map(lambda c: check_capture(c, args.timeout), cases), 1):
            done.append(case)
            if k % 50 == 0:
                log.info("  %d/%d captures", k, len(cases))
    counted = [c for c in done if c["tshark"] is not None]
    differ = [c for c in counted if c["packets"] != c["tshark"]]
    return {"files": len(done), "sources": len(sources), "outcomes": dict(Counter(c["outcome"] for c in done)),
            "packets": sum(c["packets"] for c in counted), "tshark": sum(c["tshark"] for c in counted),
            "differ": len(differ), "more": sum(c["packets"] > c["tshark"] for c in differ),
            "fewer": sum(c["packets"] < c["tshark"] for c in differ),
            "fewer_packets": sum(c["tshark"] - c["packets"] for c in differ if c["packets"] < c["tshark"]),
            # tshark knows more link types: a damaged header can name one it reads and we refuse
            "fewer_link_type": sum(c["packets"] < c["tshark"] and UNSUPPORTED in c["stderr"] for c in differ),
            "cases": done}


# --- mutated queries ----------------------------------------------------------------------------

def query_sources() -> list[tuple[str, str]]:
    """(name, text) of the shipped queries and the tests' golden and high-level queries."""
    paths = sorted(REPO.glob("queries/library/*.gsql")) + sorted(REPO.glob("tests/**/*.gsql"))
    return [(str(p.relative_to(REPO)), p.read_text()) for p in paths]


QUERY_KINDS = ("tokens", "limits", "limits", "unicode", "punctuation", "literal", "comment",
               "encoding", "repeat", "several")
UNICODE = ["é", "λ", "\u200b", "\ufeff", "\u202e", "𝕏", "\x00", "\u00a0", "ß", "ﬁ", "٣", "\u2028", "🙂"]
PUNCT = list("()[]{},;.*/+-%<>=!~|&^@#$?:\\'\"`")


def mutate_query(text: str, kind: str, rnd: random.Random) -> str | bytes:
    """One kind of edit of a query file (bytes: a file that is not UTF-8)."""
    from tests.queries.test_queries_fuzz import hostile
    from tests.queries.test_queries_mutation import mutate

    at = rnd.randrange(len(text) + 1)
    if kind == "several":
        for k in rnd.sample(QUERY_KINDS[:-2], rnd.randint(2, 3)):
            edited = mutate_query(text, k, rnd)
            text = edited.decode("utf-8", "replace") if isinstance(edited, bytes) else edited
        return text
    if kind == "tokens":
        return mutate(text, rnd)
    if kind == "limits":
        return hostile(text, rnd)
    if kind == "unicode":
        names = list(re.finditer(r"\b[A-Za-z_]\w*\b", text))
        if names and rnd.random() < 0.5:
            m = rnd.choice(names)
            return text[:m.end()] + rnd.choice(UNICODE) * rnd.choice([1, 3, 300]) + text[m.end():]
        return text[:at] + "".join(rnd.choices(UNICODE, k=rnd.randint(1, 8))) + text[at:]
    if kind == "punctuation":
        return text[:at] + "".join(rnd.choices(PUNCT, k=rnd.randint(1, 12))) + text[at:]
    if kind == "literal":
        value = rnd.choice([str(2**64), str(2**80), str(-2**63 - 1), "1" * 5000, "0x" + "f" * 40,
                            "1e999", "'" + "x" * 100_000 + "'", "'\\'", "IP_VAL '999.1.1.1'",
                            "IPV6_VAL '::g'", "1 / 0", "(0 % 0)", "$nope", str(2**64) + " / 0"])
        numbers = list(re.finditer(r"(?<![\w$.])\d+(?![\w.])", text))
        if numbers:
            m = rnd.choice(numbers)
            return text[:m.start()] + value + text[m.end():]
        return text[:at] + value + text[at:]
    if kind == "comment":
        return text[:at] + rnd.choice(["--", "/*", "*/", "//", "-- é\n", "/* " * 50, "\r", "\r\n"]) + text[at:]
    if kind == "encoding":
        raw = text.encode()
        cut = rnd.randrange(len(raw) + 1)
        return raw[:cut] + rnd.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x00" * 4]) + raw[cut:]
    # repeat: the whole file twice (queries of the same name), or a clause many times
    if rnd.random() < 0.4:
        return text + "\n" + text
    clause = rnd.choice(["WHERE", "GROUP BY", "HAVING", "SELECT"])
    return text.replace(clause, f"{clause} " * rnd.choice([2, 100]), 1)


class ExplainWorker:
    """`oopscope explain` in one long-lived worker process (`--explain-worker`): answers as
    fast as in-process, while a hang or a crash takes only the worker (killed by its id and
    started again)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def ask(self, argv: list[str], timeout: float) -> tuple[int | None, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.probe", "--explain-worker"], cwd=REPO,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            reply = json.loads(line)
            return reply["code"], reply["stderr"]
        self.close()
        return (None, "") if not ready else (-1, "the worker died")

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


def explain_worker() -> None:
    """The worker's loop: one JSON argv a line in, one JSON {code, stderr} a line out; an
    exception out of the command is a traceback, as it would be in `oopscope`'s process."""
    import io
    import traceback

    from tools.cli import main as oopscope

    class ToCurrentStderr(logging.Handler):   # what each command logs goes with its stderr
        def emit(self, record: logging.LogRecord) -> None:
            sys.stderr.write(self.format(record) + "\n")

    handler = ToCurrentStderr()
    handler.setFormatter(logging.Formatter("oopscope: %(levelname)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)      # nothing stray on the replies' pipe
    for line in sys.stdin:
        err = io.StringIO()
        code: int | None = 0
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                oopscope(json.loads(line))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except BaseException:        # noqa: B036 - anything else is what the probe looks for
                err.write(traceback.format_exc())
                code = 1
        replies.write(json.dumps({"code": code, "stderr": err.getvalue()}) + "\n")
        replies.flush()


def probe_queries(args, workdir: Path) -> dict:
    rnd = random.Random(args.seed)
    sources = query_sources()
    corpus = workdir / "queries"
    corpus.mkdir(exist_ok=True)
    worker = ExplainWorker()
    cases: list[dict[str, Any]] = []
    try:
        for i in range(args.queries):
            kind = QUERY_KINDS[i % len(QUERY_KINDS)]
            name, text = rnd.choice(sources)
            edited = mutate_query(text, kind, rnd)
            path = corpus / f"{i:03d}-{kind}-{Path(name).name}"
            path.write_bytes(edited if isinstance(edited, bytes) else edited.encode("utf-8", "surrogatepass"))
            argv = ["explain", str(path)]
            start = time.monotonic()
            code, err = worker.ask(argv, args.timeout)
            first = err.strip().splitlines()[:1]
            cases.append({"case": i, "kind": kind, "source": name, "path": str(path), "code": code,
                          "command": shell_line(cli(*argv)), "seconds": round(time.monotonic() - start, 3),
                          "outcome": outcome(code, err, one_line=False), "stderr": err.strip()[-3000:],
                          "located": bool(first and re.match(r"oopscope: error: (.+:\d+:\d+: |\d+ errors:)",
                                                             first[0]))})
            if (i + 1) % 100 == 0:
                log.info("  %d/%d queries", i + 1, args.queries)
    finally:
        worker.close()
    refused = [c for c in cases if c["outcome"] == "refused"]
    result = {"files": len(cases), "sources": len(sources), "outcomes": dict(Counter(c["outcome"] for c in cases)),
              "unreadable": sum("cannot read the query file" in c["stderr"] for c in refused),
              "refused_unlocated": sum(not c["located"] and "cannot read the query file" not in c["stderr"]
                                       for c in refused), "cases": cases, "runs": []}
    if args.run:
        result["runs"] = run_accepted([c for c in cases if c["outcome"] == "ok"], args, workdir)
    return result


def small_capture(workdir: Path) -> Path:
    """The capture the runs read: 50K packets over 2 minutes, 2000 (srcIP, destIP) groups."""
    return kept_capture(workdir / "run.pcap", "probe run 50k 120s 2000",
                        lambda p: subprocess.run(cli("gen", str(p), "-n", "50k", "--duration", "120s",
                                                     "--groups", "2000", "-q"), cwd=REPO, check=True))


def run_accepted(accepted: list[dict], args, workdir: Path) -> list[dict]:
    """`oopscope run` of --run accepted queries, spread over the accepted ones."""
    from queries.explain import mentioned_links
    from queries.parser import parse

    pcap = small_capture(workdir)
    chosen = accepted[::max(1, len(accepted) // args.run)][:args.run]
    runs = []
    for case in chosen:
        text = Path(case["path"]).read_text(errors="replace")
        links = mentioned_links(parse(text, path=case["path"])) or ["main"]
        argv = cli("run", case["path"], *[a for link in links for a in ("--link", f"{link}={pcap}")])
        log.info("  run of %s", Path(case["path"]).name)
        code, _, err = run_command(argv, args.run_timeout)
        runs.append({"case": case["case"], "path": case["path"], "command": shell_line(argv), "code": code,
                     "outcome": outcome(code, err), "stderr": err.strip()[-3000:]})
    return runs


# --- disk faults --------------------------------------------------------------------------------

FAULTS = ("output on a full file system", "output on a read-only file system", "spool on a full disk",
          "spool on a read-only dir", "output path is a directory", "output in a non-existent dir")


def fault_case(name: str, d: Path, base: list[str], timeout: float) -> dict:
    """One fault: `oopscope run` must exit non-zero with one line naming the path."""
    import pytest

    from tests.tools.test_tools_run_disk_faults import tmpfs

    with contextlib.ExitStack() as stack:
        place = Path(tempfile.mkdtemp(dir=d))
        try:
            if "full" in name or "read-only" in name:
                place = stack.enter_context(tmpfs(place, "256k", ro="read-only" in name))
        except pytest.skip.Exception as why:
            return {"fault": name, "outcome": "skipped", "why": str(why)}
        out = place / "out.csv"
        extra = ["--output", f"flows={out}"]
        named = out
        if name.startswith("spool"):
            named = place / "spool"
            extra = ["--output", f"flows={Path(tempfile.mkdtemp(dir=d)) / 'out.csv'}", "--spool", str(named)]
        elif "directory" in name:
            out.mkdir()
        elif "non-existent" in name:
            named = place / "missing"
            extra = ["--output", f"flows={named / 'out.csv'}"]
        argv = cli(*base, *extra)
        code, _, err = run_command(argv, timeout)
    lines = err.strip().splitlines()
    result = outcome(code, err)
    if result == "refused" and str(named) not in lines[0]:
        result = "unclear"                    # one line, but not naming the path
    if len(lines) > 1 and result != "hang":
        result = "traceback"                  # more than one line (Spark's log, a stack) counts too
    return {"fault": name, "command": shell_line(argv), "code": code, "outcome": result,
            "stderr": err.strip()[-3000:]}


def probe_faults(args, workdir: Path) -> dict:
    from tests.tools.test_tools_run_disk_faults import QUERY

    d = workdir / "faults"
    d.mkdir(exist_ok=True)
    query = d / "flows.gsql"
    query.write_text(QUERY)
    base = ["run", str(query), "--link", f"main={small_capture(workdir)}"]
    cases = []
    for name in FAULTS:
        log.info("  fault: %s", name)
        cases.append(fault_case(name, d, base, args.run_timeout))
    return {"cases": cases, "outcomes": dict(Counter(c["outcome"] for c in cases))}


# --- the report ---------------------------------------------------------------------------------

BAD = ("traceback", "hang", "signal", "unclear")


def counts(outcomes: dict) -> str:
    return ", ".join(f"{outcomes.get(k, 0)} {k}s" if k != "unclear" else
                     f"{outcomes.get(k, 0)} non-zero exits without a one-line message" for k in BAD)


def first_line(case: dict) -> str:
    """The line of a case's stderr that says the most: an exception's, else the first message
    (without the path of the damaged file, which the listing names)."""
    lines = [x for x in case.get("stderr", "").splitlines() if x.strip()]
    if "Traceback" in case.get("stderr", ""):
        return next((x for x in reversed(lines) if re.match(r"\w+(Error|Exception)\b", x)), lines[-1])[:200]
    return re.sub(r"^(oopscope: \w+: )\S+?: (byte \d+)", r"\1\2", lines[0] if lines else "")[:200]


def report(results: dict, top: int) -> str:
    out = [f"oopscope robustness probe, seed {results['seed']}, {results['seconds']:.0f} s "
           f"(commands run in {REPO})"]
    if "captures" in results:
        c = results["captures"]
        out.append(f"damaged captures: {c['files']} files (from {c['sources']} captures), {counts(c['outcomes'])}; "
                   f"{c['outcomes'].get('refused', 0)} refused with one line, {c['outcomes'].get('ok', 0)} read; "
                   f"packets {c['packets']} vs tshark {c['tshark']} ({c['differ']} files differ: {c['more']} more, "
                   f"{c['fewer']} fewer by {c['fewer_packets']} packets, {c['fewer_link_type']} of them refused "
                   f"as an {UNSUPPORTED} tshark reads)")
        diffs = sorted((x for x in c["cases"] if x["tshark"] is not None and x["packets"] != x["tshark"]),
                       key=lambda x: (x["packets"] >= x["tshark"], -abs(x["packets"] - x["tshark"])))
        if diffs:
            out.append(f"  differences from tshark (fewer first, then the largest; {top} shown):")
        for x in diffs[:top]:
            out.append(f"    {x['packets'] - x['tshark']:+7d}  {Path(x['path']).name}: ours {x['packets']}, "
                       f"tshark {x['tshark']}  {first_line(x)[:120]}")
    if "queries" in results:
        q = results["queries"]
        out.append(f"mutated queries: {q['files']} files (from {q['sources']} queries), {counts(q['outcomes'])}; "
                   f"{q['outcomes'].get('ok', 0)} accepted, {q['outcomes'].get('refused', 0)} refused "
                   f"({q['unreadable']} not UTF-8, {q['refused_unlocated']} others without a line:column)")
        if q["runs"]:
            out.append(f"  run of {len(q['runs'])} accepted: "
                       f"{counts(dict(Counter(r['outcome'] for r in q['runs'])))}; "
                       f"{sum(r['outcome'] == 'ok' for r in q['runs'])} ok")
    if "faults" in results:
        f = results["faults"]
        out.append(f"fault cases: {len(f['cases'])} cases, {f['outcomes'].get('traceback', 0)} with tracebacks, "
                   f"{f['outcomes'].get('refused', 0)} one line naming the path, "
                   f"{f['outcomes'].get('skipped', 0)} skipped, {f['outcomes'].get('hang', 0)} hangs, "
                   f"{f['outcomes'].get('unclear', 0) + f['outcomes'].get('ok', 0)} other")
        for x in f["cases"]:
            said = "one line naming the path" if x["outcome"] == "refused" else x["outcome"]
            out.append(f"    {x['fault']}: {said}: {x.get('why') or first_line(x)}")
    failures = results.get("failures", [])
    if failures:
        out.append(f"failures ({len(failures)}), inputs kept in {results['repro_dir']}:")
        for x in failures:
            out.append(f"  [{x['outcome']}] {x['command']}\n      {first_line(x)}")
    return "\n".join(out)


def keep_failures(results: dict) -> None:
    """Copy every input that failed a check to a fresh directory kept after the run."""
    bad = [x for s in ("captures", "queries") for x in results.get(s, {}).get("cases", []) if x["outcome"] in BAD]
    bad += [x for x in results.get("captures", {}).get("cases", [])
            if x["tshark"] is not None and x["packets"] < x["tshark"] and x["outcome"] not in BAD
            and UNSUPPORTED not in x["stderr"]]
    bad += [x for x in results.get("queries", {}).get("runs", []) if x["outcome"] in BAD]
    bad += [x for x in results.get("faults", {}).get("cases", []) if x["outcome"] in BAD]
    if not bad:
        return
    keep = Path(tempfile.mkdtemp(prefix="oopscope-probe-repro-"))
    for x in bad:
        if "path" in x:
            kept = keep / Path(x["path"]).name
            shutil.copyfile(x["path"], kept)
            x["command"] = x["command"].replace(x["path"], str(kept))
            x["path"] = str(kept)
        if x.get("outcome") not in BAD:
            x = dict(x, outcome=f"fewer than tshark: {x['packets']} < {x['tshark']}")
        results.setdefault("failures", []).append(x)
    results["repro_dir"] = str(keep)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--captures", type=int, default=282, help="damaged captures (default 282)")
    p.add_argument("--queries", type=int, default=511, help="mutated queries (default 511)")
    p.add_argument("--run", type=int, default=3, help="accepted mutated queries also run (default 3)")
    p.add_argument("--sections", default="captures,queries,faults", help="which parts run")
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--jobs", type=int, default=2, help="decodes at a time (default 2)")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a decode or explain is a hang")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds before a run is a hang")
    p.add_argument("--pcaps", default=str(settings.shared_dir() or REPO.parent / "shared") + "/pcaps",
                   help="real captures to damage (default ../shared/pcaps)")
    p.add_argument("--dir", default=None, help="keep the corpus here (default: a temporary directory)")
    p.add_argument("--top", type=int, default=10, help="differences from tshark listed")
    p.add_argument("--json", default=None, help="write the report, with every case, here")
    p.add_argument("--explain-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.explain_worker:
        return explain_worker()
    logging.basicConfig(level=logging.INFO, format="probe: %(message)s", stream=sys.stderr)
    workdir = work_dir(args.dir, "oopscope-probe-")
    sections: dict[str, Callable[..., dict]] = {"captures": probe_captures, "queries": probe_queries,
                                                "faults": probe_faults}
    results: dict[str, Any] = {"seed": args.seed}
    start = time.monotonic()
    for name in args.sections.split(","):
        log.info("%s ...", name)
        results[name] = sections[name](args, workdir)
    results["seconds"] = time.monotonic() - start
    keep_failures(results)
    print(report(results, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
