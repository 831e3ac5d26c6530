// The console: routing, sign-in and the operator's pages; one module per part, no build step,
// no dependencies (ui.js: the building blocks; people.js: users and top-up; square.js: the
// model square; audit.js: the audit log). Every piece of data reaches the page through
// textContent or attributes (never innerHTML), so nothing the store holds can run as code.
// The session is an HttpOnly cookie; the scripts keep only its CSRF token, in memory.

import {
  act, api, CACHE_COLUMNS, call, chart, copy, field, h, hitRate, lastDays, money, notice, num, paged,
  prices, searchable, state, table, totalsBy, usageBrowser,
} from "./ui.js";
import { squarePage } from "./square.js";
import { auditPage } from "./audit.js";
import {
  TOOL_TABS, passwordPage, redemptionsPage, topUpPage, userKeysPage, userUsagePage, usersPage,
} from "./people.js";

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
  users: ["Users", usersPage],
  redemptions: ["Top-up codes", redemptionsPage],
  audit: ["Audit log", auditPage],
};
const KEY_PAGES = {
  mine: ["My key", minePage],
  usage: ["Usage", myUsagePage],
  square: ["Model square", squarePage],
};
const USER_PAGES = {
  keys: ["My keys", userKeysPage],
  usage: ["Usage", userUsagePage],
  topup: ["Top up", topUpPage],
  square: ["Model square", squarePage],
  password: ["Password", passwordPage],
};

function pages() { return { admin: ADMIN_PAGES, key: KEY_PAGES, user: USER_PAGES }[state.role] || KEY_PAGES; }

