"""`oopscope explain`: show how a query file is planned (low level per link, high level)."""

from __future__ import annotations

import click

from tools.commands.params import functions_option, schema_option


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=option)
        out[key.strip()] = value.strip()
    return out


@click.command()
@click.argument("query_files", metavar="QUERY_FILE...", nargs=-1, required=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a DEFINE key for this run (e.g. --set flush=oop_slow).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Give a PARAM its value (e.g. --param min_bytes=100000).")
@click.option("--link", "links", multiple=True, metavar="NAME",
              help="A link name of the run (repeatable; NAME=path also accepted). "
                   "Default: the links the files name, else `main`.")
@schema_option
@functions_option
def explain(query_files: tuple[str, ...], sets: tuple[str, ...], params: tuple[str, ...],
            links: tuple[str, ...], schema_files: tuple[str, ...],
            function_files: tuple[str, ...], udf_module: str | None) -> None:
    """Explain QUERY_FILE: per query, the low-level part per link (protocol, WHERE, keys,
    window/pane, sub-aggregates, hash-table slots, flush policy) and the high-level part
    (union, super-aggregates, finalisation, HAVING, window assembly, join).

    QUERY_FILE is a path, or the name of a shipped query (`q8_1` finds
    queries/library/q8_1.gsql); several files are one query set, as in GS-lite (a query may
    read a query of another file). Record protocols come from schema files: --schema, else
    the packet_schema.txt beside a query file (as in GS-lite); the plan names the files
    read and, per record protocol, its record format and clock. User-defined functions:
    --functions (declarations) and --udf (their Python module).
    """
    from queries.explain import format_plan, mentioned_links
    from queries.planner import plan_file
    from tools.pipeline.config import functions_of, read_query_set, schema_of

    tree, text, paths = read_query_set(query_files)
    link_names = [name.partition("=")[0].strip() for name in links]
    schema = schema_of(paths, schema_files)
    plan = plan_file(tree, link_names or mentioned_links(tree) or ["main"],
                     _pairs(params, "--param"), _pairs(sets, "--set"), source=text,
                     schema=schema, functions=functions_of(function_files, udf_module))
    click.echo(format_plan(plan, schema), nl=False)
