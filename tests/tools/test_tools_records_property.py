"""Property test: for random streams of CSV records, `oopscope run` (low level, spool,
Spark) equals the reference evaluator for string comparisons, MIN/MAX over strings, string
group keys and a CUBE, a running aggregation (CLOSING_WHEN) and a sampling query (SUPERGROUP,
super-aggregates, CLEANING_WHEN/BY, stateful functions), over windows on the record
protocol's increasing field."""

from __future__ import annotations

import csv

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCHEMA = """PROTOCOL base { uint systemTime get_system_time (required, increasing); }
PROTOCOL EVENTS (base) {
    uint ivalue get_csv_uint_pos1 (increasing);
    uint host get_csv_uint_pos2;
    string name get_csv_string_pos3;
    uint size get_csv_uint_pos4;
}
"""
QUERIES = """DEFINE { query_name by_host; aggregate_slots 4; }
SELECT tb, host, MIN(name) AS first_name, MAX(name) AS last_name, count(*) AS n,
       sum(size) AS bytes
FROM [csv].EVENTS
WHERE name > 'b'
GROUP BY ivalue/10 AS tb, host;

DEFINE { query_name by_name; }
SELECT tb, name, host, count(*) AS n
FROM [csv].EVENTS
GROUP BY ivalue/10 AS tb, name, CUBE(host);

DEFINE { query_name small; }
SELECT ivalue, name, size FROM [csv].EVENTS WHERE name <= 'bc' AND size < 50;

DEFINE { query_name running; aggregate_slots 4; }
SELECT tb, host, name, count(*) AS n, max(size) AS big, sum(size) AS bytes
FROM [csv].EVENTS
GROUP BY ivalue/10 AS tb, host, name
HAVING count(*) < 3
CLOSING_WHEN count(*) = 0 OR sum(size) > 150;

DEFINE { query_name sampled; }
SELECT tb, host, size, count(*) AS n, count$(*) AS seen, sum$(size) AS total,
       count_distinct$(*) AS live, ssthreshold() AS z
FROM [csv].EVENTS
WHERE ssample(size, 2) = TRUE
GROUP BY ivalue/10 AS tb, host, size
SUPERGROUP host
HAVING ssfinal_clean(sum(size)) = TRUE
CLEANING_WHEN ssdo_clean() = TRUE
CLEANING_BY ssclean_with(sum(size)) = TRUE
"""

names = st.text(alphabet="abc", min_size=0, max_size=3)
records = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), names,
                             st.integers(0, 100)), min_size=1, max_size=120)


def _rows(table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records)
def test_run_equals_the_reference_over_random_records(spark_session, tmp_path_factory, rows):
    from capture.records import read_all_records
    from queries.planner import plan_text
    from queries.schemafile import load_schema
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    work = tmp_path_factory.mktemp("prop")
    schema_path, query, data = work / "schema.txt", work / "q.gsql", work / "events.csv"
    schema_path.write_text(SCHEMA)
    query.write_text(QUERIES)
    # the clock field never decreases: a running sum of the steps drawn
    clock, lines = 0, []
    for step, host, name, size in rows:
        clock += step
        lines.append([clock, host, name, size])
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows(lines)

    summary = run(RunConfig(query_file=str(query), links=(("csv", str(data)),),
                            schema_files=(str(schema_path),), progress=False))
    schema = load_schema([schema_path])
    plan = plan_text(QUERIES, ["csv"], schema=schema)
    batch = read_all_records(data, schema.record_format("EVENTS"), "csv")
    want = evaluate_file(plan, {"csv": batch})
    for name in ("by_host", "by_name", "small", "running", "sampled"):
        got = summary.results[name]
        expected = sorted(tuple(r) for r in want[name].itertuples(index=False))
        assert _rows(got) == [tuple(_plain(v) for v in r) for r in expected], name


def _plain(value):
    """A reference value as the run's Arrow rows hold it (numpy scalars to Python)."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if hasattr(value, "item") else value