async function overview() {
  const days = lastDays(30);
  const { data, sessions } = await api("GET", `/admin/usage/daily?since=${days[0]}&until=${days[days.length - 1]}`);
  const sum = f => data.reduce((a, d) => a + Number(d[f] || 0), 0);
  const all = { prompt_tokens: sum("prompt_tokens"), cache_read_tokens: sum("cache_read_tokens") };
  return [
    h("h1", { text: "Overview, last 30 days" }),
    h("div", { class: "grid" },
      [["Requests", num(sum("requests"))], ["Prompt tokens", num(sum("prompt_tokens"))],
       ["Completion tokens", num(sum("completion_tokens"))], ["Cost", money(sum("cost"))],
       ["Cache hit rate", hitRate(all)]]
        .map(([k, v]) => h("div", { class: "card stat" }, h("span", { class: "muted", text: k }), h("strong", { text: v })))),
    data.length ? [
      chart("Cost per day", days, data, d => d.cost, money),
      chart("Requests per day", days, data, d => d.requests),
      chart("Tokens per day", days, data, d => d.prompt_tokens + d.completion_tokens),
    ] : h("p", { class: "card muted", text: "No usage in the last 30 days. Requests made with any key show here within seconds." }),
    h("h2", { text: "By model" }),
    h("div", { id: "by-model" }, table([{ label: "Model", value: r => r.model }, ...CACHE_COLUMNS],
      totalsBy(data, "model"), "No usage yet.")),
    h("h2", { text: "By key" }),
    h("div", { id: "by-key" }, paged([{ label: "Key", value: r => r.key_id }, ...CACHE_COLUMNS],
      totalsBy(data, "key_id"), "No usage yet.")),
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
      { label: "User", value: k => k.owner || "—" },
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

async function usagePage() {
  const fetchPage = async p => {
    const { data, headers } = await call("GET", `/admin/usage?${p}`);
    return { records: data.data, next: headers.get("x-next-cursor") };
  };
  return [h("h1", { text: "Usage" }),
    h("p", { class: "muted", text: "Newest first, filtered by the server; Export CSV saves every matching record." }),
    await usageBrowser(fetchPage, ["account", "key", "model", "status", "from", "to"], true)];
}

// the Channels page, with its form for every channel type, is a module of its own
import { channelsPage } from "./channels.js";

// each price a model may have (config.PRICE_FIELDS), as the form asks for it; a field left
// empty is not sent: the built-in price table's (or, for the cache prices, its ratio or the
// input price) stands in, and a saved model keeps the prices the form does not show changed
const PRICE_KINDS = [
  ["input", "Input price (per M tokens)"],
  ["output", "Output price (per M tokens)"],
  ["cache_read", "Cache read price (per M tokens)"],
  ["cache_write", "Cache write price (per M tokens)"],
  ["cache_write_1h", "1-hour cache write price (per M tokens)"],
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
    PRICE_KINDS.map(([k, label]) => field(label, h("input", { name: k, type: "number", min: "0", step: "any", placeholder: "from the price table" }))),
    field("Default max tokens", h("input", { name: "default_max_tokens", type: "number", min: "1", step: "1", value: "4096" })),
    h("button", { type: "submit", class: "primary" }, "Add model"), cancel);
  const heading = h("h2", { text: "Add a model" });
  const edit = m => {
    editing = m.name;
    form.elements.name.value = m.name;
    form.elements.name.readOnly = true;
    form.elements.capabilities.value = m.capabilities.join(", ");
    const price = m.price || {};
    for (const [k] of PRICE_KINDS) form.elements[k].value = price[k] == null ? "" : String(price[k]);
    form.elements.default_max_tokens.value = String(m.default_max_tokens);
    form.querySelector("button[type=submit]").textContent = `Save model ${m.name}`;
    heading.textContent = `Edit model ${m.name}`;
    cancel.hidden = false;
    form.elements.capabilities.focus();
  };
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const price = Object.fromEntries(PRICE_KINDS
      .filter(([k]) => String(f.get(k) ?? "").trim() !== "")
      .map(([k]) => [k, Number(f.get(k))]));
    const body = {
      capabilities: String(f.get("capabilities")).split(",").map(x => x.trim()).filter(Boolean),
      default_max_tokens: Number(f.get("default_max_tokens") || 4096),
    };
    if (Object.keys(price).length) body.price = price;
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

// a group's tool: the choices of its select (the tool kinds, and none)
const toolSelect = (value, attrs = {}) => h("select", attrs,
  h("option", { value: "", text: "none (SDKs)" }),
  Object.entries(TOOL_TABS).map(([kind, name]) => h("option", { value: kind, text: name, selected: kind === value })));

async function groupsPage() {
  const { data } = await api("GET", "/admin/groups");
  const form = h("form", { class: "inline", id: "new-group" },
    field("Name", h("input", { name: "name", required: true })),
    field("Price ratio", h("input", { name: "ratio", type: "number", min: "0.001", step: "any", value: "1" })),
    field("Tool its keys are for", toolSelect("", { name: "tool" })),
    h("button", { type: "submit", class: "primary" }, "Add group"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const name = f.get("name");
    act(() => api("POST", "/admin/groups", { name, ratio: Number(f.get("ratio") || 1), tool: f.get("tool") || null }), `Group ${name} added.`);
  });
  const path = g => `/admin/groups/${encodeURIComponent(g.name)}`;
  const actions = g => {
    if (g.origin === "file") return h("span", { class: "muted", title: "defined in the configuration file: change it there", text: "from the file" });
    const ratio = h("input", { type: "number", min: "0.001", step: "any", value: String(g.ratio), class: "topup", "aria-label": `Price ratio of ${g.name}` });
    const tool = toolSelect(g.tool, { "aria-label": `Tool of ${g.name}` });
    return h("div", { class: "actions" }, ratio, tool,
      h("button", { type: "button", "aria-label": `Save group ${g.name}`,
        onclick: () => act(() => api("PATCH", path(g), { ratio: Number(ratio.value), tool: tool.value || null }), `Group ${g.name} saved.`) }, "Save"),
      h("button", { type: "button", class: "danger", "aria-label": `Delete group ${g.name}`,
        onclick: () => confirm(`Delete group ${g.name}?`) && act(() => api("DELETE", path(g)), `Group ${g.name} deleted.`) }, "Delete"));
  };
  return [h("h1", { text: "Groups" }),
    h("p", { class: "muted", text: "A key's group decides its channels; its price ratio multiplies every cost of a request made with the key. Command-line tools need a group of their own: a group's tool is the set-up shown first for its new keys." }),
    h("div", { class: "card" }, form), h("div", { class: "card" }, searchable("group-search", "group name", [
    { label: "Group", value: g => g.name },
    { label: "Ratio", num: true, value: g => `×${g.ratio}` },
    { label: "Tool", value: g => TOOL_TABS[g.tool] || "—" },
    { label: "Actions", value: actions },
  ], data, g => [g.name, g.tool || ""], "No groups."))];
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
    h("div", { class: "card", id: "by-model" }, h("h2", { text: "By model (30 days)" }),
      table([{ label: "Model", value: r => r.model }, ...CACHE_COLUMNS], totalsBy(daily, "model"),
        "No usage in the last 30 days.")),
    await usageBrowser(fetchPage, ["model", "status", "from", "to"], false)];
}

// ---- sign-in and routing ------------------------------------------------------------------

// a sign-in's answer: the session's role and CSRF token; the role's first page
async function signedIn(r) {
  state.role = r.role;
  state.csrf = r.csrf;
  notice("");
  location.hash = `#${Object.keys(pages())[0]}`;
  await render();
}

function tokenForm() {
  const token = h("input", { id: "token", name: "token", type: "password", required: true, autocomplete: "off" });
  const form = h("form", { id: "sign-in" },
    h("h2", { text: "With the admin token or an API key" }),
    field("Admin token, or your sk- API key", token),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
    h("p", { class: "muted", text: "The admin token opens the whole console; a key shows its own balance, usage and models." }));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    try {
      const r = await api("POST", "/console/session", { token: token.value });
      token.value = "";
      await signedIn(r);
    } catch (e) { notice(e.status === 401 ? `${e.message} Check the token and try again.` : e.message); }
  });
  return form;
}

