"""`oopscope serve`'s live page in headless Chromium (Selenium): the tables fill, the chart draws,
a closed window arrives by server-sent event, and the console stays clean; with a token, the
page logs in (a form, or `#token=` taken out of the address) and its URLs never hold it; with
10-second windows and a kill -9 and restart, the chart's x axis reads the windows' real times,
keeps the windows written before the crash, and its y labels are distinct.

The server is the real one, started by the `served_page` fixture (tests/tools/conftest.py): its
`.url` is the page, its `.query` a running query whose windows close about every second.
"""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.tools.serving import Server, per_window, read_output, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TIMEOUT = 60  # seconds, for each wait on the page

_MISSING = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
# a mark, not a skip in a fixture: decided before the server is started
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"{' and '.join(_MISSING)} missing "
                       "(Debian packages chromium and chromium-driver, .ci/install)"),
]

# Pixels of the chart's canvas that are strongly coloured: the axes, grid and labels are grey,
# only the series (its line, points and fill) has colour.
COLOURED_PIXELS_JS = """
const canvas = document.querySelector('#chart canvas');
const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < px.length; i += 4) {
    const r = px[i], g = px[i + 1], b = px[i + 2], a = px[i + 3];
    if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) > 60) n++;
}
return n;
"""

# Clicks the query's row in #queries (in one step: the page may rebuild the table at any time);
# then which row is selected.
CLICK_QUERY_JS = """
for (const tr of document.querySelectorAll('#queries tbody tr[data-name]'))
    if (tr.dataset.name === arguments[0]) { tr.click(); return true; }
return false;
"""
SELECTED_JS = "const tr = document.querySelector('#queries tr.selected'); return tr && tr.dataset.name;"

# The header of #rows and its first row's cells (in one step, as the page rebuilds the table).
ROWS_JS = """
const texts = (sel) => [...document.querySelectorAll(sel)].map(e => e.textContent);
return [texts('#rows thead th'), texts('#rows tbody tr:first-child td')];
"""

# The chart's data as drawn: windows (x) and the summed column (y) per window.
CHART_JS = """
const u = window.oopscope && window.oopscope.chart;
return u ? {x: u.data[0].length, y: u.data[1].filter(v => v !== null).length,
            label: u.series[1].label} : null;
"""


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module (~1.7 CPU-seconds a start); `browser` gives each
    test a clean one."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                "--disable-dev-shm-usage", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # a driver path given: Selenium does not run selenium-manager (nothing is downloaded)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium):
    """The module's Chromium as a fresh one: on a blank page, no cookie, no console entry
    left by the test before (each test reads the console from its start)."""
    chromium.get("about:blank")
    chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})   # every site's, not one
    chromium.get_log("browser")
    return chromium


TOKEN = "page-test-token-0123456789abcdef"
# the links table filled from api/status and the status events, and the stream said live
LIVE_JS = """
return document.querySelectorAll('#links tbody tr td.num').length > 0
    && document.getElementById('conn').textContent === 'live';
"""


def test_live_page_with_a_token(ten_seconds_pcap, browser, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--token-file",
                     str(token_file)], tmp_path / "state", tmp_path / "serve.log",
                    token=TOKEN).start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        wait = WebDriverWait(browser, TIMEOUT, poll_frequency=0.5,
                             ignored_exceptions=(NoSuchElementException,
                                                 StaleElementReferenceException))
        # no token yet: the page asks for it; a wrong one is refused
        browser.get(url)
        form = wait.until(lambda d: d.find_element(By.ID, "login").is_displayed() and
                          d.find_element(By.ID, "login"), "the page did not ask for the token")
        field = browser.find_element(By.ID, "login-token")
        field.send_keys(TOKEN + "x")
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait.until(lambda d: "wrong token" in d.find_element(By.ID, "login-error").text,
                   "a wrong token was not refused")
        assert not browser.get_cookies()
        field.clear()
        field.send_keys(TOKEN)
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait.until(lambda d: d.execute_script(LIVE_JS), "the page did not go live")
        assert not browser.find_element(By.ID, "login").is_displayed()
        cookies = browser.get_cookies()
        assert len(cookies) == 1 and cookies[0]["httpOnly"] and \
            cookies[0]["sameSite"] == "Strict" and TOKEN not in cookies[0]["value"]
        assert browser.execute_script("return document.cookie") == ""   # out of scripts' reach

        # `#token=T`: logged in, and the token gone from the address before anything else
        browser.delete_all_cookies()
        browser.get("about:blank")
        browser.get(f"{url}#token={TOKEN}")
        wait.until(lambda d: d.execute_script(LIVE_JS), "the page did not go live")
        assert browser.current_url == url
        assert TOKEN not in browser.execute_script("return location.href + history.state")

        # the console: only the 401s of the first load, before the token was given
        logs = browser.get_log("browser")
        errors = [e for e in logs if e["level"] == "SEVERE" and "401" not in e["message"]]
        assert not errors, errors
        assert not any(TOKEN in e["message"] for e in logs)
    finally:
        server.stop()


