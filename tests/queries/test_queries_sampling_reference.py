"""The sampling queries' reference evaluator (tests.oracles.sampling) on hand-computed inputs."""

from __future__ import annotations

import numpy as np
import pytest

from capture.batch import PacketBatch
from capture.schema import L_ETH, L_IPV4, L_UDP
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file, to_frame
from tests.oracles.sampling import evaluate_sampling

NS = 1_000_000_000
BASE_S = 1_700_000_040          # a multiple of 60: time/60 starts a window here
TB = BASE_S // 60
HOST = {name: 0x0A00_0000 + i + 1 for i, name in enumerate("ABCDEFGHXYZ")}


def packets(rows: list[tuple], link: str = "main") -> PacketBatch:
    """IPv4 UDP packets from (second after BASE_S, source host, destination host, len); each
    packet 1 ms after the previous one within its second, so the order is the list's."""
    b = PacketBatch.empty(link, len(rows))
    c = b.columns
    for i, (sec, src, dst, length) in enumerate(rows):
        c["timestamp"][i] = (BASE_S + sec) * NS + i * 1_000_000
        c["srcIP_lo"][i] = 0xFFFF_0000_0000 | HOST[src]
        c["destIP_lo"][i] = 0xFFFF_0000_0000 | HOST[dst]
        c["len"][i] = length
    c["layers"][:] = L_ETH | L_IPV4 | L_UDP
    c["ipversion"][:] = 4
    c["protocol"][:] = 17
    c["caplen"][:] = np.minimum(c["len"], 96)
    c["ip_len"][:] = c["len"] - 14
    return b


def run(text: str, rows: list[tuple]):
    """The sampling reference's rows, as a DataFrame, by way of `evaluate_file` too."""
    batches = {"main": packets(rows)}
    fp = plan_text(text, ["main"])
    qp = fp.queries[0]
    assert qp.analysed.sampling is not None
    direct = to_frame(evaluate_sampling(qp, qp.analysed, batches, {}), qp)
    via_file = evaluate_file(fp, batches)[qp.name]
    assert direct.equals(via_file)
    return direct


def host(name: str) -> int:
    return HOST[name]


def records(frame) -> list[tuple]:
    return [tuple(v.item() if isinstance(v, np.generic) else v for v in r)
            for r in frame.itertuples(index=False)]


SUBSET_SUM = """
SELECT tb, srcIP, count(*) AS n, sum(len) AS bytes, ssthreshold() AS z,
       count_distinct$(*) AS cd, packet_count() AS seen
FROM main.IPV4
WHERE ssample(len, 2) = TRUE
GROUP BY time/60 AS tb, srcIP
HAVING ssfinal_clean(sum(len)) = TRUE
CLEANING_WHEN ssdo_clean() = TRUE
CLEANING_BY ssclean_with(sum(len)) = TRUE
"""


def test_dynamic_subset_sum_by_hand():
    # sample size 2, one supergroup; window 1 starts with clean_init (z = 200, gamma = 2)
    rows = [
        (0, "A", "X", 100),   # ssample: count 100 < 200: fails
        (0, "A", "X", 150),   # count 250 >= 200: sampled (count 50); A = 150, cd 1
        (1, "B", "X", 300),   # 300 > z: sampled; B = 300, cd 2
        (2, "A", "X", 500),   # sampled; A = 650
        (3, "C", "X", 300),   # C, cd 3
        (4, "D", "X", 300),   # D, cd 4 (ssdo_clean: 4 > 2 * 2 is false)
        (5, "E", "X", 300),   # E, cd 5 > 4: z_prev 200, z 400; pass (cd 5), gcount 0:
        #                       A 650 > z kept; B 300: gcount 300 < 400 removed;
        #                       C 600 kept (200); D 500 kept (100); E 400 kept (0). cd 4
        (6, "B", "X", 100),   # ssample (do_clean 1: gcount 0, do_clean 0): count 100: fails
        (7, "B", "X", 350),   # count 450 >= 400: sampled (50); B anew = 350, cd 5 > 4:
        #                       z_prev 400, z 800; pass: A 650: gcount 650 removed;
        #                       C 300 -> 400: 1050 kept (250); D 400: 650 removed;
        #                       E 400: 1050 kept (250); B 350 -> 400: 650 removed. cd 2
        (8, "F", "X", 250),   # count 250 < 800: fails
        (9, "F", "X", 600),   # count 850: sampled (50); F = 600, cd 3
        (10, "G", "X", 900),  # 900 > 800: G = 900, cd 4 (not > 4: no cleaning)
        # end: final_init(4): z_prev 800, z = 800 * 4 / 2 = 1600; HAVING (cd 4 > s_size 2):
        # C 300 -> 800: fcount 800 removed; E 800: 1600 kept (0); F 600 -> 800: 800 removed;
        # G 900: 1700 kept (100). Final cd 2
        (60, "H", "X", 10),   # window 2: dirty_init(old, 2): z = 1600 / 10 = 160; count 10
        (61, "H", "X", 200),  # 200 > 160: H = 200, cd 1
        # end: final_init(1): 1 < 2: z = 80; HAVING: cd 1 <= 2 keeps H
    ]
    # packet_count(): the rows ssample saw in the window
    got = records(run(SUBSET_SUM, rows))
    assert got == [
        (TB, host("E"), 1, 300, 1600.0, 2, 12),
        (TB, host("G"), 1, 900, 1600.0, 2, 12),
        (TB + 1, host("H"), 1, 200, 80.0, 1, 2),
    ]