// a username and a password: to sign in, or (``up``) to sign up and then in
function passwordForm(up) {
  const id = up ? "sign-up" : "user-sign-in";
  const username = h("input", { name: "username", required: true, autocomplete: "username" });
  const password = h("input", { name: "password", type: "password", required: true,
    autocomplete: up ? "new-password" : "current-password", minlength: up ? "8" : null });
  const form = h("form", { id },
    h("h2", { text: up ? "New here? Create an account" : "With your username" }),
    field("Username", username), field("Password", password),
    h("button", { type: "submit", class: up ? null : "primary" }, up ? "Create account" : "Sign in with password"));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const body = { username: username.value, password: password.value };
    try {
      if (up) await api("POST", "/console/users", body);
      const r = await api("POST", "/console/session", body);
      await signedIn(r);
    } catch (e) { notice(e.status === 401 ? `${e.message}. Check them and try again.` : e.message); }
  });
  return form;
}

async function signInPage() {
  let open = false;
  try { open = (await api("GET", "/console/registration")).registration === "open"; } catch { /* closed */ }
  return h("div", { class: "card signin" }, h("h1", { text: "Sign in" }),
    passwordForm(false), tokenForm(), open ? passwordForm(true) : null);
}

function drawNav() {
  const nav = document.getElementById("nav");
  const out = document.getElementById("sign-out");
  out.hidden = !state.role;
  if (!state.role) { nav.replaceChildren(); return; }
  nav.replaceChildren(...Object.entries(pages()).map(([id, [label]]) =>
    h("a", { href: `#${id}`, "aria-current": id === state.route ? "page" : null, text: label })));
}

// renders begun: only the newest draws. Two may run at once (signing out renders, and so does
// the hash change it makes), and the older one's fetches may end last: drawn over the newer,
// it wiped what the user had begun to type into the sign-in form
let renders = 0;

async function render() {
  const mine = ++renders;
  const main = document.getElementById("main");
  if (!state.role) {
    drawNav();
    const page = await signInPage();
    if (mine === renders) main.replaceChildren(page);
    return;
  }
  const all = pages();
  const route = location.hash.slice(1).split("?")[0];
  state.route = route in all ? route : Object.keys(all)[0];
  drawNav();
  try {
    const content = await all[state.route][1]();
    if (mine === renders) main.replaceChildren(...[content].flat(3).filter(Boolean));
  } catch (e) {
    if (mine !== renders) return;
    if (e.status === 401) { state.role = null; notice("Your session ended; sign in again."); return render(); }
    main.replaceChildren(h("div", { class: "card" }, h("h1", { text: "Something went wrong" }),
      h("p", { text: e.message }), h("p", { class: "muted", text: "Reload the page, or try again in a moment." })));
  }
}

state.render = render;

document.getElementById("sign-out").addEventListener("click", async () => {
  try { await api("DELETE", "/console/session"); } catch { /* signed out either way */ }
  state.role = null;
  state.csrf = "";
  state.secrets.clear();
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