TEN_SECONDS = """
DEFINE { query_name tens; }
SELECT tb, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/10 AS tb;
"""

# The chart as drawn: its points (x: s since the epoch, y: the sum or null where windows are
# missing), the tick labels uPlot drew on each axis, the y scale, the legend's x label.
DRAWN_JS = """
const u = window.oopscope && window.oopscope.chart;
if (!u || !u.axes[0]._values || !u.axes[1]._values) return null;
return {x: u.data[0], y: u.data[1], xticks: u.axes[0]._values, yticks: u.axes[1]._values,
        ymin: u.scales.y.min, xlabel: u.series[0].label, axis: u.axes[0].label};
"""
# The selected query's row of #queries: its cells' texts by column header.
QUERY_ROW_JS = """
const heads = [...document.querySelectorAll('#queries thead th')].map(th => th.textContent);
const tr = document.querySelector('#queries tbody tr.selected');
if (!tr) return null;
const out = {};
[...tr.cells].forEach((td, i) => { out[heads[i]] = td.textContent; out[heads[i] + ' title'] = td.title; });
return out;
"""
# Per link, the samples and the points of its drops sparkline.
DROPS_JS = """
return [...document.querySelectorAll('#links tbody tr[data-link]')].map(tr => {
  const svg = tr.querySelector('svg.drops');
  return svg && {link: tr.dataset.link, samples: +svg.dataset.samples,
                 points: [...svg.querySelectorAll('polyline')].map(p => p.getAttribute('points'))};
});
"""


def _hms(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S")


def test_ten_second_windows_across_a_restart(ten_seconds_pcap, browser, tmp_path):
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop"], tmp_path / "state",
                    tmp_path / "serve.log")
    server.start()
    try:
        server.wait_spark()
        out = Path(server.client.submit(text=TEN_SECONDS, file="tens.gsql")["outputs"]["tens"])
        wait_for(lambda: len(per_window(read_output(out)[0])) >= 2, 120,
                 "two 10-second windows written")
        before = per_window(read_output(out)[0])

        # kill -9 and start again on the same state: the query resumes, its windows go on
        server.kill9()
        server.start()
        server.wait_spark()
        wait_for(lambda: max(per_window(read_output(out)[0])) > max(before) + 1, 120,
                 "a window written after the restart")
        written = per_window(read_output(out)[0])
        assert before.items() <= written.items()

        wait = WebDriverWait(browser, TIMEOUT, poll_frequency=0.5,
                             ignored_exceptions=(NoSuchElementException,
                                                 StaleElementReferenceException))
        browser.get(server.client.server)
        wait.until(lambda d: d.execute_script(CLICK_QUERY_JS, "tens"), "no query tens")
        wait.until(lambda d: d.execute_script(SELECTED_JS) == "tens", "tens not selected")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#ycol option[value=packets]"),
                   "no column packets to chart")
        Select(browser.find_element(By.ID, "ycol")).select_by_value("packets")
        # the history holds every window written, those before the crash too
        drawn = wait.until(lambda d: (c := d.execute_script(DRAWN_JS)) and "packets" in
                           d.execute_script(CHART_JS)["label"] and
                           {int(x) for x, y in zip(c["x"], c["y"]) if y is not None}
                           >= {tb * 10 for tb in written} and c,
                           f"the chart does not hold the windows {sorted(written)}")
        shown = {int(x): y for x, y in zip(drawn["x"], drawn["y"]) if y is not None}
        assert min(shown) == min(before) * 10            # the first window: before the crash
        for tb in before:
            assert shown[tb * 10] == before[tb], tb      # each window at tb * 10 s, its count

        # x: each tick label is a window's real time, tb * 10 s as a time of day in UTC (the
        # old axis took tb for seconds: tb = 179579942 read 11:19:02, not 17:10:20)
        xticks = [t for t in drawn["xticks"] if t]
        assert xticks and len(set(xticks)) == len(xticks), xticks
        starts = {_hms(t): t for t in range(min(shown), max(shown) + 1, 10)}
        # HH:MM:SS, or HH:MM when the ticks are whole minutes apart
        assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) and
                   (t if len(t) == 8 else t + ":00") in starts for t in xticks), \
            (xticks, sorted(starts))
        assert drawn["xlabel"] == "tb (UTC)" and "window start" in drawn["axis"], drawn
        # y: from 0 (a difference of a packet in thousands is not a spike), labels distinct
        yticks = [t for t in drawn["yticks"] if t]
        assert len(yticks) >= 2 and len(set(yticks)) == len(yticks), yticks
        assert drawn["ymin"] == 0

        # the queries table: lag p50 / p99, the first window in UTC, the gaps the API gives
        q = server.client.queries()[0]
        row = wait.until(lambda d: d.execute_script(QUERY_ROW_JS), "no selected query row")
        first = datetime.fromtimestamp(q["first_window_ns"] / 1e9, UTC)
        assert row["first window (UTC)"] == first.strftime("%Y-%m-%d %H:%M:%S"), row
        assert row["gaps"] == str(len(q["gaps"])), (row, q["gaps"])
        if q["gaps"]:
            assert "UTC" in row["gaps title"], row
        assert re.fullmatch(r"(\d+ ms|\d+\.\d\d s|–) / (\d+ ms|\d+\.\d\d s|–)",
                            row["lag p50 / p99"]), row
        # the links' drops a second over time: a line per counter once two statuses came
        drops = wait.until(lambda d: (x := d.execute_script(DROPS_JS)) and
                           all(v and v["samples"] >= 3 for v in x) and x,
                           "no drops sparkline with 3 samples")
        assert [v["link"] for v in drops] == ["main"]
        assert all(len(p.split()) >= 2 for p in drops[0]["points"]), drops

        wait.until(lambda d: d.execute_script(COLOURED_PIXELS_JS) > 50, "no series drawn")
        time.sleep(0.5)       # the legend and ticks of the last redraw
        shot = tmp_path / "serve_page_restart.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0
        print(f"screenshot: {shot}")
        logs = browser.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE"], logs
    finally:
        server.stop()


