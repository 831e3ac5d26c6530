// The console: one module, no dependencies. Every piece of data reaches the page through
// textContent or attributes (never innerHTML), so nothing the store holds can run as code.
// The session is an HttpOnly cookie; this script only keeps its CSRF token, in memory.

const state = { role: null, csrf: "", route: "" };
const PAGE = 25;
const COLORS = ["#2456d6", "#e07b00", "#1e7b34", "#a0308f", "#b3261e", "#00838f", "#6d4c41", "#5b6475"];

// ---- small helpers ----------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
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

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c) el.append(c);
  return el;
}

// one call: the decoded reply and its headers; an error reply throws with its message
async function call(method, path, body) {
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

async function api(method, path, body) { return (await call(method, path, body)).data; }

function notice(message, ok = false) {
  const box = document.getElementById("notice");
  box.textContent = message || "";
  box.hidden = !message;
  box.className = ok ? "ok" : "";
}

function money(v) {
  return v === null || v === undefined ? "—" : Number(v).toLocaleString(undefined, { maximumFractionDigits: 6 });
}

function num(v) { return Number(v || 0).toLocaleString(); }

function table(columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted", text: empty });
  return h("div", { class: "table-wrap" },
    h("table", {},
      h("thead", {}, h("tr", {}, columns.map(c => h("th", { scope: "col", class: c.num ? "num" : null, text: c.label })))),
      h("tbody", {}, rows.map(r => h("tr", {}, columns.map(c => {
        const v = c.value(r);
        return h("td", { class: c.num ? "num" : null }, v instanceof Node ? v : String(v ?? "—"));
      }))))));
}

function paged(columns, rows, empty) {
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
function searchable(id, placeholder, columns, rows, text, empty) {
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

function field(label, input) { return h("label", {}, label, input); }

async function copy(text, what) {
  try {
    await navigator.clipboard.writeText(text);
    notice(`${what} copied.`, true);
  } catch {
    notice(`Could not copy; select the ${what.toLowerCase()} and copy it by hand.`);
  }
}

function download(name, text) {
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
function csv(rows, columns) {
  const cell = v => {
    let s = String(v ?? "");
    if (typeof v === "string" && /^[=+\-@\t\r]/.test(s)) s = "'" + s;
    return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
  };
  return [columns.join(","), ...rows.map(r => columns.map(c => cell(r[c])).join(","))].join("\n") + "\n";
}

// a width for a chart's drawing that is about its size on screen, so that its labels read
// at their own size on a phone and on a wide screen alike
function chartWidth() {
  const main = document.getElementById("main");
  return Math.round(Math.min(1100, Math.max(280, (main ? main.clientWidth : 640) - 64)));
}

// a stacked bar chart of one value per day and model, with its axes: the highest day's total
// and zero beside the bars, the first and last day (and the middle one, when there is room)
// under them; a chart of nothing but zeros says so instead
function chart(title, days, series, value, format = num, empty = "Nothing in these days.") {
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

function lastDays(n) {
  const out = [];
  const today = new Date();
  for (let i = n - 1; i >= 0; i--) {
    const d = new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i));
    out.push(d.toISOString().slice(0, 10));
  }
  return out;
}

// ---- pages --------------------------------------------------------------------------------

const ADMIN_PAGES = {
  overview: ["Overview", overview],
  keys: ["Keys", keysPage],
  accounts: ["Accounts", accountsPage],
  usage: ["Usage", usagePage],
  channels: ["Channels", channelsPage],
  models: ["Models", modelsPage],
  groups: ["Groups", groupsPage],
  square: ["Model square", squarePage],
};
const KEY_PAGES = {
  mine: ["My key", minePage],
  usage: ["Usage", myUsagePage],
  square: ["Model square", squarePage],
};

function pages() { return state.role === "admin" ? ADMIN_PAGES : KEY_PAGES; }

async function overview() {
  const days = lastDays(30);
  const { data, sessions } = await api("GET", `/admin/usage/daily?since=${days[0]}&until=${days[days.length - 1]}`);
  const sum = f => data.reduce((a, d) => a + Number(d[f]), 0);
  const perModel = new Map();
  for (const d of data) {
    const m = perModel.get(d.model) || { model: d.model, requests: 0, prompt_tokens: 0, completion_tokens: 0, cost: 0 };
    m.requests += d.requests; m.prompt_tokens += d.prompt_tokens;
    m.completion_tokens += d.completion_tokens; m.cost += Number(d.cost);
    perModel.set(d.model, m);
  }
  return [
    h("h1", { text: "Overview, last 30 days" }),
    h("div", { class: "grid" },
      [["Requests", num(sum("requests"))], ["Prompt tokens", num(sum("prompt_tokens"))],
       ["Completion tokens", num(sum("completion_tokens"))], ["Cost", money(sum("cost"))]]
        .map(([k, v]) => h("div", { class: "card stat" }, h("span", { class: "muted", text: k }), h("strong", { text: v })))),
    data.length ? [
      chart("Cost per day", days, data, d => d.cost, money),
      chart("Requests per day", days, data, d => d.requests),
      chart("Tokens per day", days, data, d => d.prompt_tokens + d.completion_tokens),
    ] : h("p", { class: "card muted", text: "No usage in the last 30 days. Requests made with any key show here within seconds." }),
    h("h2", { text: "By model" }),
    table([
      { label: "Model", value: r => r.model },
      { label: "Requests", num: true, value: r => num(r.requests) },
      { label: "Prompt tokens", num: true, value: r => num(r.prompt_tokens) },
      { label: "Completion tokens", num: true, value: r => num(r.completion_tokens) },
      { label: "Cost", num: true, value: r => money(r.cost) },
    ], [...perModel.values()], "No usage yet."),
    h("h2", { text: "Sessions and prompt cache (this instance, since its start)" }),
    table([
      { label: "Model", value: r => r.model },
      { label: "Channel", value: r => r.channel },
      { label: "Sessions pinned", num: true, value: r => num(r.pins) },
      { label: "Prompt tokens", num: true, value: r => num(r.prompt_tokens) },
      { label: "Cache reads", num: true, value: r => num(r.cache_read_tokens) },
      { label: "Cache hit rate", num: true, value: r => `${(r.cache_hit_rate * 100).toFixed(1)}%` },
    ], sessions || [], "No sessions or prompt tokens yet."),
  ];
}

async function keysPage() {
  const [{ data: keys }, { data: accounts }, { data: groups }] = await Promise.all([
    api("GET", "/admin/keys"), api("GET", "/admin/accounts"), api("GET", "/admin/groups")]);
  const groupNames = groups.map(g => g.name);
  const shown = h("div", { id: "secret-box" });
  const list = h("div");
  const search = h("input", { type: "search", id: "key-search", placeholder: "id, name, account or group" });
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    const rows = keys.filter(k => !q || [k.id, k.name, k.account, k.group].some(v => String(v).toLowerCase().includes(q)));
    list.replaceChildren(paged([
      { label: "Id", value: k => k.id },
      { label: "Name", value: k => k.name || "—" },
      { label: "Account", value: k => k.account },
      { label: "Group", value: k => k.group },
      { label: "Status", value: k => h("span", { class: `badge ${k.status === "enabled" ? "ok" : "off"}`, text: k.status }) },
      { label: "Quota", num: true, value: k => k.quota === null ? "—" : money(k.quota) },
      { label: "Spent", num: true, value: k => money(k.spent) },
      { label: "Expires", value: k => k.expires_at || "never" },
      { label: "Actions", value: k => h("div", { class: "actions" },
          h("button", { type: "button", "aria-label": `${k.status === "enabled" ? "Disable" : "Enable"} key ${k.id}`,
            onclick: () => act(() => api("PATCH", `/admin/keys/${encodeURIComponent(k.id)}`, { status: k.status === "enabled" ? "disabled" : "enabled" }), `Key ${k.id} updated.`) },
            k.status === "enabled" ? "Disable" : "Enable"),
          h("button", { type: "button", class: "danger", "aria-label": `Delete key ${k.id}`,
            onclick: () => confirm(`Delete key ${k.id}? Its holder loses access at once.`) &&
              act(() => api("DELETE", `/admin/keys/${encodeURIComponent(k.id)}`), `Key ${k.id} deleted.`) }, "Delete")) },
    ], rows, keys.length ? "No key matches." : "No keys yet: create one above."));
  };
  search.addEventListener("input", draw);
  draw();
  const accountList = h("datalist", { id: "account-ids" }, accounts.map(a => h("option", { value: a.id })));
  const form = h("form", { class: "inline", id: "new-key" },
    field("Account", h("input", { name: "account", required: true, list: "account-ids", autocomplete: "off" })),
    field("Group", h("select", { name: "group" }, groupNames.map(g => h("option", { value: g, text: g })))),
    field("Name", h("input", { name: "name" })),
    field("Expires (UTC)", h("input", { name: "expires_at", type: "datetime-local" })),
    field("Quota", h("input", { name: "quota", type: "number", min: "0", step: "any" })),
    field("Models (comma-separated)", h("input", { name: "models" })),
    field("Allowed IPs (CIDRs)", h("input", { name: "allowed_ips" })),
    h("button", { type: "submit", class: "primary" }, "Create key"), accountList);
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { account: f.get("account"), group: f.get("group") };
    if (f.get("name")) body.name = f.get("name");
    if (f.get("expires_at")) body.expires_at = `${f.get("expires_at")}:00Z`;
    if (f.get("quota")) body.quota = Number(f.get("quota"));
    const names = s => String(s).split(",").map(x => x.trim()).filter(Boolean);
    if (f.get("models")) body.models = names(f.get("models"));
    if (f.get("allowed_ips")) body.allowed_ips = names(f.get("allowed_ips"));
    try {
      const made = await api("POST", "/admin/keys", body);
      keys.push(made);
      draw();
      form.reset();
      shown.replaceChildren(h("div", { class: "secret", role: "status" },
        h("span", { text: `New key ${made.id}:` }), h("code", { id: "new-secret", text: made.key }),
        h("button", { type: "button", onclick: () => copy(made.key, "Key") }, "Copy"),
        h("span", { class: "muted", text: "Shown only this once: store it now." })));
      notice("");
    } catch (e) { notice(e.message); }
  });
  return [h("h1", { text: "Keys" }), h("div", { class: "card" }, h("h2", { text: "Create a key" }), form, shown),
    h("div", { class: "card" }, field("Search", search), list)];
}

