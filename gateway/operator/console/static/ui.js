// The console's building blocks, shared by its modules (app.js: routing and the operator's
// pages; people.js: users and top-up; square.js: the model square). Every piece of data reaches
// the page through textContent or attributes (never innerHTML), so nothing the store holds can
// run as code. The session is an HttpOnly cookie; the scripts keep only its CSRF token, and a
// key made in this tab (so that it can be tried), in memory: never in storage.

// role, csrf: the session's; route: the page shown; render: app.js's, to draw the page again;
// secrets: key id -> the secret of a key made in this tab (gone with it)
export const state = { role: null, csrf: "", route: "", render: async () => {}, secrets: new Map() };
export const PAGE = 25;
export const COLORS = ["#2456d6", "#e07b00", "#1e7b34", "#a0308f", "#b3261e", "#00838f", "#6d4c41", "#5b6475"];

// ---- small helpers ----------------------------------------------------------------------

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c) el.append(c);
  return el;
}

// one call: the decoded reply and its headers; an error reply throws with its message
export async function call(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET") headers["x-console-csrf"] = state.csrf;
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const type = r.headers.get("content-type") || "";
  const data = type.includes("json") ? await r.json() : null;
  if (!r.ok) {
    const err = new Error((data && data.error && data.error.message) || `HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return { data, headers: r.headers };
}

export async function api(method, path, body) { return (await call(method, path, body)).data; }

export function notice(message, ok = false) {
  const box = document.getElementById("notice");
  box.textContent = message || "";
  box.hidden = !message;
  box.className = ok ? "ok" : "";
}

export function money(v) {
  return v === null || v === undefined ? "—" : Number(v).toLocaleString(undefined, { maximumFractionDigits: 6 });
}

export function num(v) { return Number(v || 0).toLocaleString(); }

// the days' totals (``/usage/daily`` rows) summed per value of ``by`` (model, key_id), each
// with its prompt-cache hit rate: cache reads over every prompt token (fresh, read, written)
export function totalsBy(rows, by) {
  const out = new Map();
  for (const d of rows) {
    const t = out.get(d[by]) || { [by]: d[by], requests: 0, prompt_tokens: 0, completion_tokens: 0,
      cache_read_tokens: 0, cache_write_tokens: 0, cost: 0 };
    t.requests += d.requests; t.prompt_tokens += d.prompt_tokens; t.completion_tokens += d.completion_tokens;
    t.cache_read_tokens += d.cache_read_tokens || 0; t.cache_write_tokens += d.cache_write_tokens || 0;
    t.cost += Number(d.cost);
    out.set(d[by], t);
  }
  return [...out.values()];
}

export function hitRate(t) {
  return t.prompt_tokens ? `${(100 * t.cache_read_tokens / t.prompt_tokens).toFixed(1)}%` : "—";
}

// the columns of a totals table: requests, tokens, the cache classes and hit rate, cost
export const CACHE_COLUMNS = [
  { label: "Requests", num: true, value: r => num(r.requests) },
  { label: "Prompt tokens", num: true, value: r => num(r.prompt_tokens) },
  { label: "Completion tokens", num: true, value: r => num(r.completion_tokens) },
  { label: "Cache reads", num: true, value: r => num(r.cache_read_tokens) },
  { label: "Cache writes", num: true, value: r => num(r.cache_write_tokens) },
  { label: "Cache hit rate", num: true, value: r => hitRate(r) },
  { label: "Cost", num: true, value: r => money(r.cost) },
];

export function table(columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted", text: empty });
  return h("div", { class: "table-wrap" },
    h("table", {},
      h("thead", {}, h("tr", {}, columns.map(c => h("th", { scope: "col", class: c.num ? "num" : null, text: c.label })))),
      h("tbody", {}, rows.map(r => h("tr", {}, columns.map(c => {
        const v = c.value(r);
        return h("td", { class: c.num ? "num" : null }, v instanceof Node ? v : String(v ?? "—"));
      }))))));
}

export function paged(columns, rows, empty) {
  const box = h("div");
  let page = 0;
  const draw = () => {
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    page = Math.min(page, pages - 1);
    box.replaceChildren(...[
      table(columns, rows.slice(page * PAGE, (page + 1) * PAGE), empty),
      rows.length > PAGE ? h("div", { class: "pager" },
        h("button", { type: "button", disabled: page === 0, onclick: () => { page--; draw(); } }, "Previous"),
        h("span", { class: "muted", text: `Page ${page + 1} of ${pages} (${rows.length} rows)` }),
        h("button", { type: "button", disabled: page >= pages - 1, onclick: () => { page++; draw(); } }, "Next")) : null,
    ].filter(Boolean));
  };
  draw();
  return box;
}

// a search box over a small list, and the list's table (paged) of the rows it matches:
// ``text(row)`` gives the words a row is found by
export function searchable(id, placeholder, columns, rows, text, empty) {
  const input = h("input", { type: "search", id, placeholder, autocomplete: "off" });
  const list = h("div");
  const draw = () => {
    const q = input.value.trim().toLowerCase();
    const shown = rows.filter(r => !q || text(r).some(v => String(v ?? "").toLowerCase().includes(q)));
    list.replaceChildren(paged(columns, shown, rows.length ? "Nothing matches the search." : empty));
  };
  input.addEventListener("input", draw);
  draw();
  return [h("div", { class: "search" }, field("Search", input)), list];
}

export function field(label, input) { return h("label", {}, label, input); }

export async function copy(text, what) {
  try {
    await navigator.clipboard.writeText(text);
    notice(`${what} copied.`, true);
  } catch {
    notice(`Could not copy; select the ${what.toLowerCase()} and copy it by hand.`);
  }
}

export function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// every CSV the console writes: a text cell that a spreadsheet would take for a formula (it
// starts with = + - @, a tab or a carriage return: a client chooses its model's name, e.g.
// "=HYPERLINK(...)") is written with a ' in front, so it opens as the text it is
export function csv(rows, columns) {
  const cell = v => {
    let s = String(v ?? "");
    if (typeof v === "string" && /^[=+\-@\t\r]/.test(s)) s = "'" + s;
    return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
  };
  return [columns.join(","), ...rows.map(r => columns.map(c => cell(r[c])).join(","))].join("\n") + "\n";
}

// a width for a chart's drawing that is about its size on screen, so that its labels read
// at their own size on a phone and on a wide screen alike
export function chartWidth() {
  const main = document.getElementById("main");
  return Math.round(Math.min(1100, Math.max(280, (main ? main.clientWidth : 640) - 64)));
}

// a stacked bar chart of one value per day and model, with its axes: the highest day's total
// and zero beside the bars, the first and last day (and the middle one, when there is room)
// under them; a chart of nothing but zeros says so instead
export function chart(title, days, series, value, format = num, empty = "Nothing in these days.") {
  const names = [...new Set(series.filter(s => Number(value(s))).map(s => s.model))].sort();
  const color = n => COLORS[names.indexOf(n) % COLORS.length];
  const byDay = new Map(days.map(d => [d, new Map()]));
  for (const s of series) {
    const m = byDay.get(s.day);
    if (m) m.set(s.model, (m.get(s.model) || 0) + Number(value(s)));
  }
  const totals = days.map(d => [...byDay.get(d).values()].reduce((a, b) => a + b, 0));
  const max = Math.max(...totals, 0);
  const first = days[0], last = days[days.length - 1];
  if (!(max > 0)) {
    return h("figure", { class: "chart card" },
      h("figcaption", {}, h("strong", { text: title })),
      h("p", { class: "muted empty", text: empty }));
  }
  const W = chartWidth(), H = 200, top = 10, base = H - 28;
  const maxText = format(max);
  const left = 14 + 7.5 * Math.max(maxText.length, 1);
  const bw = (W - left) / days.length;
  const text = (x, y, anchor, t) => svg("text", { x, y, "text-anchor": anchor, class: "axis" }, document.createTextNode(t));
  const parts = [
    svg("line", { x1: left, x2: W, y1: top, y2: top, class: "grid-line" }),
    svg("line", { x1: left, x2: W, y1: base, y2: base, class: "base-line" }),
    text(left - 6, top + 4, "end", maxText),
    text(left - 6, base + 4, "end", "0"),
    text(left, H - 8, "start", first),
    text(W, H - 8, "end", last),
  ];
  if (W - left > 420 && days.length > 2) {
    const mid = Math.floor(days.length / 2);
    parts.push(text(left + (mid + 0.5) * bw, H - 8, "middle", days[mid]));
  }
  days.forEach((d, i) => {
    let y = base;
    for (const n of names) {
      const v = byDay.get(d).get(n) || 0;
      if (!v) continue;
      const bh = (v / max) * (base - top);
      y -= bh;
      parts.push(svg("rect", { x: left + i * bw + 1, y, width: Math.max(bw - 2, 1), height: bh, fill: color(n) },
        svg("title", {}, document.createTextNode(`${d} ${n}: ${format(v)}`))));
    }
  });
  const label = `${title}, ${first} to ${last}, highest ${maxText}`;
  return h("figure", { class: "chart card" },
    h("figcaption", {}, h("strong", { text: title }), h("span", { class: "muted", text: ` (highest ${maxText} a day)` })),
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label }, parts),
    h("div", { class: "legend" }, names.map(n => {
      const sw = h("span", { class: "swatch" });
      sw.style.background = color(n);
      return h("span", {}, sw, n);
    })));
}

export function lastDays(n) {
  const out = [];
  const today = new Date();
  for (let i = n - 1; i >= 0; i--) {
    const d = new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i));
    out.push(d.toISOString().slice(0, 10));
  }
  return out;
}

export const USAGE_COLUMNS = ["time", "request_id", "account", "key_id", "model", "channel", "protocol", "endpoint",
  "prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
  "reasoning_tokens", "cost", "status", "latency_ms"];

export function usageTable(records, withAccount) {
  return table([
    { label: "Time", value: r => r.time.replace("T", " ").replace("Z", "") },
    withAccount ? { label: "Account", value: r => r.account } : null,
    { label: "Key", value: r => r.key_id },
    { label: "Model", value: r => r.model },
    { label: "Channel", value: r => r.channel || "—" },
    { label: "Protocol", value: r => `${r.protocol} ${r.endpoint}` },
    { label: "Status", num: true, value: r => r.status },
    { label: "Tokens in/out", num: true, value: r => `${num(r.prompt_tokens)} / ${num(r.completion_tokens)}` },
    { label: "Cost", num: true, value: r => money(r.cost) },
    { label: "ms", num: true, value: r => r.latency_ms },
  ].filter(Boolean), records, "No usage records match.");
}

export const USAGE_PAGE = 50;  // records on a page of the usage table
export const EXPORT_PAGE = 1000;  // records per request of a CSV export (the API's most)
export const EXPORT_MAX = 100000;  // records one CSV export holds at most

export function nextDay(day) {
  const d = new Date(`${day}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + 1);
  return d.toISOString().slice(0, 10);
}

// usage records filtered and paged by the server: ``fetchPage(params)`` gives
// { records, next } (next: the cursor of the page after, or null); ``names`` are the filters
// shown, ``initial`` the values some of them start with. Previous pages are found again by
// the cursors that opened them.
export async function usageBrowser(fetchPage, names, withAccount, initial = {}) {
  const all = {
    account: ["Account", h("input", { name: "account", placeholder: "all" })],
    key: ["Key id", h("input", { name: "key", placeholder: "any" })],
    model: ["Model", h("input", { name: "model", placeholder: "any" })],
    status: ["Status", h("input", { name: "status", placeholder: "any, ok, error or 429", list: "usage-statuses", autocomplete: "off" })],
    from: ["From (UTC day)", h("input", { name: "from", type: "date" })],
    to: ["To (UTC day, included)", h("input", { name: "to", type: "date" })],
  };
  const box = h("div", { id: "usage-results" });
  const exported = h("p", { class: "muted", role: "status", id: "usage-export" });
  let starts = [""];  // starts[i]: the cursor that opens page i ("" the first)
  let page = 0;
  const read = () => {
    const p = new URLSearchParams();
    for (const n of names) {
      const v = all[n][1].value.trim();
      if (!v) continue;
      if (n === "from") p.set("since", v);
      else if (n === "to") p.set("until", nextDay(v));
      else p.set(n, v);
    }
    return p;
  };
  for (const [n, v] of Object.entries(initial)) if (all[n]) all[n][1].value = v;
  let filters = read();  // as the form was when last submitted
  const params = () => new URLSearchParams(filters);
  const load = async () => {
    const p = params();
    p.set("limit", String(USAGE_PAGE));
    if (starts[page]) p.set("cursor", starts[page]);
    try {
      const { records, next } = await fetchPage(p);
      starts = starts.slice(0, page + 1);
      if (next) starts.push(next);
      const go = step => { page += step; load(); };
      const short = Boolean(next) && records.length < USAGE_PAGE;
      box.replaceChildren(usageTable(records, withAccount),
        h("div", { class: "pager" },
          h("button", { type: "button", disabled: page === 0, onclick: () => go(-1) }, "Previous"),
          h("span", { class: "muted", id: "usage-page", text: `Page ${page + 1}: ${records.length} record${records.length === 1 ? "" : "s"}` }),
          h("button", { type: "button", disabled: !next, onclick: () => go(1) }, "Next")),
        h("p", { class: "muted", hidden: !short, text: "This page is short: the store reads a bounded number of records per request. Next reads on from here." }));
    } catch (e) { notice(e.message); }
  };
  const exportAll = async () => {
    const rows = [];
    let cursor = "", capped = false;
    exported.textContent = "Exporting…";
    try {
      for (;;) {
        const p = params();
        p.set("limit", String(EXPORT_PAGE));
        if (cursor) p.set("cursor", cursor);
        const { records, next } = await fetchPage(p);
        rows.push(...records);
        cursor = next;
        if (!cursor) break;
        if (rows.length >= EXPORT_MAX) { capped = true; break; }
        exported.textContent = `Exporting… ${num(rows.length)} records so far`;
      }
      if (rows.length > EXPORT_MAX) { rows.length = EXPORT_MAX; capped = true; }
      download("usage.csv", csv(rows, USAGE_COLUMNS));
      exported.textContent = capped
        ? `Exported the newest ${num(EXPORT_MAX)} matching records, the most one export holds: narrow the filters or the days for the rest.`
        : `Exported ${num(rows.length)} record${rows.length === 1 ? "" : "s"}.`;
    } catch (e) { exported.textContent = ""; notice(e.message); }
  };
  const form = h("form", { class: "inline", id: "usage-filter" },
    names.map(n => field(all[n][0], all[n][1])),
    h("datalist", { id: "usage-statuses" }, ["ok", "error", "200", "400", "401", "402", "404", "429", "499", "500", "502"].map(v => h("option", { value: v }))),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("button", { type: "button", onclick: exportAll }, "Export CSV"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    filters = read();
    starts = [""];
    page = 0;
    exported.textContent = "";
    load();
  });
  await load();
  return [h("div", { class: "card" }, form, exported), h("div", { class: "card" }, box)];
}

// a model's prices in short; a cache price only where it is not the input's (a write of an
// hour: not the write's), as billing takes them
export function prices(p) {
  const parts = [];
  if (p.input) parts.push(`in ${p.input}/M`);
  if (p.output) parts.push(`out ${p.output}/M`);
  if (p.cache_read != null && p.cache_read !== p.input) parts.push(`cache read ${p.cache_read}/M`);
  if (p.cache_write != null && p.cache_write !== p.input) parts.push(`cache write ${p.cache_write}/M`);
  if (p.cache_write_1h != null && p.cache_write_1h !== (p.cache_write ?? p.input)) {
    parts.push(`1-hour cache write ${p.cache_write_1h}/M`);
  }
  if (p.request) parts.push(`${p.request}/call`);
  if (p.image) parts.push(`${p.image}/image`);
  if (p.audio_second) parts.push(`${p.audio_second}/s audio`);
  if (p.speech_char) parts.push(`${p.speech_char}/M chars`);
  return parts.join(", ") || "free";
}

// a change, then the page drawn again, then its notice: what the notice says is on the page
// by the time it shows (a click right after it reaches the new page, not the old one)
export async function act(run, done) {
  try {
    await run();
    await state.render();
    notice(done, true);
  } catch (e) { notice(e.message); }
}