def _rows_seen(driver) -> int:
    return int(driver.find_element(By.ID, "rows").get_attribute("data-seen") or 0)


# The module's last test: the `served_page` server (module-scoped) is stopped right after it,
# not left replaying with its query through the other tests (~0.2 CPU-seconds a second).
def test_live_page(served_page, browser, tmp_path):
    wait = WebDriverWait(browser, TIMEOUT, poll_frequency=0.5,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    browser.get(served_page.url)
    assert browser.title == "oopscope"

    # links from api/status and the status events; the queries from api/queries
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#links tbody tr td.num"),
               "the links table did not fill")

    wait.until(lambda d: d.execute_script(CLICK_QUERY_JS, served_page.query),
               f"query {served_page.query!r} not in the queries table")
    wait.until(lambda d: d.execute_script(SELECTED_JS) == served_page.query, "the click did not select the query")

    # the history (api/queries/NAME/rows) and then the rows events fill the table and the chart
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#rows tbody tr"), "the rows table stayed empty")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart canvas"), "no chart canvas")
    wait.until(lambda d: (d.execute_script(CHART_JS) or {}).get("y", 0) > 1,
               "the chart did not get 2 windows with values")
    header, first = browser.execute_script(ROWS_JS)
    assert header and len(first) == len(header), (header, first)
    ycol = Select(browser.find_element(By.ID, "ycol"))
    assert ycol.first_selected_option.get_attribute("value"), "no column chosen for the chart"

    # the canvas really drew the series (it is drawn on the next animation frame)
    wait.until(lambda d: d.execute_script(COLOURED_PIXELS_JS) > 50, "the chart drew no series")

    # another closed window arrives by server-sent event and is appended
    seen = _rows_seen(browser)
    wait.until(lambda d: _rows_seen(d) > seen, "no rows event appended rows within the timeout")

    # choosing another column redraws the chart with it
    options = [o.get_attribute("value") for o in ycol.options]
    if len(options) > 1:
        other = next(o for o in options if o != ycol.first_selected_option.get_attribute("value"))
        ycol.select_by_value(other)
        wait.until(lambda d: other in (d.execute_script(CHART_JS) or {}).get("label", ""),
                   f"the chart did not switch to {other}")
        ycol.select_by_value(options[-1])
        wait.until(lambda d: d.execute_script(COLOURED_PIXELS_JS) > 50, "the chart drew no series")

    shot = tmp_path / "serve_page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0
    print(f"screenshot: {shot}")

    # the console: no errors at all, no warnings from the page's scripts
    logs = browser.get_log("browser")
    errors = [e for e in logs if e["level"] == "SEVERE"]
    warnings = [e for e in logs if e["level"] == "WARNING"
                and (e.get("source") in ("console-api", "javascript") or "/static/" in e["message"])]
    assert not errors, errors
    assert not warnings, warnings
