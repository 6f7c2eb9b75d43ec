"""Landmark and tuple-count window specs: analysis errors with line/column, plans, explain."""

from __future__ import annotations

import pytest

from queries.errors import QueryError
from queries.explain import explain_text
from queries.planner import plan_text

BAD = [
    ("SELECT COUNT(*) [ROWS 0] FROM main.IP", "ROWS 0", 1, 17),
    ("SELECT COUNT(*) [PARTITION BY srcPrt ROWS 5] FROM main.TCP", "unknown column 'srcPrt'",
     1, 31),
    ("SELECT COUNT(*) [PARTITION BY srcPort] FROM main.TCP", "needs a row count", 1, 17),
    ("SELECT COUNT(*) [ROWS 5, SLIDE 1 sec] FROM main.IP", "takes no SLIDE", 1, 17),
    ("SELECT COUNT(*) [ROWS 5, WA time] FROM main.IP", "takes no WA", 1, 17),
    ("SELECT COUNT(*) [RANGE ALL, SLIDE 1 sec, WA len] FROM main.IP", "not increasing", 1, 17),
    ("SELECT COUNT(*) [RANGE ALL, SLIDE 1500 ms] FROM main.IP", "whole multiple", 1, 35),
    ("DEFINE { late 'correct'; }\nSELECT COUNT(*) [RANGE ALL] FROM main.IP",
     "late 'correct' is for time windows", 2, 17),
    ("DEFINE { query_name a; }\nSELECT COUNT(*) [ROWS 5] AS c FROM main.IP;\n"
     "DEFINE { query_name b; }\nSELECT c FROM a", "has a ROWS window", 4, 15),
    ("SELECT COUNT(*) [ROWS 5] FROM main.IP GROUP BY time/60 AS tb", "cannot be combined",
     1, 17),
]


@pytest.mark.parametrize("text,words,line,col", BAD, ids=[b[1] for b in BAD])
def test_malformed_specs_name_the_problem_and_place(text, words, line, col):
    with pytest.raises(QueryError) as exc:
        plan_text(text, ["main"])
    e = exc.value
    assert words in str(e)
    assert (e.line, e.column) == (line, col)


def test_landmark_plan_and_explain():
    fp = plan_text("SELECT srcIP, COUNT(*) [RANGE ALL, SLIDE 2 minutes] AS c FROM main.IP "
                   "GROUP BY srcIP; SELECT COUNT(*) [RANGE ALL, WA timestamp_ms] AS d "
                   "FROM main.IP", ["main"])
    slide, end = (q.high.window for q in fp.queries)
    # the low level counts tumbling panes of one slide (or of one unit of the attribute)
    assert (slide.landmark, slide.pane_ns, slide.range_ns, slide.scale) == \
        ("slide", 120 * 10**9, 120 * 10**9, 120)
    assert (end.landmark, end.pane_ns, end.scale) == ("end", 10**6, 1)
    assert fp.queries[0].output_names == ["window_end", "srcIP", "c"]
    text = explain_text("SELECT COUNT(*) [RANGE ALL, SLIDE 1 minute] AS c FROM main.IP",
                        links=["main"])
    assert "landmark RANGE ALL SLIDE 1min" in text and "one running state per group" in text


def test_rows_plan_and_explain():
    text = ("SELECT srcPort, COUNT(*) [PARTITION BY protocol ROWS 7] AS c, AVG(len) AS m "
            "FROM [x, y].IP WHERE ttl > 1 GROUP BY srcPort")
    qp = plan_text(text, ["x", "y"]).queries[0]
    # the low level only selects and projects; the high level numbers the rows
    assert all(lp.window is None and lp.subaggs == () for lp in qp.low)
    assert [lp.link for lp in qp.low] == ["x", "y"]
    names = [k.name for k in qp.low[0].projections]
    assert names[1] == "srcPort" and len(names) == 3
    assert qp.high.rows.rows == 7 and qp.high.rows.order == tuple(names)
    assert qp.output_names == ["row_window", "srcPort", "c", "m"]
    shown = explain_text(text, links=["x", "y"])
    assert "count windows: ROWS 7" in shown and "link position (x, y)" in shown
    assert "[PARTITION BY protocol ROWS 7]" in shown   # the printer's form, as written