async function accountsPage() {
  const { data } = await api("GET", "/admin/accounts");
  const form = h("form", { class: "inline", id: "new-account" },
    field("Id", h("input", { name: "id", required: true })),
    field("Balance", h("input", { name: "balance", type: "number", step: "any", value: "0" })),
    h("button", { type: "submit", class: "primary" }, "Create account"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    act(() => api("POST", "/admin/accounts", { id: f.get("id"), balance: Number(f.get("balance") || 0) }), `Account ${f.get("id")} created.`);
  });
  const topup = a => {
    const amount = h("input", { type: "number", step: "any", "aria-label": `Top-up amount for ${a.id}`, class: "topup" });
    return h("div", { class: "actions" }, amount, h("button", { type: "button", "aria-label": `Top up ${a.id}`,
      onclick: () => amount.value && act(() => api("POST", `/admin/accounts/${encodeURIComponent(a.id)}/topup`, { amount: Number(amount.value) }), `Account ${a.id} topped up.`) }, "Top up"));
  };
  return [h("h1", { text: "Accounts" }), h("div", { class: "card" }, form),
    h("div", { class: "card" }, paged([
      { label: "Id", value: a => a.id },
      { label: "Balance", num: true, value: a => money(a.balance) },
      { label: "Top up", value: topup },
    ], data, "No accounts yet: create one above."))];
}

