"""Files a query names, read through `common.datafiles.DataFiles` by the planner (issue 34,
findings 1 and 3): `run`'s policy (any file its user names, but only a regular one, up to the
cap, never blocking) and the appliance's (only below its --data-dir directories)."""

from __future__ import annotations

import os
import threading

import pytest

from common.datafiles import ANY_FILE, NO_FILES, DataFileError, DataFiles
from queries.errors import QueryError
from queries.planner import plan_text

SECRET = "root:$6$SECRET-of-this-test:19000:0:99999:7:::"


def _lpm(path: str, files: DataFiles = ANY_FILE):
    return plan_text(f"SELECT time FROM IPV4 WHERE getlpmid(srcIP, '{path}') > 0", ["main"],
                     files=files)


def _regex(path: str, files: DataFiles = ANY_FILE):
    return plan_text(f"SELECT time FROM TCP WHERE str_file_regex_match(TCP_data, '{path}', 1, "
                     f"1)", ["main"], files=files)


def _refused(plan, path: str, files: DataFiles) -> str:
    """The planner's message for a refused file, planned on a thread so that a read that
    blocks fails the test instead of hanging it."""
    out: list = []

    def attempt():
        try:
            plan(path, files)
        except QueryError as exc:
            out.append(str(exc))
        else:
            out.append(None)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(30)
    assert out, f"planning with {path} did not return: the read blocked"
    assert out[0] is not None, f"{path} was read"
    return out[0]


@pytest.mark.parametrize("plan", [_lpm, _regex])
def test_run_reads_only_regular_files_without_blocking(tmp_path, plan):
    fifo = tmp_path / "feed.fifo"
    os.mkfifo(fifo)
    for path, rule in ((str(fifo), "not a regular file (a FIFO)"),
                       (str(tmp_path), "not a regular file (a directory)"),
                       ("/dev/zero", "under /proc, /sys, /dev: not a data file"),
                       ("/proc/self/environ", "under /proc, /sys, /dev: not a data file")):
        message = _refused(plan, path, ANY_FILE)
        assert f"{path}: {rule}" in message, message
        assert "PATH=" not in message


def test_size_cap_is_checked_on_the_status_and_while_reading(tmp_path):
    big = tmp_path / "big.tbl"
    big.write_text("0.0.0.0/0|1\n" * 100)
    small = DataFiles(max_bytes=1000)
    assert "larger than the 1000 B cap" in _refused(_lpm, str(big), small)
    # a file that grows after its status was read is still cut at the cap
    with open(big, "w") as f:
        f.write("0.0.0.0/0|1\n" * 10)
        f.flush()
        opened = small.open(str(big))
        f.write("0.0.0.0/0|1\n" * 100)
    with opened, pytest.raises(DataFileError, match="larger than the 1000 B cap"):
        opened.read()


def test_data_dirs_refuse_outside_before_looking(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "p.tbl").write_text("10.0.0.0/8|3\n")
    (data / "out.tbl").symlink_to(secret)
    (data / "sub").mkdir()
    (data / "sub" / "q.tbl").write_text("10.0.0.0/8|4\n")
    files = DataFiles.under([str(data)])
    # outside: one message whether the file exists, is missing or cannot be read
    messages = {p: _refused(_lpm, p, files) for p in
                (str(secret), str(tmp_path / "missing"), "/root/.ssh/id_rsa", "../shadow",
                 "out.tbl", "/proc/self/environ")}
    for path, message in messages.items():
        assert f"prefix file {path}: not under a --data-dir of this server ({data})" \
            in message, message
        assert "SECRET" not in message
    # inside: relative names from the first data directory, named by the resolved path
    plan = _lpm("p.tbl", files)
    assert plan.queries[0].low[0].predicate.left.arguments[1].value == str(data / "p.tbl")
    assert _lpm(str(data / "sub" / "q.tbl"), files)
    assert "not found (relative paths are read from the first --data-dir" in \
        _refused(_lpm, "nosuch.tbl", files)
    # no directory: no file at all, and the message says how to allow some
    message = _refused(_lpm, str(data / "p.tbl"), NO_FILES)
    assert "reads no files named in queries (start it with --data-dir DIR" in message


def test_errors_about_contents_name_the_line_not_its_text(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shadow.tbl").write_text(f"# comment\n{SECRET}\n")
    (data / "bytes.tbl").write_bytes(b"10.0.0.0/8|1\n\xff\xfe secret\n")
    (data / "re.txt").write_text("(SECRET-unclosed\n")
    files = DataFiles.under([str(data)])
    message = _refused(_lpm, "shadow.tbl", files)
    assert "prefix file shadow.tbl:2: the line is not a prefix line" in message
    assert "SECRET" not in message and "root" not in message
    message = _refused(_lpm, "bytes.tbl", files)
    assert "prefix file bytes.tbl:2: not UTF-8 text" in message and "secret" not in message
    message = _refused(_regex, "re.txt", files)
    assert "re.txt: is not a regular expression (missing ))" in message
    assert "SECRET" not in message
