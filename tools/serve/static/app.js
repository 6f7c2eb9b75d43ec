// The live page of `oopscope serve`: links, queries, and for the selected query a chart of one
// numeric column per window and a table of its latest closed windows. Plain JS, no build step.
// Data: api/status, api/queries, api/queries/NAME/rows (JSON) and api/events (server-sent
// events: rows, status, queries). Paths are relative so the page works behind a path prefix.
// The chart's x is the query's window column, placed at the window's real time by the window
// the query's plan gives (`window` of its stream in api/queries: `tb` of `time/10 AS tb` is
// the 10-second window starting at tb * 10 s); a query without a window column gets a plain
// numeric axis of its first column.
// A server with a token answers 401 until the page logs in: the token, typed into the form or
// given as `#token=T` (a fragment never reaches the server, and is removed from the address
// and the history at once), is posted once to api/login, which sets an HttpOnly cookie that
// every later request, the event stream's included, carries. The token is never in a URL.
"use strict";

(() => {
  const TABLE_ROWS = 50;     // rows shown in #rows, newest first
  const HISTORY = 500;       // rows fetched when a query is selected
  const KEEP_ROWS = 1000;    // raw rows kept (the chart keeps per-window sums instead)
  const MAX_POINTS = 1000;   // windows kept and drawn
  const CHART_HEIGHT = 240;
  const DROP_SAMPLES = 300;  // per link, samples of its drop counters kept for its sparkline
  const DROP_EVERY_MS = 2000;  // at most one sample per link this often (status events come faster)

  const state = {
    queries: [],      // api/queries
    selected: null,   // name of the selected query
    stream: null,     // the stream of it shown (its first)
    selectionKey: "", // what the selection was made from (name, stream, state)
    columns: [],      // its columns
    numeric: [],      // its numeric columns
    window: null,     // its window (api/queries `streams[0].window`), or null: none
    xi: 0,            // the column of the chart's x: the window's, else the first
    ycol: null,       // the column charted
    rows: [],         // its latest rows, oldest first
    windows: new Map(),  // x (window) -> per column, the sum over the window's rows (numeric only)
    ordinal: new Map(),  // x values that are not numbers, in order of arrival
    seen: 0,          // rows received for it (history and events)
    loading: false,   // history fetch in flight: rows events wait in `pending`
    pending: [],
    historyError: null,
    epoch: 0,         // bumped on every selection, to drop answers for an earlier one
    chart: null,
    chartKey: "",
    chartKeys: [],    // the window column's value of each point drawn
    queriesKey: "",   // what #queries shows
    drops: new Map(), // link -> [{t, ring, kernel}], from the status events (the sparklines)
    ticks: { x: [], y: [] },  // the chart's tick labels as last drawn (for the browser test)
  };
  window.oopscope = state;  // for the browser test and for poking at the page

  // ---- helpers -------------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  function api(path, params = {}) {
    const s = new URLSearchParams(params).toString();
    return s ? `${path}?${s}` : path;
  }

  class Unauthorised extends Error {}

  async function getJSON(path, params) {
    const r = await fetch(api(path, params), { cache: "no-store" });
    if (r.status === 401) throw new Unauthorised(`${path}: the server wants its token`);
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") e.className = v;
      else if (k === "title") e.title = v;
      else e.dataset[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  const td = (text, cls) => el("td", cls ? { class: cls } : null, text);
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);

  function fmtInt(n) {
    return isNum(n) ? Math.round(n).toLocaleString("en-US") : "–";
  }

  function fmtSI(n, unit = "") {
    if (!isNum(n)) return "–";
    const prefixes = ["", "k", "M", "G", "T", "P"];
    let i = 0;
    while (Math.abs(n) >= 1000 && i < prefixes.length - 1) { n /= 1000; i++; }
    const digits = i === 0 && Number.isInteger(n) ? 0 : Math.abs(n) < 10 ? 2 : Math.abs(n) < 100 ? 1 : 0;
    return `${n.toFixed(digits)} ${prefixes[i]}${unit}`.trim();
  }

  function fmtUTC(ns, ms = false) {
    if (!isNum(ns)) return "–";
    return new Date(ns / 1e6).toISOString().replace("T", " ").slice(0, ms ? 23 : 19);
  }

  // ns since the epoch between 1973 and 5138: a date; anything else (a clock of the records'
  // own, counting from elsewhere) is shown as a number of seconds
  const isEpochNs = (ns) => isNum(ns) && ns >= 1e17 && ns < 1e20;

  function fmtWhen(ns) {
    if (!isNum(ns) || ns === 0) return "–";
    return isEpochNs(ns) ? fmtUTC(ns) : `${fmtCell(ns / 1e9)} s`;
  }

  function fmtUptime(s) {
    if (!isNum(s)) return "";
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24;
    const m = Math.floor(s / 60) % 60, sec = s % 60, p = (x) => String(x).padStart(2, "0");
    if (d) return `${d}d ${p(h)}h`;
    if (h) return `${h}h ${p(m)}m`;
    if (m) return `${m}m ${p(sec)}s`;
    return `${sec}s`;
  }

  function fmtLatency(s) {
    if (!isNum(s)) return "–";
    return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`;
  }

  // The labels of ticks, each made by `fmt(v, digits)` with the fewest digits (from `from`) that
  // tell every tick apart: two ticks never read the same.
  function distinctLabels(vals, fmt, from = 0, to = 9) {
    let labels = [];
    for (let d = from; d <= to; d++) {
      labels = vals.map((v) => (v == null ? "" : fmt(v, d)));
      const shown = labels.filter((l) => l !== "");
      if (new Set(shown).size === shown.length) break;
    }
    return labels;
  }

  function fmtCell(v) {
    if (v === null || v === undefined) return "null";
    if (typeof v === "number" && !Number.isInteger(v)) return String(+v.toPrecision(6));
    return String(v);
  }

  // ---- header and links ----------------------------------------------------------------------

  function setConn(ok, text) {
    const c = $("conn");
    c.textContent = text || (ok ? "live" : "reconnecting");
    c.className = `badge conn ${ok ? "ok" : "bad"}`;
  }

  function renderStatus(st) {
    $("uptime").textContent = `up ${fmtUptime(st.uptime_s)}`;
    const spark = $("spark");
    spark.textContent = st.spark ? st.spark.state : "?";
    spark.className = `badge state-${st.spark ? st.spark.state : "unknown"}`;
    spark.title = st.spark ? [st.spark.master, st.spark.error].filter(Boolean).join("\n") : "";

    const gaps = st.gaps || [];
    const g = $("gaps");
    g.replaceChildren();
    g.className = gaps.length ? "meta warn" : "meta";
    if (gaps.length) {
      const last = gaps[gaps.length - 1];
      g.append(`${gaps.length} gap${gaps.length > 1 ? "s" : ""}, last ${fmtUTC(last.from_ns)} – `
        + `${fmtUTC(last.to_ns)} UTC (${last.reason})`);
      g.title = gaps.map((x) => `${fmtUTC(x.from_ns)} – ${fmtUTC(x.to_ns)} UTC: ${x.reason}`).join("\n");
    }

    // the agents' links (`serve --spool`) beside the server's own
    const lent = [];
    for (const a of st.agents || []) {
      const state = a.live ? a.state : (a.state === "running" ? "silent" : a.state);
      for (const [name, l] of Object.entries(a.links || {})) {
        lent.push({ name, source: `agent ${a.host} (${state}, beat ${a.age_s.toFixed(1)} s ago)`,
          pps: l.pps, bps: null, packets: l.packets, malformed: l.malformed,
          ring_drops: l.ring_drops, kernel_drops: l.kernel_drops, punctuation_ns: l.punctuation,
          error: a.live ? l.error : `agent ${a.host} ${state}` });
      }
    }
    const links = [...(st.links || []), ...lent];
    sampleDrops(links);
    const body = $("links").tBodies[0];
    body.replaceChildren(...links.map((l) => el("tr", { link: l.name },
      el("td", l.error ? { class: "warn", title: l.error } : null, l.name), td(l.source, "dim"),
      td(fmtSI(l.pps), "num"), td(fmtSI(isNum(l.bps) ? l.bps / 8 : null, "B"), "num"),   // bps: bits/s
      td(fmtInt(l.packets), "num"), td(fmtInt(l.malformed), l.malformed ? "num warn" : "num"),
      td(fmtInt(l.ring_drops), l.ring_drops ? "num warn" : "num"),
      td(fmtInt(l.kernel_drops), l.kernel_drops ? "num warn" : "num"),
      el("td", { class: "spark" }, dropSparkline(l.name)), td(fmtUTC(l.punctuation_ns)))));
    if (!body.rows.length) body.append(el("tr", null, el("td", { class: "empty" }, "no links")));
  }

  // ---- the links' drops over time: a sparkline per link of ring and kernel drops a second ----

  function sampleDrops(links) {
    const now = Date.now();
    for (const l of links) {
      let s = state.drops.get(l.name);
      if (!s) state.drops.set(l.name, (s = []));
      if (s.length && now - s[s.length - 1].t < DROP_EVERY_MS) continue;
      s.push({ t: now, ring: isNum(l.ring_drops) ? l.ring_drops : null,
        kernel: isNum(l.kernel_drops) ? l.kernel_drops : null });
      if (s.length > DROP_SAMPLES) s.splice(0, s.length - DROP_SAMPLES);
    }
  }

  // drops a second between samples; a counter that went down started again from zero (a
  // restart of the server or of the link): all it holds is new
  function dropRates(samples, key) {
    const out = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1], b = samples[i];
      if (a[key] === null || b[key] === null) { out.push(null); continue; }
      const d = b[key] >= a[key] ? b[key] - a[key] : b[key];
      out.push(d / Math.max(1e-3, (b.t - a.t) / 1000));
    }
    return out;
  }

  const SVG = "http://www.w3.org/2000/svg";

  function dropSparkline(name) {
    const samples = state.drops.get(name) || [];
    const W = 120, H = 22;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "drops");
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const series = { ring: dropRates(samples, "ring"), kernel: dropRates(samples, "kernel") };
    const peak = Math.max(0, ...series.ring.filter(isNum), ...series.kernel.filter(isNum));
    const n = Math.max(1, samples.length - 2);   // the rates since the page opened, end to end
    for (const key of ["ring", "kernel"]) {
      const rates = series[key];
      const pts = rates.map((r, i) => (isNum(r)
        ? `${(W - (rates.length - 1 - i) * (W / n)).toFixed(1)},${(H - 1 - (peak ? r / peak : 0) * (H - 3)).toFixed(1)}`
        : null)).filter(Boolean);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", key);
      line.setAttribute("points", pts.join(" "));
      svg.append(line);
    }
    const minutes = samples.length > 1 ? (samples[samples.length - 1].t - samples[0].t) / 60000 : 0;
    const title = document.createElementNS(SVG, "title");
    title.textContent = samples.length < 2 ? "drops a second: waiting for a second status"
      : `drops a second over the last ${minutes.toFixed(1)} min (ring: blue, kernel: orange); `
        + `peak ${fmtSI(peak)}/s`;
    svg.append(title);
    svg.dataset.peak = peak;
    svg.dataset.samples = samples.length;
    return svg;
  }

  // ---- queries -------------------------------------------------------------------------------

  const queryByName = (name) => state.queries.find((q) => q.name === name);

  function setQueries(data) {
    state.queries = data.queries || [];
    const cur = queryByName(state.selected);
    if (!cur) {
      const pick = state.queries.find((q) => q.state === "running") || state.queries[0];
      if (pick) select(pick.name);
    } else if (selectionKey(cur) !== state.selectionKey) {
      select(cur.name);    // started again, cancelled, failed, or another first stream: start over
    } else if (setColumns(state.rows.length ? state.columns : cur.columns, cur.numeric)) {
      drawChart();
    }
    renderQueries();
  }

  function renderQueries() {
    const body = $("queries").tBodies[0];
    // rebuilt only when something shown changed, so a row under the pointer stays put
    const key = JSON.stringify([state.selected, state.queries]);
    if (state.queriesKey !== key) {
      state.queriesKey = key;
      body.replaceChildren(...state.queries.map((q) => el("tr",
        { name: q.name, class: q.name === state.selected ? "selected" : "" },
        td(q.name), el("td", null, el("span", { class: `badge state-${q.state}`, title: q.error || "" }, q.state)),
        td(q.links.join(", "), "dim"), td(fmtInt(q.rows_out), "num"),
        td(fmtInt(q.late_packets), q.late_packets ? "num warn" : "num"),
        td(fmtInt(q.evictions), q.evictions ? "num warn" : "num"),
        el("td", { class: "num", title: "from the punctuation that closed a window to its rows written" },
          `${fmtLatency(q.latency_p50_s)} / ${fmtLatency(q.latency_p99_s)}`),
        el("td", { class: "first" }, fmtWhen(q.first_window_ns)), gapsCell(q.gaps || []))));
      if (!body.rows.length) body.append(el("tr", null, el("td", { class: "empty" }, "no queries")));
    }
    const q = queryByName(state.selected);
    const err = $("query-error");
    err.hidden = !(q && q.error);
    err.textContent = q && q.error ? q.error : "";
  }

  function gapsCell(gaps) {
    const c = el("td", { class: gaps.length ? "num warn" : "num" }, fmtInt(gaps.length));
    c.title = gaps.map((g) => `${fmtWhen(g.from_ns)} – ${fmtWhen(g.to_ns)}`
      + `${isEpochNs(g.from_ns) ? " UTC" : ""}: ${g.reason || "?"}`).join("\n");
    return c;
  }

  // ---- the selected query: rows and chart ----------------------------------------------------

  // A query (a submission) writes one or more streams; the page shows its first, whose name
  // the rows events carry and the rows API takes.
  const streamOf = (q) => (q.streams && q.streams.length && q.streams[0].stream) || q.name;
  const windowOf = (q) => (q.streams && q.streams.length && q.streams[0].window) || null;
  const selectionKey = (q) => `${q.name}|${streamOf(q)}|${q.state}|${JSON.stringify(windowOf(q))}`;

  async function select(name) {
    const q = queryByName(name);
    if (!q) return;
    const epoch = ++state.epoch;
    const running = q.state === "running";
    Object.assign(state, {
      selected: name, stream: streamOf(q), selectionKey: selectionKey(q), columns: [], numeric: [],
      window: windowOf(q), ycol: null, rows: [], seen: 0, loading: running, pending: [],
      historyError: running ? null : `${q.state} query: no rows kept here`,
    });
    setColumns(q.columns, q.numeric);
    const title = state.stream === name ? name : `${name}: ${state.stream}`;
    $("chart-title").textContent = title;
    $("rows-name").textContent = ` of ${title}`;
    renderQueries();
    renderRows();
    drawChart();
    if (!running) return;
    try {
      const data = await getJSON(`api/queries/${encodeURIComponent(state.stream)}/rows`, { limit: HISTORY });
      if (epoch !== state.epoch) return;
      state.rows = data.rows || [];
      state.seen = state.rows.length;
      if (!setColumns(data.columns && data.columns.length ? data.columns : state.columns, state.numeric)) {
        addWindows(state.rows);
      }
    } catch (e) {
      if (epoch !== state.epoch) return;
      state.historyError = `history not loaded: ${e.message}`;
    }
    state.loading = false;
    for (const ev of state.pending) appendRows(ev, true);
    state.pending = [];
    renderRows();
    drawChart();
  }

  function appendRows(ev, maybeSeen) {
    const rows = ev.rows || [];
    if (maybeSeen && rows.length && rows.length <= state.rows.length) {
      // an event that came during the history fetch may already be in the history
      const tail = state.rows.slice(-rows.length);
      if (JSON.stringify(tail) === JSON.stringify(rows)) return;
    }
    state.rows.push(...rows);
    if (state.rows.length > KEEP_ROWS) state.rows.splice(0, state.rows.length - KEEP_ROWS);
    state.seen += rows.length;
    if (!setColumns(ev.columns && ev.columns.length ? ev.columns : state.columns, state.numeric)) addWindows(rows);
  }

  let queriesSoon = null;

  function onRows(ev) {
    // the counters of the queries (rows out, latency) moved: ask for them once the burst is over
    clearTimeout(queriesSoon);
    queriesSoon = setTimeout(() => refresh("api/queries", setQueries), 300);
    if (ev.query !== state.stream) return;
    if (state.loading) { state.pending.push(ev); return; }
    appendRows(ev, false);
    renderRows();
    drawChart();
  }

  function renderRows() {
    const table = $("rows"), head = table.tHead.rows[0];
    if ([...head.cells].map((th) => th.textContent).join() !== state.columns.join()) {
      head.replaceChildren(...state.columns.map((c) =>
        el("th", state.numeric.includes(c) ? { class: "num" } : null, c)));
    }
    const numeric = state.columns.map((c) => state.numeric.includes(c));
    const latest = state.rows.slice(-TABLE_ROWS).reverse();
    table.tBodies[0].replaceChildren(...latest.map((r) =>
      el("tr", null, ...r.map((v, i) => td(fmtCell(v), v === null ? "null" : numeric[i] ? "num" : "")))));
    table.dataset.seen = state.seen;
    const note = $("rows-note");
    note.hidden = state.rows.length > 0 || !state.selected;
    note.textContent = state.loading ? "loading…" : state.historyError || "no closed windows yet";
  }

  function fillYSelect() {
    const sel = $("ycol");
    const xcol = state.columns[state.xi];
    let choices = state.numeric.filter((c) => c !== xcol && state.columns.includes(c));
    if (!choices.length) choices = state.numeric.filter((c) => c !== xcol);
    if (!choices.includes(state.ycol)) state.ycol = choices.length ? choices[choices.length - 1] : null;
    if ([...sel.options].map((o) => o.value).join() !== choices.join()) {
      sel.replaceChildren(...choices.map((c) => new Option(c, c)));
    }
    sel.value = state.ycol || "";
    sel.disabled = !choices.length;
    sel.parentElement.hidden = !choices.length;
  }

  // Columns and numeric columns of the selected query; when they change, the per-window sums are
  // made again from the rows kept. True when they changed.
  function setColumns(columns, numeric) {
    if (columns.join() === state.columns.join() && numeric.join() === state.numeric.join()) return false;
    const w = state.window, wi = w ? columns.indexOf(w.column) : -1;
    Object.assign(state, { columns, numeric, xi: wi >= 0 ? wi : 0, windows: new Map(), ordinal: new Map() });
    addWindows(state.rows);
    fillYSelect();
    return true;
  }

  // Per window (x, the window column, else the first) and numeric column, the sum over the
  // window's rows (its groups, and late rows of a window already seen); the oldest windows
  // beyond MAX_POINTS dropped.
  function addWindows(rows) {
    const xi = state.xi;
    const idx = state.numeric.map((c) => state.columns.indexOf(c)).filter((i) => i >= 0 && i !== xi);
    for (const r of rows) {
      let x = r[xi];
      if (!isNum(x)) {
        if (!state.ordinal.has(x)) state.ordinal.set(x, state.ordinal.size);
        x = state.ordinal.get(x);
      }
      let w = state.windows.get(x);
      if (!w) state.windows.set(x, (w = new Array(state.columns.length).fill(null)));
      for (const i of idx) if (isNum(r[i])) w[i] = (w[i] ?? 0) + r[i];   // a window of nulls stays a gap
    }
    if (state.windows.size > MAX_POINTS) {
      const old = [...state.windows.keys()].sort((a, b) => a - b).slice(0, state.windows.size - MAX_POINTS);
      for (const x of old) state.windows.delete(x);
    }
  }

  // The window's time (s since the epoch) of window column value v: its start, or its end for
  // a sliding or landmark window (whose column, window_end, names its end). The window of
  // value v is number (v - shift) / scale, ending at (number + 1) * slide - offset.
  function windowAxis(w) {
    const slide = w.slide_ns / 1e9, range = w.range_ns / 1e9, offset = w.offset_ns / 1e9;
    const byEnd = w.range_ns !== w.slide_ns || !!w.landmark;
    const at = (v) => ((v - w.shift) / w.scale + 1) * slide - offset - (byEnd ? 0 : range);
    return { at, step: slide, label: byEnd ? "window end" : "window start" };
  }

  // The chart's points: x as drawn (the window's time, s, on a time axis; else the column's
  // value), y the window's sum. A time axis needs a window column, times between 1973 and
  // 5138, and windows of a millisecond or more (the axis' finest step).
  function chartData() {
    const yi = state.columns.indexOf(state.ycol);
    const keys = [...state.windows.keys()].sort((a, b) => a - b);
    const xcol = state.columns[state.xi] || "x";
    const none = { xs: [], ys: [], keys: [], time: false, step: null, xlabel: xcol };
    if (yi < 0) return none;
    const ys = keys.map((k) => state.windows.get(k)[yi]);
    const w = state.window && state.columns[state.xi] === state.window.column ? state.window : null;
    if (w && !state.ordinal.size) {
      const axis = windowAxis(w);
      const at = keys.map(axis.at);
      if (axis.step >= 1e-3 && at.length && at.every((x) => x >= 1e8 && x < 1e11)) {
        // windows missing (a gap, a restart, no packets): the line breaks there
        const out = { xs: [], ys: [], keys: [], time: true, step: axis.step,
          xlabel: `${xcol}, ${axis.label} (UTC)` };
        at.forEach((x, i) => {
          if (i && x - at[i - 1] > axis.step * 1.5) {
            out.xs.push(at[i - 1] + axis.step); out.ys.push(null); out.keys.push(null);
          }
          out.xs.push(x); out.ys.push(ys[i]); out.keys.push(keys[i]);
        });
        return out;
      }
    }
    return { ...none, xs: keys, ys, keys, integer: keys.every(Number.isInteger) };
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  // A number in SI units with `digits` decimals, trailing zeros dropped (1.50 k -> 1.5 k).
  function fmtSIDigits(v, digits) {
    const prefixes = ["", "k", "M", "G", "T", "P"];
    let i = 0, n = v;
    while (Math.abs(n) >= 1000 && i < prefixes.length - 1) { n /= 1000; i++; }
    const text = n.toFixed(digits).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
    return `${text === "-0" ? "0" : text} ${prefixes[i]}`.trim();
  }

  // y-axis ticks: SI units, with as many decimals as it takes to tell the ticks apart
  const fmtTicksY = (vals) => distinctLabels(vals, fmtSIDigits, 0, 9);

  // x-axis ticks of a plain number: as many decimals as it takes to tell them apart
  const fmtTicksX = (vals) => distinctLabels(vals, (v, d) => (Number.isInteger(v) && d === 0
    ? String(v) : v.toFixed(d)), 0, 9);

  // time-axis ticks in UTC: the time of day (with ms for steps under a second), the date
  // first when they span more than a day; finer until no two ticks read the same
  const TIME_FORMATS = ["{HH}:{mm}", "{HH}:{mm}:{ss}", "{HH}:{mm}:{ss}.{fff}"];

  function fmtTimeTicks(vals, incr) {
    const span = vals.length > 1 ? vals[vals.length - 1] - vals[0] : 0;
    const date = span >= 86400 || incr >= 86400;
    const from = incr < 1 ? 2 : incr % 60 ? 1 : 0;
    return distinctLabels(vals, (v, d) => {
      const f = (date ? "{YYYY}-{MM}-{DD} " : "") + TIME_FORMATS[Math.min(d, 2)];
      return uPlot.fmtDate(f)(uPlot.tzDate(new Date(v * 1e3), "Etc/UTC"));
    }, from, 2);
  }

  // Tick steps of a time axis: multiples of the window's step among the usual ones (so every
  // tick is a window's time), or the step times 1, 2, 5, 10 ... when none is one.
  const NICE_STEPS = [1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30,
    60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
    2592000, 31536000];

  function timeIncrs(step) {
    const multiple = (x) => Math.abs(x / step - Math.round(x / step)) < 1e-6 && x >= step * (1 - 1e-9);
    let incrs = NICE_STEPS.filter(multiple);
    if (!incrs.length || incrs[0] > step * (1 + 1e-9)) incrs = [step, ...incrs];
    if (incrs.length < 8) {
      for (let k = 1; incrs.length < 40; k *= 10) for (const m of [1, 2, 5]) incrs.push(step * m * k);
    }
    return [...new Set(incrs)].sort((a, b) => a - b);
  }

  // tick steps of a numeric axis of whole numbers (window numbers): whole numbers too
  const INTEGER_INCRS = [];
  for (let k = 1; k < 1e18; k *= 10) INTEGER_INCRS.push(k, 2 * k, 5 * k);

  // The y range: from 0 for values of one sign (counts, sums), so that a difference of one
  // packet in millions stays one packet tall; 5% above the top.
  function yRange(u, min, max) {
    if (!isNum(min) || !isNum(max)) return [0, 1];
    let lo = Math.min(0, min), hi = Math.max(0, max);
    if (lo === hi) hi = lo + 1;
    const pad = (hi - lo) * 0.05;
    return [lo < 0 ? lo - pad : lo, hi > 0 ? hi + pad : hi];
  }

  function chartOptions(width, data) {
    const { time, step, xlabel } = data;
    const fg = cssVar("--muted"), grid = cssVar("--grid"), accent = cssVar("--accent");
    const axis = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    const xcol = state.columns[state.xi] || "x";
    // the legend: the window's time and its number as the query wrote it
    const keyOf = (u, v) => { const i = u.data[0].indexOf(v); return i >= 0 ? state.chartKeys[i] : null; };
    return {
      width, height: CHART_HEIGHT,
      padding: [12, 40, 0, 0],   // room for the last x label
      scales: { x: { time }, y: { range: yRange } },
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
      axes: [
        { ...axis, ...(time ? { incrs: timeIncrs(step) } : data.integer ? { incrs: INTEGER_INCRS } : {}),
          space: 70,
          label: xlabel, labelSize: 18, labelFont: "12px system-ui, sans-serif",
          values: (u, vals, ai, space, incr) => {
            state.ticks.x = time ? fmtTimeTicks(vals, incr) : fmtTicksX(vals);
            return state.ticks.x;
          } },
        { ...axis, size: 64, values: (u, vals) => (state.ticks.y = fmtTicksY(vals)) },
      ],
      series: [
        { label: time ? `${xcol} (UTC)` : xcol,
          value: (u, v) => {
            if (v == null) return "–";
            if (!time) return fmtCell(v);
            const k = keyOf(u, v);
            return `${fmtUTC(v * 1e9, step < 1)}${k === null ? "" : ` (${xcol} ${fmtCell(k)})`}`;
          } },
        { label: `sum of ${state.ycol}`, stroke: accent, width: 2, fill: `${accent}22`,
          value: (u, v) => (v == null ? "–" : fmtCell(v)), points: { size: 5 } },
      ],
    };
  }

  function drawChart() {
    const box = $("chart");
    const data = chartData();
    const { xs, ys, time } = data;
    state.chartKeys = data.keys;
    if (!xs.length) {
      if (state.chart) { state.chart.destroy(); state.chart = null; state.chartKey = ""; }
      const why = !state.selected ? "" : !state.ycol ? "no numeric column to chart"
        : state.loading ? "loading…" : state.historyError || "no closed windows yet";
      box.replaceChildren(el("div", { class: "empty" }, why));
      return;
    }
    const key = `${state.epoch}|${state.ycol}|${time}|${data.step}|${data.xlabel}|${data.integer}`;
    if (!state.chart || state.chartKey !== key) {
      if (state.chart) state.chart.destroy();
      box.replaceChildren();
      state.chart = new uPlot(chartOptions(box.clientWidth, data), [xs, ys], box);
      state.chartKey = key;
    } else {
      state.chart.setData([xs, ys]);
    }
  }

  // ---- wiring --------------------------------------------------------------------------------

  $("queries").tBodies[0].addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-name]");
    if (tr && tr.dataset.name !== state.selected) select(tr.dataset.name);
  });
  $("ycol").addEventListener("change", (e) => { state.ycol = e.target.value; drawChart(); });
  new ResizeObserver(() => {
    if (state.chart) state.chart.setSize({ width: $("chart").clientWidth, height: CHART_HEIGHT });
  }).observe($("chart"));

  let events = null;

  function connect() {
    if (events) events.close();
    const es = events = new EventSource(api("api/events"));
    es.addEventListener("open", () => setConn(true));
    es.addEventListener("error", () => {
      setConn(false);
      // the browser reconnects by itself unless the server refused the stream (a 401 after
      // a restart with another token, or too many streams): then ask again, later
      if (es.readyState === EventSource.CLOSED && es === events) setTimeout(start, 5000);
    });
    es.addEventListener("status", (e) => { setConn(true); renderStatus(JSON.parse(e.data)); });
    es.addEventListener("queries", (e) => setQueries(JSON.parse(e.data)));
    es.addEventListener("rows", (e) => onRows(JSON.parse(e.data)));
  }

  async function refresh(path, apply) {
    try {
      apply(await getJSON(path));
    } catch (e) {
      if (e instanceof Unauthorised) askToken();
      else setConn(false, "server unreachable");
    }
  }

  // ---- the token (a server started with --token-file) ----------------------------------------

  async function login(token) {
    const r = await fetch("api/login", {
      method: "POST", cache: "no-store", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
    });
    if (!r.ok) {
      let why = `HTTP ${r.status}`;
      try { why = (await r.json()).error || why; } catch (e) { /* not JSON: the status says it */ }
      throw new Error(why);
    }
  }

  function askToken(why) {
    if (events) { events.close(); events = null; }
    setConn(false, "token needed");
    $("login").hidden = false;
    $("login-error").textContent = why || "";
    $("login-token").focus();
  }

  $("login").addEventListener("submit", async (e) => {
    e.preventDefault();
    const input = $("login-token");
    try {
      await login(input.value);
    } catch (err) {
      askToken(`not logged in: ${err.message}`);
      return;
    }
    input.value = "";
    $("login").hidden = true;
    start();
  });

  // A token given as #token=T: taken out of the address (and so of the history) first.
  async function fragmentLogin() {
    const given = new URLSearchParams(location.hash.slice(1)).get("token");
    if (given === null) return null;
    history.replaceState(null, "", location.pathname + location.search);
    try { await login(given); return null; } catch (err) { return `not logged in: ${err.message}`; }
  }

  let polling = null;

  async function start() {
    try {
      renderStatus(await getJSON("api/status"));
    } catch (e) {
      if (e instanceof Unauthorised) askToken();
      else { setConn(false, "server unreachable"); setTimeout(start, 5000); }
      return;
    }
    $("login").hidden = true;
    refresh("api/queries", setQueries);
    connect();
    // late packets, evictions and latency change between batches too
    if (polling === null) polling = setInterval(() => refresh("api/queries", setQueries), 3000);
  }

  const begin = () => fragmentLogin().then((why) => (why ? askToken(why) : start()));
  window.addEventListener("hashchange", () => {
    if (new URLSearchParams(location.hash.slice(1)).has("token")) begin();
  });
  begin();
})();