const USAGE_COLUMNS = ["time", "request_id", "account", "key_id", "model", "channel", "protocol", "endpoint",
  "prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
  "cost", "status", "latency_ms"];

function usageTable(records, withAccount) {
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

const USAGE_PAGE = 50;  // records on a page of the usage table
const EXPORT_PAGE = 1000;  // records per request of a CSV export (the API's most)
const EXPORT_MAX = 100000;  // records one CSV export holds at most

function nextDay(day) {
  const d = new Date(`${day}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + 1);
  return d.toISOString().slice(0, 10);
}

// usage records filtered and paged by the server: ``fetchPage(params)`` gives
// { records, next } (next: the cursor of the page after, or null); ``names`` are the filters
// shown. Previous pages are found again by the cursors that opened them.
async function usageBrowser(fetchPage, names, withAccount) {
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

async function usagePage() {
  const fetchPage = async p => {
    const { data, headers } = await call("GET", `/admin/usage?${p}`);
    return { records: data.data, next: headers.get("x-next-cursor") };
  };
  return [h("h1", { text: "Usage" }),
    h("p", { class: "muted", text: "Newest first, filtered by the server; Export CSV saves every matching record." }),
    await usageBrowser(fetchPage, ["account", "key", "model", "status", "from", "to"], true)];
}

async function channelsPage() {
  const [{ data }, { data: groups }, { data: models }] = await Promise.all([
    api("GET", "/admin/channels"), api("GET", "/admin/groups"), api("GET", "/admin/models")]);
  const result = h("div", { role: "status" });
  const path = c => `/admin/channels/${encodeURIComponent(c.name)}`;
  const test = c => h("button", { type: "button", "aria-label": `Test channel ${c.name}`, onclick: async () => {
    result.textContent = `Testing ${c.name}…`;
    try {
      const r = await api("POST", `${path(c)}/test`);
      result.textContent = `${c.name}: ${r.ok ? "ok" : "failed"}, status ${r.status}, ${r.latency_ms} ms${r.error ? `: ${r.error}` : ""}`;
    } catch (e) { result.textContent = `${c.name}: ${e.message}`; }
  } }, "Test");
  let editing = null;  // the channel the form changes, or null: the form adds one
  const mapText = m => Object.entries(m || {}).map(([a, b]) => `${a}=${b}`).join(", ");
  const edit = c => {
    editing = c.name;
    for (const [name, value] of [["name", c.name], ["type", c.type], ["base_url", c.base_url],
      ["api_key", ""], ["groups", (c.groups || []).join(", ")], ["models", (c.models || []).join(", ")],
      ["model_map", mapText(c.model_map)], ["priority", c.priority], ["weight", c.weight],
      ["status", c.status || "enabled"]]) form.elements[name].value = value;
    form.elements.name.readOnly = true;
    form.querySelector("button[type=submit]").textContent = `Save channel ${c.name}`;
    cancel.hidden = false;
    form.elements.base_url.focus();
  };
  const actions = c => h("div", { class: "actions" }, test(c),
    c.origin === "file" ? h("span", { class: "muted", title: "defined in the configuration file: change it there", text: "from the file" }) : [
      h("button", { type: "button", "aria-label": `Edit channel ${c.name}`, onclick: () => edit(c) }, "Edit"),
      h("button", { type: "button", "aria-label": `${c.status === "disabled" ? "Enable" : "Disable"} channel ${c.name}`,
        onclick: () => act(() => api("PATCH", path(c), { status: c.status === "disabled" ? "enabled" : "disabled" }), `Channel ${c.name} updated.`) },
        c.status === "disabled" ? "Enable" : "Disable"),
      h("button", { type: "button", class: "danger", "aria-label": `Delete channel ${c.name}`,
        onclick: () => confirm(`Delete channel ${c.name}?`) && act(() => api("DELETE", path(c)), `Channel ${c.name} deleted.`) }, "Delete"),
    ]);
  const names = s => String(s).split(",").map(x => x.trim()).filter(Boolean);
  // "alias=upstream-name, other=name": the names the channel's upstream knows the models by
  const modelMap = s => {
    const out = {};
    for (const pair of names(s)) {
      const at = pair.indexOf("=");
      if (at < 1 || at === pair.length - 1) throw new Error(`model_map: "${pair}" is not model=upstream-name`);
      out[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
    }
    return out;
  };
  const cancel = h("button", { type: "button", hidden: true, onclick: () => render() }, "Cancel");
  const form = h("form", { class: "inline", id: "new-channel" },
    field("Name", h("input", { name: "name", required: true })),
    field("Type", h("select", { name: "type" }, ["openai", "anthropic", "gemini"].map(t => h("option", { value: t, text: t })))),
    field("Base URL", h("input", { name: "base_url", required: true, type: "url", placeholder: "https://api.openai.com/v1" })),
    field("Upstream API key (blank when editing: unchanged)", h("input", { name: "api_key", type: "password", autocomplete: "off" })),
    field("Groups (comma-separated)", h("input", { name: "groups", value: groups.length ? groups[0].name : "" })),
    field("Models (comma-separated)", h("input", { name: "models", list: "model-names", autocomplete: "off" })),
    field("Model map (model=upstream model, …)", h("input", { name: "model_map", autocomplete: "off", placeholder: "chat-small=gpt-4o-mini" })),
    field("Priority", h("input", { name: "priority", type: "number", value: "0" })),
    field("Weight", h("input", { name: "weight", type: "number", min: "0", step: "1", value: "1" })),
    field("Status", h("select", { name: "status" }, ["enabled", "disabled"].map(t => h("option", { value: t, text: t })))),
    h("button", { type: "submit", class: "primary" }, "Add channel"), cancel,
    h("datalist", { id: "model-names" }, models.map(m => h("option", { value: m.name }))));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    let body;
    try {
      body = { name: f.get("name"), type: f.get("type"), base_url: f.get("base_url"),
        api_key: f.get("api_key") || "", groups: names(f.get("groups")), models: names(f.get("models")),
        model_map: modelMap(f.get("model_map")), priority: Number(f.get("priority") || 0),
        weight: Number(f.get("weight") || 0), status: f.get("status") };
    } catch (e) { notice(e.message); return; }
    if (editing === null) {
      act(() => api("POST", "/admin/channels", body), `Channel ${body.name} added.`);
      return;
    }
    const name = editing;
    delete body.name;
    if (!body.api_key) delete body.api_key;  // blank: the key stays as it is
    act(() => api("PATCH", `/admin/channels/${encodeURIComponent(name)}`, body), `Channel ${name} saved.`);
  });
  return [h("h1", { text: "Channels" }), h("div", { class: "card" }, h("h2", { text: "Add a channel" }), form),
    h("div", { class: "card" }, result, searchable("channel-search", "name, type, URL, group or model", [
    { label: "Name", value: c => h("span", { class: "nowrap", text: c.name }) },
    { label: "Type", value: c => c.type },
    { label: "Base URL", value: c => c.base_url },
    { label: "Key", value: c => h("span", { class: "nowrap", text: c.api_key_hint || "—" }) },
    { label: "Groups", value: c => (c.groups || []).join(", ") },
    { label: "Models", value: c => (c.models || []).map(m => c.model_map && c.model_map[m] ? `${m} → ${c.model_map[m]}` : m).join(", ") },
    { label: "Priority", num: true, value: c => c.priority },
    { label: "Weight", num: true, value: c => c.weight },
    { label: "Status", value: c => h("span", { class: `badge ${c.status === "disabled" ? "off" : "ok"}`, text: c.status || "enabled" }) },
    { label: "Health", value: c => h("span", { class: `badge ${c.health === "cooling" ? "off" : "ok"}`,
      text: c.health === "cooling" ? `cooling ${c.cooling_for}s` : "healthy" }) },
    { label: "Actions", value: actions },
  ], data, c => [c.name, c.type, c.base_url, c.status, ...(c.groups || []), ...(c.models || [])], "No channels yet: add one above."))];
}

function prices(p) {
  const parts = [];
  if (p.input) parts.push(`in ${p.input}/M`);
  if (p.output) parts.push(`out ${p.output}/M`);
  if (p.request) parts.push(`${p.request}/call`);
  if (p.image) parts.push(`${p.image}/image`);
  if (p.audio_second) parts.push(`${p.audio_second}/s audio`);
  if (p.speech_char) parts.push(`${p.speech_char}/M chars`);
  return parts.join(", ") || "free";
}

// each price a model may have (config.PRICE_FIELDS), as the form asks for it
const PRICE_KINDS = [
  ["input", "Input price (per M tokens)"],
  ["output", "Output price (per M tokens)"],
  ["request", "Price per request"],
  ["image", "Price per image"],
  ["audio_second", "Price per audio second"],
  ["speech_char", "Price per M speech characters"],
];

async function modelsPage() {
  const { data } = await api("GET", "/admin/models");
  const path = m => `/admin/models/${encodeURIComponent(m.name)}`;
  let editing = null;  // the model the form changes, or null: the form adds one
  const cancel = h("button", { type: "button", hidden: true, onclick: () => render() }, "Cancel");
  const form = h("form", { class: "inline", id: "new-model" },
    field("Name", h("input", { name: "name", required: true })),
    field("Capabilities (comma-separated)", h("input", { name: "capabilities", value: "chat" })),
    PRICE_KINDS.map(([k, label]) => field(label, h("input", { name: k, type: "number", min: "0", step: "any", value: "0" }))),
    field("Default max tokens", h("input", { name: "default_max_tokens", type: "number", min: "1", step: "1", value: "4096" })),
    h("button", { type: "submit", class: "primary" }, "Add model"), cancel);
  const heading = h("h2", { text: "Add a model" });
  const edit = m => {
    editing = m.name;
    form.elements.name.value = m.name;
    form.elements.name.readOnly = true;
    form.elements.capabilities.value = m.capabilities.join(", ");
    for (const [k] of PRICE_KINDS) form.elements[k].value = String(m.price[k] || 0);
    form.elements.default_max_tokens.value = String(m.default_max_tokens);
    form.querySelector("button[type=submit]").textContent = `Save model ${m.name}`;
    heading.textContent = `Edit model ${m.name}`;
    cancel.hidden = false;
    form.elements.capabilities.focus();
  };
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = {
      capabilities: String(f.get("capabilities")).split(",").map(x => x.trim()).filter(Boolean),
      price: Object.fromEntries(PRICE_KINDS.map(([k]) => [k, Number(f.get(k) || 0)])),
      default_max_tokens: Number(f.get("default_max_tokens") || 4096),
    };
    if (editing === null) {
      body.name = f.get("name");
      act(() => api("POST", "/admin/models", body), `Model ${body.name} added.`);
    } else {
      const name = editing;
      act(() => api("PATCH", `/admin/models/${encodeURIComponent(name)}`, body), `Model ${name} saved.`);
    }
  });
  const actions = m => m.origin === "file"
    ? h("span", { class: "muted", title: "defined in the configuration file: change it there", text: "from the file (read-only)" })
    : h("div", { class: "actions" },
      h("button", { type: "button", "aria-label": `Edit model ${m.name}`, onclick: () => edit(m) }, "Edit"),
      h("button", { type: "button", class: "danger", "aria-label": `Delete model ${m.name}`,
        onclick: () => confirm(`Delete model ${m.name}?`) && act(() => api("DELETE", path(m)), `Model ${m.name} deleted.`) }, "Delete"));
  return [h("h1", { text: "Models" }), h("div", { class: "card" }, heading, form),
    h("div", { class: "card" }, searchable("model-search", "name or capability", [
    { label: "Name", value: m => m.name },
    { label: "Capabilities", value: m => h("span", {}, m.capabilities.map(c => h("span", { class: "badge", text: c }))) },
    { label: "Price", value: m => prices(m.price) },
    { label: "Default max tokens", num: true, value: m => m.default_max_tokens },
    { label: "Actions", value: actions },
  ], data, m => [m.name, ...m.capabilities], "No models yet: add one above."))];
}

async function groupsPage() {
  const { data } = await api("GET", "/admin/groups");
  const form = h("form", { class: "inline", id: "new-group" },
    field("Name", h("input", { name: "name", required: true })),
    h("button", { type: "submit", class: "primary" }, "Add group"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const name = new FormData(form).get("name");
    act(() => api("POST", "/admin/groups", { name }), `Group ${name} added.`);
  });
  return [h("h1", { text: "Groups" }), h("div", { class: "card" }, form), h("div", { class: "card" }, searchable("group-search", "group name", [
    { label: "Group", value: g => g.name },
    { label: "Actions", value: g => g.origin === "file" ? h("span", { class: "muted", title: "defined in the configuration file: change it there", text: "from the file" }) :
      h("button", { type: "button", class: "danger", "aria-label": `Delete group ${g.name}`,
        onclick: () => confirm(`Delete group ${g.name}?`) && act(() => api("DELETE", `/admin/groups/${encodeURIComponent(g.name)}`), `Group ${g.name} deleted.`) }, "Delete") },
  ], data, g => [g.name], "No groups."))];
}

// the clients' code for a model, by what it can do: each capability's own endpoints
function snippets(model, caps) {
  const base = location.origin;
  const auth = `-H "Authorization: Bearer YOUR_KEY"`;
  const json = `${auth} -H "Content-Type: application/json"`;
  const openai = `from openai import OpenAI\nclient = OpenAI(base_url="${base}/v1", api_key="YOUR_KEY")\n`;
  const out = {};
  if (caps.includes("chat")) {
    out["OpenAI SDK"] = `${openai}r = client.chat.completions.create(model="${model}", messages=[{"role": "user", "content": "Hello"}])\nprint(r.choices[0].message.content)`;
    out.curl = `curl ${base}/v1/chat/completions \\\n  ${json} \\\n  -d '{"model": "${model}", "messages": [{"role": "user", "content": "Hello"}]}'`;
    out["Anthropic SDK"] = `import anthropic\nclient = anthropic.Anthropic(base_url="${base}", api_key="YOUR_KEY")\nm = client.messages.create(model="${model}", max_tokens=256, messages=[{"role": "user", "content": "Hello"}])\nprint(m.content[0].text)`;
    out["google-genai"] = `from google import genai\nclient = genai.Client(api_key="YOUR_KEY", http_options={"base_url": "${base}"})\nprint(client.models.generate_content(model="${model}", contents="Hello").text)`;
    out["Claude Code"] = `export ANTHROPIC_BASE_URL=${base}\nexport ANTHROPIC_API_KEY=YOUR_KEY\nclaude --model ${model}`;
    out["Gemini CLI"] = `export GOOGLE_GEMINI_BASE_URL=${base}\nexport GEMINI_API_KEY=YOUR_KEY\ngemini -m ${model}`;
    out["Codex CLI"] = `# ~/.codex/config.toml\nmodel = "${model}"\nmodel_provider = "gateway"\n\n[model_providers.gateway]\nname = "Model Gateway"\nbase_url = "${base}/v1"\nenv_key = "GATEWAY_API_KEY"\nwire_api = "responses"\n\n# then: export GATEWAY_API_KEY=YOUR_KEY; codex`;
  }
  if (caps.includes("embeddings")) {
    out["OpenAI SDK embeddings"] = `${openai}r = client.embeddings.create(model="${model}", input=["Hello", "World"])\nprint(len(r.data), r.data[0].embedding[:4])`;
    out["curl embeddings"] = `curl ${base}/v1/embeddings \\\n  ${json} \\\n  -d '{"model": "${model}", "input": ["Hello", "World"]}'`;
    out["google-genai embed_content"] = `from google import genai\nclient = genai.Client(api_key="YOUR_KEY", http_options={"base_url": "${base}"})\nr = client.models.embed_content(model="${model}", contents=["Hello", "World"])\nprint(r.embeddings[0].values[:4])`;
  }
  if (caps.includes("images")) {
    out["OpenAI SDK images"] = `${openai}r = client.images.generate(model="${model}", prompt="A lighthouse at dawn", n=1)\nprint(r.data[0].url or r.data[0].b64_json[:40])`;
    out["curl images"] = `curl ${base}/v1/images/generations \\\n  ${json} \\\n  -d '{"model": "${model}", "prompt": "A lighthouse at dawn", "n": 1}'`;
  }
  if (caps.includes("audio")) {
    out["OpenAI SDK transcription"] = `${openai}with open("speech.mp3", "rb") as f:\n    r = client.audio.transcriptions.create(model="${model}", file=f)\nprint(r.text)`;
    out["OpenAI SDK speech"] = `${openai}with client.audio.speech.with_streaming_response.create(model="${model}", voice="alloy", input="Hello") as r:\n    r.stream_to_file("hello.mp3")`;
    out["curl transcription"] = `curl ${base}/v1/audio/transcriptions \\\n  ${auth} \\\n  -F model=${model} -F file=@speech.mp3`;
    out["curl speech"] = `curl ${base}/v1/audio/speech \\\n  ${json} \\\n  -d '{"model": "${model}", "voice": "alloy", "input": "Hello"}' -o hello.mp3`;
  }
  if (caps.includes("rerank")) {
    out["curl rerank"] = `curl ${base}/v1/rerank \\\n  ${json} \\\n  -d '{"model": "${model}", "query": "What is a gateway?", "documents": ["A gateway relays requests.", "A lighthouse guides ships."], "top_n": 1}'`;
    out["Python rerank"] = `import requests\nr = requests.post("${base}/v1/rerank", headers={"Authorization": "Bearer YOUR_KEY"},\n    json={"model": "${model}", "query": "What is a gateway?", "documents": ["A gateway relays requests.", "A lighthouse guides ships."]})\nprint(r.json())`;
  }
  if (!Object.keys(out).length) out.curl = `curl ${base}/v1/models/${model} ${auth}`;
  return out;
}

function modelCard(m) {
  const all = snippets(m.name, m.capabilities);
  const names = Object.keys(all);
  const code = h("pre", {}, h("code", { text: all[names[0]] }));
  let current = names[0];
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": `Clients for ${m.name}` });
  const select = n => {
    current = n;
    code.firstChild.textContent = all[n];
    for (const b of tabs.children) b.setAttribute("aria-selected", String(b.textContent === n));
  };
  for (const n of names) tabs.append(h("button", { type: "button", role: "tab", "aria-selected": String(n === current), onclick: () => select(n) }, n));
  return h("section", { class: "card model", "aria-label": m.name },
    h("h2", { text: m.name }),
    h("div", {}, m.capabilities.map(c => h("span", { class: "badge", text: c }))),
    h("p", { class: "muted", text: `Price: ${prices(m.price)} (balance units)` }),
    h("p", {}, h("strong", { text: "Endpoints: " }), m.endpoints.map(e => e.replace("{model}", m.name)).join(" · ") || "—"),
    tabs, code,
    h("button", { type: "button", onclick: () => copy(code.textContent, "Snippet") }, "Copy snippet"));
}

async function squarePage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const group = params.get("group");
  const data = await api("GET", `/console/square${group ? `?group=${encodeURIComponent(group)}` : ""}`);
  const pick = data.groups.length > 1 ? field("Group", h("select", { id: "square-group", onchange: ev => { location.hash = `#square?group=${encodeURIComponent(ev.target.value)}`; } },
    data.groups.map(g => h("option", { value: g, selected: g === data.group, text: g })))) : null;
  return [h("h1", { text: `Model square: ${data.group}` }),
    h("p", { class: "muted", text: `Base URLs: OpenAI SDKs ${location.origin}/v1; Anthropic and google-genai SDKs ${location.origin}. Replace YOUR_KEY with your sk- key.` }),
    pick, data.models.length ? data.models.map(modelCard) : h("p", { class: "card muted", text: "No model is open to this group yet." })];
}