SUPER = """
SELECT tb, srcIP, destIP, count(*) AS n, count$(*) AS sn, sum$(len) AS sbytes,
       max$(len) AS smax, count_distinct$(*) AS groups
FROM main.IPV4
GROUP BY time/60 AS tb, srcIP, destIP
SUPERGROUP srcIP
HAVING count(*) >= 2
"""


def test_super_aggregates_per_supergroup():
    rows = [
        (0, "A", "X", 100), (1, "A", "X", 110), (2, "A", "Y", 900), (3, "A", "Z", 120),
        (4, "A", "Z", 130), (5, "B", "X", 200), (6, "B", "X", 300), (7, "B", "Y", 50),
        (8, "B", "Y", 60), (9, "B", "Y", 70),
        (60, "A", "X", 10), (61, "A", "Y", 20), (62, "A", "Y", 30),
    ]
    got = records(run(SUPER, rows))
    # window 1, supergroup A: groups X (2 rows, 210), Y (1 row, 900: removed by HAVING,
    # so COUNT$ and SUM$ lose it, MAX$ keeps it), Z (2 rows, 250): COUNT$ 4, SUM$ 460,
    # MAX$ 900, 2 live groups. Supergroup B: X (2, 500), Y (3, 180), all kept.
    # Window 2 (super-aggregates start over): A's X (1 row) removed; Y (2, 50) kept
    a, b = host("A"), host("B")
    assert got == [
        (TB, a, host("X"), 2, 4, 460, 900, 2),
        (TB, a, host("Z"), 2, 4, 460, 900, 2),
        (TB, b, host("X"), 2, 5, 680, 300, 2),
        (TB, b, host("Y"), 3, 5, 680, 300, 2),
        (TB + 1, a, host("Y"), 2, 2, 50, 30, 1),
    ]


RECREATE = """
SELECT tb, srcIP, count(*) AS n, sum(len) AS bytes, count$(*) AS sn, sum$(len) AS sbytes
FROM main.IPV4
GROUP BY time/60 AS tb, srcIP
CLEANING_WHEN count_distinct$(*) >= 2
CLEANING_BY sum(len) > 100
"""


def test_cleaned_group_is_created_anew():
    rows = [
        (0, "A", "X", 50),    # A (1, 50); 1 live group: no cleaning
        (1, "B", "X", 200),   # B (1, 200); 2 live: A 50 removed (COUNT$ 2 - 1, SUM$ 250 - 50)
        (2, "A", "X", 70),    # A anew (1, 70), after B; cleaning removes it again
        (3, "A", "X", 150),   # A anew (1, 150); cleaning keeps B and A
        (4, "A", "X", 30),    # A (2, 180); cleaning keeps both
    ]
    got = records(run(RECREATE, rows))
    # COUNT$: 5 rows - 2 removed (one each) = 3; SUM$: 500 - 50 - 70 = 380. Creation order:
    # B, then A
    assert got == [
        (TB, host("B"), 1, 200, 3, 380),
        (TB, host("A"), 2, 180, 3, 380),
    ]


def test_no_rows_gives_typed_empty_columns():
    fp = plan_text(SUBSET_SUM, ["main"])
    qp = fp.queries[0]
    table = evaluate_sampling(qp, qp.analysed, {"main": packets([])}, {})
    assert table.n == 0
    assert table.columns["z"].dtype == np.float64
    assert table.columns["n"].dtype == np.uint64


COUNTS = "SELECT tb, srcIP, count(*) AS n, count$(*) AS sn FROM {} GROUP BY time/60 AS tb, srcIP"


def creation_order(text: str, batches: dict) -> list[int]:
    fp = plan_text(text, list(batches))
    qp = fp.queries[0]
    assert qp.analysed.sampling is not None
    return [r[1] for r in records(to_frame(evaluate_sampling(qp, qp.analysed, batches, {}), qp))]


@pytest.mark.parametrize("swap", [False, True])
def test_ties_break_by_projected_values(swap):
    # two packets at one timestamp: the smaller projected values (srcIP) come first whatever
    # the input order, so A's group is created before B's
    rows = [(0, "B", "X", 300), (0, "A", "X", 300)]
    if swap:
        rows.reverse()
    batch = packets(rows)
    batch.columns["timestamp"][:] = BASE_S * NS
    assert creation_order(COUNTS.format("main.IPV4"), {"main": batch}) == [host("A"), host("B")]


def test_ties_break_by_link_position_before_values():
    batches = {"a": packets([(0, "B", "X", 300)], "a"), "b": packets([(0, "A", "X", 300)], "b")}
    assert creation_order(COUNTS.format("[a, b].IPV4"), batches) == [host("B"), host("A")]
    assert creation_order(COUNTS.format("[b, a].IPV4"), batches) == [host("A"), host("B")]
