"""`oopscope explain`: show how a query file is planned (low level per link, high level)."""

from __future__ import annotations

import click

from tools.commands.params import schema_option


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=option)
        out[key.strip()] = value.strip()
    return out


@click.command()
@click.argument("query_file")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a DEFINE key for this run (e.g. --set flush=oop_slow).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Give a PARAM its value (e.g. --param min_bytes=100000).")
@click.option("--link", "links", multiple=True, metavar="NAME",
              help="A link name of the run (repeatable; NAME=path also accepted). "
                   "Default: the links the file names, else `main`.")
@schema_option
def explain(query_file: str, sets: tuple[str, ...], params: tuple[str, ...],
            links: tuple[str, ...], schema_files: tuple[str, ...]) -> None:
    """Explain QUERY_FILE: per query, the low-level part per link (protocol, WHERE, keys,
    window/pane, sub-aggregates, hash-table slots, flush policy) and the high-level part
    (union, super-aggregates, finalisation, HAVING, window assembly, join).

    QUERY_FILE is a path, or the name of a shipped query (`q8_1` finds
    queries/library/q8_1.gsql). Record protocols come from schema files: --schema, and the
    packet_schema.txt beside QUERY_FILE (as in GS-lite); the plan names the files read and,
    per record protocol, its record format and clock.
    """
    from queries.errors import QueryError
    from queries.explain import explain_text, find_query_file
    from queries.schemafile import schema_for

    path = find_query_file(query_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file (nor a shipped query of that name)",
                         path=str(query_file)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryError(f"cannot read the query file: {exc}", path=str(path)) from None
    link_names = [name.partition("=")[0].strip() for name in links]
    schema = schema_for([path], schema_files)
    click.echo(explain_text(text, path=str(path), links=link_names or None,
                            params=_pairs(params, "--param"),
                            overrides=_pairs(sets, "--set"), schema=schema), nl=False)