async function minePage() {
  const me = await api("GET", "/console/me");
  const k = me.key;
  const stats = [["Balance", money(me.balance)], ["Spent with this key", money(k.spent)]];
  if (k.quota !== null) stats.push(["Quota", money(k.quota)], ["Quota left", money(me.quota_left)]);
  return [h("h1", { text: `Key ${k.name || k.id}` }),
    h("div", { class: "grid" }, stats.map(([a, b]) => h("div", { class: "card stat" }, h("span", { class: "muted", text: a }), h("strong", { text: b })))),
    h("div", { class: "card" }, table([
      { label: "Id", value: () => k.id }, { label: "Group", value: () => k.group },
      { label: "Account", value: () => k.account }, { label: "Status", value: () => k.status },
      { label: "Expires", value: () => k.expires_at || "never" },
      { label: "Models", value: () => (k.models || ["all of the group"]).join(", ") },
    ], [k], ""))];
}

async function myUsagePage() {
  const { daily } = await api("GET", "/console/usage?limit=1");
  const fetchPage = async p => {
    const data = await api("GET", `/console/usage?${p}`);
    return { records: data.records, next: data.next_cursor };
  };
  const days = lastDays(30);
  return [h("h1", { text: "My usage" }),
    chart("Cost per day", days, daily, d => d.cost, money, "No cost in the last 30 days."),
    await usageBrowser(fetchPage, ["model", "status", "from", "to"], false)];
}

