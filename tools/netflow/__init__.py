"""NetFlow v5 / v9 / IPFIX export of flow records (the `netflow` query's rows) over UDP.

Modules: `records` (an Arrow table of flow rows -> numpy columns), `clock` (capture-time
header clock), `v5`, `templates` + `v9`, `ipfix` (encoders: records -> datagrams), `sender`
(UDP sender and pcap writer), `exporter` (encoder + senders), `export` (the `oopscope export`
command); the Spark-stage sink is `tools.results.netflow`.
Only the `export` module is imported by the CLI, and it imports nothing heavy at top level.
"""
