"""The combine and output loops of a user-defined aggregate (`lowlevel.udafs`) are generated
per UDAF and cached by Numba on disk: a second process (a restarted Spark Python worker)
loads them instead of compiling, with the same results as the plain Python fold; an edited
module makes new loops."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

MODULE = """\
class wsum:
    state = ("float64", 2)

    def init(state):
        state[0] = 0.0
        state[1] = 0.0

    def update(state, value):
        state[0] += value * {weight}
        state[1] += 1.0

    def combine(state, other):
        state[0] += other[0]
        state[1] += other[1]

    def output(state):
        return state[0] / state[1] if state[1] > 0 else -1.0
"""

#: one process: fold and output 1,000 random state rows in 37 groups with the generated
#: loops, and with the module's functions in Python; whether each loop came from the cache
_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from lowlevel import udafs
    from queries.udf import ExternalAggregate, implementation

    u = ExternalAggregate(name="wsum", module=sys.argv[1], param="float", returns="float",
                          dtype="float64", size=2, identity=(0.0, 0.0), lfta=True,
                          declared_at="test")
    rng = np.random.default_rng(5)
    rows = rng.uniform(-5, 5, (1000, 2))
    starts = np.unique(np.r_[0, rng.integers(1, 1000, 36)]).astype(np.int64)
    folded = udafs.fold_rows(u, rows, starts)
    out = udafs.udaf_output(u, folded)
    py = implementation(sys.argv[1], "wsum")
    bounds = list(starts) + [len(rows)]
    want = []
    for g in range(len(starts)):
        acc = rows[bounds[g]].copy()
        for r in range(bounds[g] + 1, bounds[g + 1]):
            py.combine(acc, rows[r])
        want.append(acc)
    hits = {part: sum(getattr(udafs.cached_loops(u, part), fn).stats.cache_hits.values())
            for part, fn in (("combine", "fold"), ("output", "map_each"))}
    print(json.dumps({"same": bool(np.array_equal(folded, np.array(want))),
                      "out": bool(np.array_equal(out, [py.output(s) for s in want])),
                      "hits": hits, "groups": len(starts)}))
""")


def _probe(module: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(module)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_loops_are_cached_per_module_and_equal_the_python_fold(tmp_path):
    module = tmp_path / "udafs.py"
    module.write_text(MODULE.format(weight="1.0"))
    first = _probe(module)
    assert first["same"] and first["out"] and first["groups"] > 20, first
    assert first["hits"] == {"combine": 0, "output": 0}          # compiled, then written
    again = _probe(module)
    assert again["same"] and again["out"], again
    assert again["hits"] == {"combine": 1, "output": 1}          # loaded, not compiled
    # an edited module is another module's loops: compiled anew, never the stale ones
    module.write_text(MODULE.format(weight="2.0") + "\n# edited\n")
    edited = _probe(module)
    assert edited["same"] and edited["out"] and edited["hits"] == {"combine": 0, "output": 0}
