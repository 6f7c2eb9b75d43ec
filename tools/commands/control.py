"""The commands that talk to a running `oopscope serve`: submit, queries, tail, cancel, status,
shutdown. Each names the server with `--server URL` (default `$OOPSCOPE_SERVER`, else
http://127.0.0.1:7405/; `unix:PATH` for a Unix socket) and `--token-file` when it needs one."""

from __future__ import annotations

import functools
import sys
import time

import click

from tools.commands.params import schema_option


def _client_options(fn):
    @click.option("--server", default=None, metavar="URL",
                  help="The server (default $OOPSCOPE_SERVER, else http://127.0.0.1:7405/; "
                       "unix:PATH for a Unix socket).")
    @click.option("--token-file", default=None, type=click.Path(dir_okay=False),
                  help="A file holding the server's token.")
    @functools.wraps(fn)
    def wrapper(*args, server, token_file, **kwargs):
        from tools.serve.client import Client
        from tools.serve.server import read_token

        return fn(*args, client=Client(server, read_token(token_file)), **kwargs)

    return wrapper


def _when(ns) -> str:
    """A time of the server's as UTC text with its date (`-`: none)."""
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9))


@click.command()
@click.argument("query_file")
@click.option("--name", default=None, help="The query's name on the server (default: the "
                                           "file's query name).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="A PARAM value.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A DEFINE override.")
@click.option("--output", "outputs", multiple=True, metavar="QUERY=DIR",
              help="Write QUERY's windows into DIR (below the server's output root).")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default=None,
              help="Output files' format (default csv).")
@click.option("--link-map", "link_map", multiple=True, metavar="QUERY_LINK=LINK",
              help="Read the server's link LINK where the query names QUERY_LINK "
                   "(repeatable): the shipped queries read `main`.")
@schema_option
@_client_options
def submit(query_file, name, params, sets, outputs, fmt, link_map, schema_files,
           client) -> None:
    """Submit QUERY_FILE (a path or a shipped query name) to the server.

    The schema files (--schema, else the packet_schema.txt beside QUERY_FILE) are sent with
    it: they are read here, and the server keeps them with the query."""
    from queries.errors import QueryError
    from queries.explain import find_query_file
    from queries.schemafile import read_schema_file, schema_files_for
    from tools.commands.run import _pairs

    path = find_query_file(query_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file (nor a shipped query of that name)",
                         path=query_file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryError(f"cannot read the query file: {exc}", path=str(path)) from None
    schemas = [[str(f), read_schema_file(f)] for f in schema_files_for([path], schema_files)]
    reply = client.submit(text=text, file=str(path), name=name,
                          params=dict(_pairs(params, "--param")),
                          sets=dict(_pairs(sets, "--set")),
                          outputs=dict(_pairs(outputs, "--output")), format=fmt,
                          schemas=schemas,
                          # only when given: a server without --link-map still takes the rest
                          **({"link_map": dict(_pairs(link_map, "--link-map"))}
                             if link_map else {}))
    click.echo(reply["message"])
    for q, out in reply["outputs"].items():
        click.echo(f"  {q} -> {out}/ (a directory of part files, one per micro-batch)")


@click.command()
@_client_options
def queries(client) -> None:
    """Every query on the server: state, links, rows out, partial rows (and per result row),
    its tables' slots now, late packets, evictions, latency, first window, gaps.

    The counters count from each query's submission (SINCE), across restarts; times are
    UTC."""
    listed = client.queries()
    rows = [("NAME", "STATE", "LINKS", "ROWS", "PARTIALS", "PER ROW", "SLOTS", "LATE",
             "EVICTIONS", "P50 LAT",
             "SINCE (UTC)", "FIRST WINDOW (UTC)", "GAPS")]
    for q in listed:
        lat = q.get("latency_p50_s")
        first = q.get("first_window_ns")
        rows.append((q["name"], q["state"], ",".join(q["links"]) or "-", str(q["rows_out"]),
                     str(q["partial_rows"]),
                     "-" if q.get("partials_per_row") is None else f"{q['partials_per_row']:.2f}",
                     str(q.get("slots", "-")), str(q["late_packets"]), str(q["evictions"]),
                     "-" if lat is None else f"{lat:.2f}s", _when(q.get("counted_since_ns")),
                     "first record" if first == 0 else _when(first),
                     str(len(q.get("gaps") or []))))
    _table(rows)
    for q in listed:
        for gap in q.get("gaps") or []:
            start = "its start" if gap.get("from_ns") is None else _when(gap["from_ns"])
            click.echo(f"{q['name']}: gap from {start} to {_when(gap.get('to_ns'))} UTC "
                       f"({gap.get('reason', '?')}): windows in it are not written")
        if q.get("error"):
            click.echo(f"{q['name']}: {q['error']}")
        if q.get("zero_divisor_packets") or q.get("zero_divisor_rows"):
            click.echo(f"{q['name']}: {q.get('zero_divisor_packets', 0)} packets and "
                       f"{q.get('zero_divisor_rows', 0)} rows met a zero divisor (the "
                       f"quotient is 0)")


def _table(rows) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


@click.command()
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "jsonl"]), default="table",
              show_default=True)
