"""`GET /metrics`: the appliance's counters in Prometheus' text format (`prometheus_client`).

Counters are read from the appliance when Prometheus scrapes (a custom collector), so the
packet path never touches a metric; the same numbers `status` and `queries` report. The one
metric observed as it happens is each stream's window output latency, a histogram.

Names (Prometheus conventions: `_total` counters, base units, `link` / `query` labels):
`oopscope_link_packets_total`, `oopscope_link_bytes_total`,
`oopscope_link_malformed_total{reason}`, `oopscope_link_ring_drops_total`,
`oopscope_link_kernel_drops_total`, `oopscope_link_punctuation_seconds`; a NETFLOW link's
`oopscope_link_netflow_datagrams_total`, `oopscope_link_netflow_records_total`,
`oopscope_link_netflow_malformed_total{reason}` (datagrams and sets),
`oopscope_link_netflow_sequence_gaps_total`, `oopscope_link_netflow_late_records_total`,
`oopscope_link_netflow_clock_late_records_total{clock}`, a
collector's `oopscope_link_netflow_socket_drops_total` (datagrams the kernel dropped at its
socket, also in `oopscope_link_kernel_drops_total`) and
`oopscope_link_netflow_queue_drops_total` (dropped by its queue);
`oopscope_query_rows_total`, `oopscope_query_partial_rows_total`,
`oopscope_query_evictions_total`, `oopscope_query_flushes_total`,
`oopscope_query_late_packets_total`, `oopscope_query_zero_divisor_packets_total`,
`oopscope_query_zero_divisor_rows_total`, `oopscope_query_table_slots` and
`oopscope_query_partials_per_row` (gauges: the low-level tables' size now, partial rows per
result row), `oopscope_query_running`,
`oopscope_query_output_latency_seconds` (histogram), `oopscope_query_counted_since_seconds`;
`oopscope_spark_up`, `oopscope_uptime_seconds`, `oopscope_start_time_seconds`.

The link counters count from the server process's start (`oopscope_start_time_seconds`; a
restart begins them again, which Prometheus' `rate` takes as a counter reset); a query's
count from its submission, across restarts (`oopscope_query_counted_since_seconds`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from capture.flowdecode import REASONS as FLOW_REASONS
from capture.schema import BENIGN_REASONS, REASONS

#: window close to output, seconds: a window's rows usually go out within a second
LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
#: the reasons a packet is malformed (not the benign ones: decoded, or not IP)
_MALFORMED = [REASONS[c] for c in sorted(REASONS) if c not in BENIGN_REASONS]


class Metrics:
    """The appliance's registry: the collector and the latency histograms."""

    def __init__(self, appliance):
        self.appliance = appliance
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(appliance))
        self.latency = Histogram("oopscope_query_output_latency_seconds",
                                 "Seconds from the punctuation that closed a window to its "
                                 "rows written", ["query"], registry=self.registry,
                                 buckets=LATENCY_BUCKETS)

    def watch(self, submission) -> None:
        for stream, out in submission.outputs.items():
            out.on_latency = self.latency.labels(stream).observe

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, appliance):
        self.appliance = appliance

    def collect(self):
        app = self.appliance
        status = app.status()
        links = status["links"]

        def per_link(name, doc, key):
            return _family(name, doc, "link", links, key)

        yield per_link("oopscope_link_packets", "Packets handed to the low level", "packets")
        yield per_link("oopscope_link_bytes", "Bytes (wire length) handed to the low level",
                       "bytes")
        yield per_link("oopscope_link_ring_drops", "Packets the link's packet ring dropped",
                       "ring_drops")
        yield per_link("oopscope_link_kernel_drops", "Packets the kernel dropped (ring full)",
                       "kernel_drops")
        malformed = CounterMetricFamily("oopscope_link_malformed",
                                        "Packets that could not be decoded, by reason",
                                        labels=["link", "reason"])
        for s in links:
            # every reason, zero ones too: an alert on a series needs it to exist
            for reason in _MALFORMED:
                malformed.add_metric([s["name"], reason], float(s["reasons"].get(reason, 0)))
        yield malformed
        punct = GaugeMetricFamily("oopscope_link_punctuation_seconds",
                                  "The link's punctuation (low-watermark), epoch seconds",
                                  labels=["link"])
        for s in links:
            if s["punctuation_ns"] is not None:
                punct.add_metric([s["name"]], s["punctuation_ns"] / 1e9)
        yield punct
        yield from _netflow(links)
        queries = app.queries()

        def per_query(name, doc, key):
            return _family(name, doc, "query", queries, key)

        def gauge_per_query(name, doc, key):
            return _family(name, doc, "query", queries, key, GaugeMetricFamily)

        yield per_query("oopscope_query_rows", "Result rows written", "rows_out")
        yield per_query("oopscope_query_partial_rows", "Partial rows the low level wrote",
                        "partial_rows")
        yield per_query("oopscope_query_evictions", "Low-level hash table evictions",
                        "evictions")
        yield per_query("oopscope_query_flushes", "Low-level table entries flushed", "flushes")
        yield gauge_per_query("oopscope_query_table_slots",
                              "Slots of the query's low-level hash tables now", "slots")
        yield gauge_per_query("oopscope_query_partials_per_row",
                              "Partial rows per result row (1: each group left its table "
                              "once per window)", "partials_per_row")
        yield per_query("oopscope_query_late_packets", "Packets dropped as late",
                        "late_packets")
        yield per_query("oopscope_query_zero_divisor_packets",
                        "Packets whose WHERE, key or argument met a zero divisor (gave 0)",
                        "zero_divisor_packets")
        yield per_query("oopscope_query_zero_divisor_rows",
                        "Rows written whose values met a zero divisor (gave 0)",
                        "zero_divisor_rows")
        running = GaugeMetricFamily("oopscope_query_running", "1 while the query runs",
                                    labels=["query"])
        since = GaugeMetricFamily("oopscope_query_counted_since_seconds",
                                  "Epoch seconds the query's counters count from: its "
                                  "submission (they go on across restarts)", labels=["query"])
        for q in queries:
            running.add_metric([q["name"]], 1.0 if q["state"] == "running" else 0.0)
            if q.get("counted_since_ns"):
                since.add_metric([q["name"]], q["counted_since_ns"] / 1e9)
        yield running
        yield since
        up = GaugeMetricFamily("oopscope_spark_up", "1 when the Spark session is up")
        up.add_metric([], 1.0 if status["spark"]["state"] == "up" else 0.0)
        yield up
        uptime = GaugeMetricFamily("oopscope_uptime_seconds", "Seconds since the server started")
        uptime.add_metric([], status["uptime_s"])
        yield uptime
        start = GaugeMetricFamily("oopscope_start_time_seconds",
                                  "Epoch seconds the server process started: the link "
                                  "counters count from then")
        start.add_metric([], status["counters_since_ns"] / 1e9)
        yield start


