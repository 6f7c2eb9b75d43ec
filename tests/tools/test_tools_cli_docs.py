"""docs/cli.md documents every option of every command, in that command's own section (the
`serve` table once lacked `--direction`, which the `run` section had: a check over the whole
page would not have seen it)."""

from __future__ import annotations

import re

import click
import pytest

from tests.conftest import REPO
from tools.cli import cli

DOC = REPO / "docs" / "cli.md"


def _sections() -> dict[str, str]:
    """Heading -> text of each `## ` section of docs/cli.md."""
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _commands() -> list[tuple[str, str, click.Command]]:
    """(top-level command, full name, command) for every command and group subcommand."""
    ctx = click.Context(cli)
    out = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            sub_ctx = click.Context(command, parent=ctx)
            for sub in command.list_commands(sub_ctx):
                out.append((name, f"{name} {sub}", command.get_command(sub_ctx, sub)))
        else:
            out.append((name, name, command))
    return out


def _long_options(command: click.Command) -> list[tuple[str, ...]]:
    """Each visible option's long names (a flag's `--wait/--no-wait`: either may be named)."""
    out = []
    for p in command.params:
        names = tuple(o for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
                      if o.startswith("--") and o != "--help")
        if isinstance(p, click.Option) and not p.hidden and names:
            out.append(names)
    return out


COMMANDS = _commands()


def undocumented(top: str, command: click.Command, sections: dict[str, str]) -> list[str]:
    """The options of `command` (of top-level command `top`) its docs section does not name;
    raises AssertionError when no section is its."""
    # a section of its own, or a row of a section's table (the client commands of `serve`)
    mine = [text for heading, text in sections.items()
            if re.search(rf"`oopscope {re.escape(top)}\b", heading)] or \
           [text for text in sections.values()
            if re.search(rf"^\| `oopscope {re.escape(top)}\b", text, flags=re.M)]
    assert mine, f"docs/cli.md has no section of `oopscope {top}`"
    text = "".join(mine)
    return ["/".join(names) for names in _long_options(command)
            if not any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)
                       for opt in names)]


@pytest.mark.parametrize("top, name, command", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_every_option_is_in_its_commands_section(top, name, command):
    missing = undocumented(top, command, _sections())
    assert not missing, f"docs/cli.md's section of `oopscope {top}` does not name " \
                        f"{', '.join(missing)} of `oopscope {name}`"


def test_the_check_sees_an_option_named_only_in_another_section():
    """The page before: `--direction` in the `run` section, not in the `serve` one."""
    sections = _sections()
    heading = next(h for h in sections if "`oopscope serve" in h)
    sections[heading] = sections[heading].replace("--direction", "")
    serve = next(command for _, name, command in COMMANDS if name == "serve")
    assert undocumented("serve", serve, sections) == ["--direction"]
    assert undocumented("serve", serve, _sections()) == []
