"""`run` and `serve` write the same bytes for the same rows (`tools.results`): the same query
over the same records, as a real `oopscope run` and a real server, in CSV and JSON lines.

The server reads the records from a FIFO written once the queries are submitted (so every
record counts in its windows, as in the run); a last record far ahead closes every window
before it, and the server's stop the last one. The rows are compared line for line, per
window: the server writes a part file per micro-batch (each with the header), the run one
file, so windows may be split differently, but every header and every row must be the same
bytes. CSV quotes a string only when it needs quotes (`tools.results.formats`): a label with
a comma falls in one window of four, so batches with and without it are both compared."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import defaultdict

import pytest

from tests.tools.resuming import run_here
from tests.tools.serving import Server, wait_for

SCHEMA = """PROTOCOL base {
    uint systemTime get_system_time (low_cardinality,required,increasing, snap_len 0);
    uint schemaId get_schemaId (low_cardinality,required, snap_len 0);
}

PROTOCOL CSV_MIX (base) {
    uint ivalue get_csv_uint_pos1 (increasing);
    float fvalue get_csv_float_pos2;
    string label get_csv_string_pos3;
    string tag get_csv_string_pos4;
}
"""

#: `counts`: integers and strings, none needing quotes (the Numba writer); `mix`: floats and
#: a label with a comma in one window of four (that string quoted, no other)
QUERIES = """
DEFINE { query_name 'counts'; }
select tb, tag, count(*) as cnt, sum(ivalue) as total
from [csv].CSV_MIX
group by ivalue/10 as tb, tag;

DEFINE { query_name 'mix'; }
select tb, label, max(fvalue) as top, min(fvalue) as low, count(*) as cnt
from [csv].CSV_MIX
group by ivalue/10 as tb, label
"""

LABELS = ("alpha", "delta")
LAST = 400                 # ivalue of the last record: it closes every window before it


def label(i: int) -> str:
    return "b,c" if (i // 10) % 4 == 0 else LABELS[i % 2]


def records() -> list[str]:
    # floats whose shortest text is long (0.30000000000000004), negative, large, integral
    lines = [f"{i}|{(i if i % 5 else -i) * 0.1 if i % 7 else 1e17 + i}|{label(i)}|t{i % 4}"
             for i in range(300)]
    return lines + [f"{LAST}|0.5|b,c|t0"]


def by_window(lines: list[str], header: str) -> dict[int, list[str]]:
    """The rows of each window (`tb` first in every row), sorted: the order of rows within a
    window is the order of groups, which need not be the same."""
    out: dict[int, list[str]] = defaultdict(list)
    for line in lines:
        if line == header:
            continue
        tb = line.split(",", 1)[0] if line[0] != "{" else line.split(":", 2)[1].split(",")[0]
        out[int(tb)].append(line)
    return {tb: sorted(rows) for tb, rows in out.items()}


@pytest.mark.slow
def test_run_and_serve_write_the_same_bytes(tmp_path):
    schema = tmp_path / "packet_schema.txt"
    schema.write_text(SCHEMA)
    query = tmp_path / "mixed.gsql"
    query.write_text(QUERIES)
    data = tmp_path / "records.csv"
    data.write_text("\n".join(records()) + "\n")

    runs = {}
    for name in ("counts", "mix"):
        for ext in ("csv", "jsonl"):
            runs[name, ext] = tmp_path / f"run-{name}.{ext}"
            # the oracle: in this process (the server below is the process under test)
            run_here([sys.executable, "-m", "tools.cli", "run", str(query), "--schema",
                      str(schema), "--csv-separator", "|", "--link", f"csv={data}",
                      "--output", f"{name}={runs[name, ext]}"])

    fifo = tmp_path / "feed.fifo"
    os.mkfifo(fifo)
    state = tmp_path / "state"
    server = Server(["--schema", str(schema), "--records", f"csv=CSV_MIX:{fifo}",
                     "--csv-separator", "|"], state, tmp_path / "serve.log").start()
    try:
        server.wait_spark()
        for ext in ("csv", "jsonl"):
            server.client.submit(text=QUERIES, file="mixed.gsql", name=f"q{ext}",
                                 format=ext,
                                 outputs={"counts": f"{ext}/counts", "mix": f"{ext}/mix"})
        feeder = threading.Thread(target=lambda: fifo.write_text(data.read_text()))
        feeder.start()
        last_tb = 299 // 10

        def done() -> bool:
            starts = (f"{last_tb},", f'{{"tb":{last_tb},')
            return all(any(line.startswith(starts) for p in (state / ext / name).glob("part-*")
                           for line in p.read_text().splitlines())
                       for ext in ("csv", "jsonl") for name in ("counts", "mix"))
        wait_for(done, 120, "the last closed window in every output")
        feeder.join(timeout=30)
    finally:
        server.stop()

    for (name, ext), run_file in runs.items():
        run_lines = run_file.read_text().splitlines()
        header = run_lines[0] if ext == "csv" else ""
        parts = sorted((state / ext / name).glob(f"part-*.{ext}"))
        assert parts, f"the server wrote no {ext} of {name}"
        serve_lines = []
        for part in parts:
            lines = part.read_text().splitlines()
            if ext == "csv":
                assert lines[0] == header, (part, lines[0], header)   # no quotes in either
            serve_lines += lines
        ran = by_window(run_lines, header)
        served = by_window(serve_lines, header)
        assert len(ran) == 31 and LAST // 10 in ran
        assert served == ran, (name, ext)
    # what each query exercised: the Numba writer's unquoted rows, a string quoted only where
    # it needs quotes, and shortest floats
    counts = runs["counts", "csv"].read_text()
    assert counts.splitlines()[0] == "tb,tag,cnt,total" and '"' not in counts
    mix = runs["mix", "csv"].read_text().splitlines()
    assert mix[0] == "tb,label,top,low,cnt"
    assert '"b,c"' in mix[1] + mix[2] + mix[3] and ",alpha," in mix[1] + mix[2] + mix[3]
    assert not any('"alpha"' in line or '"delta"' in line for line in mix)
    assert any(",delta," in line for line in mix[4:])
    assert any(",1.9000000000000001," in line for line in mix)   # max of (1, delta)
    assert any(re.search(r",1\.0000000000000\d*e\+17,", line) for line in mix)