def _netflow(links: list[dict]):
    """The NETFLOW links' counters (`tools.pipeline.flowlinks`)."""
    flows = [{"name": s["name"], **s["netflow"]} for s in links if s.get("netflow")]
    for key, doc in (("datagrams", "NetFlow/IPFIX datagrams received"),
                     ("records", "Flow records decoded"),
                     ("sequence_gaps", "Datagrams or records missing by the exporters' "
                                       "sequence numbers"),
                     ("late_records", "Flow records released below the link's punctuation, "
                                      "summed over the clocks its queries window on"),
                     ("socket_drops", "Datagrams the kernel dropped at the collector's "
                                      "socket (its receive buffer full)"),
                     ("queue_drops", "Datagrams the collector's queue dropped (full)")):
        yield _family(f"oopscope_link_netflow_{key}", doc, "link", flows,
                      "late" if key == "late_records" else key)
    by_clock = CounterMetricFamily("oopscope_link_netflow_clock_late_records",
                                   "Flow records below the link's punctuation on a clock "
                                   "(first, last) its queries window on",
                                   labels=["link", "clock"])
    for s in flows:
        for clock, n in s.get("late_by_clock", {}).items():
            by_clock.add_metric([s["name"], clock], float(n))
    yield by_clock
    malformed = CounterMetricFamily("oopscope_link_netflow_malformed",
                                    "Malformed NetFlow/IPFIX input, by reason",
                                    labels=["link", "reason"])
    for s in flows:
        for reason in FLOW_REASONS:
            malformed.add_metric([s["name"], reason], float(s["malformed"].get(reason, 0)))
    yield malformed


def _family(name: str, doc: str, label: str, items: list[dict], key: str,
            kind=CounterMetricFamily):
    """A counter with one sample per link or query (`items`: status or query dicts)."""
    fam = kind(name, doc, labels=[label])
    for item in items:
        if item.get(key) is not None:
            fam.add_metric([item["name"]], float(item[key]))
    return fam