// ---- sign-in and routing ------------------------------------------------------------------

async function act(run, done) {
  try {
    await run();
    notice(done, true);
    await render();
  } catch (e) { notice(e.message); }
}

function signInPage() {
  const token = h("input", { id: "token", name: "token", type: "password", required: true, autocomplete: "off" });
  const form = h("form", { id: "sign-in" },
    h("h1", { text: "Sign in" }),
    field("Admin token, or your sk- API key", token),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
    h("p", { class: "muted", text: "The admin token opens the whole console; a key shows its own balance, usage and models." }));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    try {
      const r = await api("POST", "/console/session", { token: token.value });
      token.value = "";
      state.role = r.role;
      state.csrf = r.csrf;
      notice("");
      location.hash = state.role === "admin" ? "#overview" : "#mine";
      await render();
    } catch (e) { notice(e.status === 401 ? `${e.message} Check the token and try again.` : e.message); }
  });
  return h("div", { class: "card signin" }, form);
}

function drawNav() {
  const nav = document.getElementById("nav");
  const out = document.getElementById("sign-out");
  out.hidden = !state.role;
  if (!state.role) { nav.replaceChildren(); return; }
  nav.replaceChildren(...Object.entries(pages()).map(([id, [label]]) =>
    h("a", { href: `#${id}`, "aria-current": id === state.route ? "page" : null, text: label })));
}

async function render() {
  const main = document.getElementById("main");
  if (!state.role) {
    drawNav();
    main.replaceChildren(signInPage());
    return;
  }
  const all = pages();
  const route = location.hash.slice(1).split("?")[0];
  state.route = route in all ? route : Object.keys(all)[0];
  drawNav();
  try {
    const content = await all[state.route][1]();
    main.replaceChildren(...[content].flat(3).filter(Boolean));
  } catch (e) {
    if (e.status === 401) { state.role = null; notice("Your session ended; sign in again."); return render(); }
    main.replaceChildren(h("div", { class: "card" }, h("h1", { text: "Something went wrong" }),
      h("p", { text: e.message }), h("p", { class: "muted", text: "Reload the page, or try again in a moment." })));
  }
}

document.getElementById("sign-out").addEventListener("click", async () => {
  try { await api("DELETE", "/console/session"); } catch { /* signed out either way */ }
  state.role = null;
  state.csrf = "";
  location.hash = "";
  notice("Signed out.", true);
  render();
});
window.addEventListener("hashchange", () => { notice(""); render(); });

(async () => {
  try {
    const me = await api("GET", "/console/me");
    state.role = me.role;
    state.csrf = me.csrf;
  } catch { state.role = null; }
  render();
})();