@_client_options
def tail(name, fmt, client) -> None:
    """Print NAME's rows as its windows close, until it ends or Ctrl-C.

    Of a query that no longer runs (cancelled, failed), print its last rows and end."""
    import csv
    import json

    writer = csv.writer(sys.stdout, lineterminator="\n")
    header_done = False
    ended = None
    for event in client.tail(name):
        kind = event.get("event")
        if kind == "subscribed" and event.get("state") not in (None, "running"):
            ended = event["state"]
            n = event.get("last_rows", 0)
            click.echo(f"oopscope: query {event.get('query')} is not running ({ended}): "
                       + (f"its last {n} rows" if n else "it wrote no rows"), err=True)
        elif kind == "missed":
            click.echo(f"oopscope: {event['rows']} rows not shown (a tail keeps at most "
                       f"10,000 rows at a time; the output files hold them all)", err=True)
        elif kind == "end":
            if ended is None:
                click.echo(f"oopscope: query {event.get('query')} ended ({event.get('why')})",
                           err=True)
            return
        elif kind == "rows":
            cols, rows = event["columns"], event["rows"]
            if fmt == "jsonl":
                for r in rows:
                    click.echo(json.dumps(dict(zip(cols, r)), separators=(",", ":")))
            elif fmt == "csv":
                if not header_done:
                    writer.writerow(cols)
                writer.writerows(rows)
            else:
                text = [[("" if v is None else str(v)) for v in r] for r in rows]
                widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(cols)]
                if not header_done:
                    click.echo("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
                for r in text:
                    click.echo("  ".join(v.rjust(w) for v, w in zip(r, widths)))
            header_done = True
            sys.stdout.flush()


@click.command()
@click.argument("name")
@_client_options
def cancel(name, client) -> None:
    """Cancel NAME: its open windows are closed and written, its outputs kept."""
    click.echo(client.cancel(name)["message"])


@click.command()
@_client_options
def status(client) -> None:
    """The server's links (rates, drops), its agents and their links, Spark state, its running
    queries' tables (slots, partial rows per result row) and gaps."""
    st = client.status()
    spark = st["spark"]
    since = st.get("counters_since_ns")
    click.echo(f"up {st['uptime_s']:.0f} s"
               + (f" (since {_when(since)} UTC: the link counters count from then)"
                  if since else "")
               + f"; Spark {spark['state']} ({spark['master']})"
               + (f": {spark['error']}" if spark.get("error") else "")
               + f"; {st['queries']} queries running")
    rows = [("LINK", "SOURCE", "PKT/S", "PACKETS", "BYTES", "MALFORMED", "RING DROPS",
             "KERNEL DROPS", "PUNCTUATION (UTC)")]
    for link in st["links"]:
        rows.append((link["name"], link["source"], f"{link['pps']:.0f}", str(link["packets"]),
                     str(link["bytes"]), str(link["malformed"]), str(link["ring_drops"]),
                     str(link["kernel_drops"]), _when(link["punctuation_ns"])))
    if len(rows) > 1:
        _table(rows)
    for link in st["links"]:
        if link.get("netflow"):
            click.echo(_flow_line(link["name"], link["netflow"]))
    _agents(st.get("agents") or [], st.get("spool"))
    _tables(client)
    for gap in st["gaps"]:
        click.echo(f"gap: no capture from {_when(gap['from_ns'])} to {_when(gap['to_ns'])} "
                   f"UTC ({gap['reason']})")


def _flow_line(name: str, nf: dict) -> str:
    """`link r1 (NETFLOW): 13 datagrams (v9: 13), 394 records, 0 sequence gaps, 0 late
    records, 0 malformed datagrams`, with the malformed by reason and exporter, and a
    collector's datagrams dropped at its socket and by its queue."""
    versions = ", ".join(f"v{v}: {n}" for v, n in sorted(nf["versions"].items()))
    bad = sum(nf["malformed"].values())
    why = ", ".join(f"{n} {k}" for k, n in sorted(nf["by_exporter"].items()))
    # a link whose queries window on both flow start and flow end: late on each
    clocks = nf.get("late_by_clock", {})
    each = f" ({', '.join(f'{c}: {n}' for c, n in clocks.items())})" if len(clocks) > 1 else ""
    drops = "" if nf.get("socket_drops") is None else (
        f", {nf['socket_drops']} datagrams dropped at the socket, {nf['queue_drops']} by the "
        f"collector's queue")
    return (f"link {name} (NETFLOW): {nf['datagrams']} datagrams ({versions or 'none'}), "
            f"{nf['records']} records, {nf['sequence_gaps']} sequence gaps, {nf['late']} late "
            f"records{each}, {bad} malformed" + (f" ({why})" if why else "") + drops)


def _tables(client) -> None:
    """The running queries' low-level tables: slots now and partial rows per result row (as
    `queries` shows them), how well the low level reduces."""
    running = [q for q in client.queries() if q["state"] == "running"]
    if not running:
        return
    rows = [("QUERY", "SLOTS", "PER ROW", "PARTIALS", "ROWS", "EVICTIONS")]
    for q in running:
        per_row = q.get("partials_per_row")
        rows.append((q["name"], str(q.get("slots", "-")),
                     "-" if per_row is None else f"{per_row:.2f}", str(q["partial_rows"]),
                     str(q["rows_out"]), str(q["evictions"])))
    _table(rows)


def _agents(agents: list[dict], spool: str | None) -> None:
    """The capture agents of a server with --spool: one row per agent link."""
    if spool is None:
        return
    if not agents:
        click.echo(f"no agents in {spool}")
        return
    rows = [("AGENT", "STATE", "LAST BEAT", "LINK", "PKT/S", "PACKETS", "MALFORMED",
             "RING DROPS", "KERNEL DROPS", "PUNCTUATION", "QUERIES")]
    for a in agents:
        state = a["state"] if a["live"] or a["state"] != "running" else "silent"
        work = ",".join(f"{n}" + ("(failed)" if r.get("state") == "failed" else "")
                        for n, r in sorted(a.get("work", {}).items())) or "-"
        for name, st in sorted(a["links"].items()) or [("-", {})]:
            rows.append((a["host"], state, f"{a['age_s']:.1f}s ago", name,
                         f"{st.get('pps', 0) or 0:.0f}", str(st.get("packets", 0)),
                         str(st.get("malformed", 0)), str(st.get("ring_drops", 0)),
                         str(st.get("kernel_drops", 0)), _when(st.get("punctuation")), work))
    _table(rows)


@click.command()
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the server has written every window and exited.")
@_client_options
def shutdown(wait, client) -> None:
    """Stop the server as SIGTERM does: every window closed and written."""
    from tools.serve.client import ControlError

    click.echo(client.shutdown()["message"])
    if not wait:
        return
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            client.status()
        except ControlError:
            click.echo("server stopped")
            return
        time.sleep(0.5)
    raise ControlError("the server is still up after 10 minutes")
