"""Duration and count parameters (`10s`, `1min`, `2h`, `5M`) shared by the oopscope commands."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.commands.params import (
    COUNT,
    DURATION,
    format_duration,
    parse_count,
    parse_duration,
)

NS = 1_000_000_000


@pytest.mark.parametrize("text, ns", [
    ("10s", 10 * NS), ("1min", 60 * NS), ("2h", 7200 * NS), ("250ms", 250_000_000), ("1.5s", 1_500_000_000),
    ("30", 30 * NS), ("5 min", 300 * NS), ("1d", 86400 * NS), ("7us", 7000), ("3ns", 3), ("0s", 0),
    ("2m", 120 * NS), ("1H", 3600 * NS), (".5s", NS // 2),
])
def test_parse_duration(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "s", "10 parsecs", "-5s", "1e3s", "10s5", "ten seconds"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text, n", [("5M", 5_000_000), ("260k", 260_000), ("1000", 1000), ("1.5M", 1_500_000),
                                     ("2G", 2_000_000_000), ("110K", 110_000)])
def test_parse_count(text, n):
    assert parse_count(text) == n


@pytest.mark.parametrize("text", ["", "5X", "-1", "1.5", "0.0001k", "M"])
def test_parse_count_rejects(text):
    with pytest.raises(ValueError):
        parse_count(text)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=10**15))
def test_format_duration_round_trips(ns):
    assert parse_duration(format_duration(ns)) == ns


def test_click_types_give_usage_errors():
    @click.command()
    @click.option("--d", type=DURATION, default="1min")
    @click.option("--n", type=COUNT, default="5M")
    def cmd(d, n):
        click.echo(f"{d} {n}")

    runner = CliRunner()
    assert runner.invoke(cmd, []).output.strip() == f"{60 * NS} 5000000"
    assert runner.invoke(cmd, ["--d", "2h", "--n", "260k"]).output.strip() == f"{7200 * NS} 260000"
    bad = runner.invoke(cmd, ["--d", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output and "--d" in bad.output


def test_active_timeouts_for_all_and_per_exporter():
    """`--netflow-in-active-timeout D` and repeated `EXPORTER=D`: the default for exporters
    given none is 30 min; addresses are kept canonical (a v4-mapped one as its IPv4)."""
    from tools.commands.params import ActiveTimeouts, active_timeouts

    assert active_timeouts(()) == ActiveTimeouts(1800 * NS, ())
    assert active_timeouts(("60s",)) == ActiveTimeouts(60 * NS, ())
    got = active_timeouts(("10min", "192.0.2.1=60s", "[2001:DB8::1]=2min",
                           "::ffff:198.51.100.7=1h", "192.0.2.1=1min"))
    assert got == ActiveTimeouts(600 * NS, (("192.0.2.1", 60 * NS), ("198.51.100.7", 3600 * NS),
                                            ("2001:db8::1", 120 * NS)))


@pytest.mark.parametrize("values, message", [
    (("router1=60s",), "'router1' in 'router1=60s' is not an exporter's IP address"),
    (("192.0.2.1=soon",), "not a duration: 'soon'"),
    (("192.0.2.1=",), "not a duration: ''"),
    (("1min", "2min"), "two active timeouts for every exporter (1min and 2min)"),
    (("192.0.2.1=1min", "192.0.2.1=2min"), "two active timeouts for exporter 192.0.2.1"),
])
def test_active_timeouts_malformed(values, message):
    from tools.commands.params import active_timeouts

    with pytest.raises(ValueError) as err:
        active_timeouts(values)
    assert message in str(err.value)


@pytest.mark.parametrize("command", ["run", "serve", "agent"])
def test_active_timeout_malformed_on_every_command(command, tmp_path):
    """One clear usage line naming the option, exit 2, no traceback, before anything runs."""
    import sys

    from tests.tools.resuming import run_here

    args = {"run": ["run", "q8_1", "--netflow-in", "r1=127.0.0.1:9"],
            "serve": ["serve", "--netflow-in", "r1=127.0.0.1:9", "--state", str(tmp_path)],
            "agent": ["agent", "q8_1", "--netflow-in", "r1=127.0.0.1:9", "--spool",
                      str(tmp_path)]}[command]
    r = run_here([sys.executable, "-m", "tools.cli", *args, "--netflow-in-active-timeout",
                  "10min", "--netflow-in-active-timeout", "edge-router=60s"], check=False)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "--netflow-in-active-timeout" in r.stderr
    assert "'edge-router' in 'edge-router=60s' is not an exporter's IP address" in r.stderr
