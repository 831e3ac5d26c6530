// People who serve themselves (CONTRACT §5b): a signed-in user's own pages (its keys, usage,
// top-up and password), and the operator's pages for users and redemption codes. A key's
// secret and a code are shown once, when made; a key made here is kept in memory (this tab
// only) so that the model square can try it.

import {
  act, api, CACHE_COLUMNS, chart, copy, csv, download, field, h, hitRate, lastDays, money, notice,
  num, paged, searchable, state, table, totalsBy, usageBrowser,
} from "./ui.js";
import { snippets } from "./square.js";

const badge = (on, text) => h("span", { class: `badge ${on ? "ok" : "off"}`, text });
const names = s => String(s || "").split(",").map(x => x.trim()).filter(Boolean);
const TOOLS = ["Claude Code", "Codex CLI", "Gemini CLI", "OpenAI SDK", "Anthropic SDK", "google-genai", "curl"];

// ---- a user's keys ------------------------------------------------------------------------

// a group's tool kind (``tool`` in the group's settings) and the set-up tab that serves it
export const TOOL_TABS = { "claude-code": "Claude Code", codex: "Codex CLI", "gemini-cli": "Gemini CLI", sdk: "OpenAI SDK" };
const forTool = tool => tool && TOOL_TABS[tool] ? ` (for ${TOOL_TABS[tool]})` : "";

// the new key's secret, once, with its base URLs and each tool's set-up for one of its models:
// the group's own tool first and chosen, the others a tab away
function newKeyBox(made, model, tool) {
  const all = model ? snippets(model, ["chat"]) : {};
  const own = TOOL_TABS[tool];
  const tools = [own, ...TOOLS.filter(t => t !== own)].filter(t => t in all);
  const code = h("pre", { id: "key-snippet" }, h("code", { text: tools.length ? all[tools[0]].replaceAll("YOUR_KEY", made.key) : "" }));
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Set-up for your tools" });
  const pick = t => {
    code.firstChild.textContent = all[t].replaceAll("YOUR_KEY", made.key);
    for (const b of tabs.children) b.setAttribute("aria-selected", String(b.dataset.tool === t));
  };
  tools.forEach((t, i) => tabs.append(h("button", { type: "button", role: "tab", "data-tool": t, "aria-selected": String(i === 0), onclick: () => pick(t) },
    t === own ? `${t} (this group's tool)` : t)));
  return h("div", { class: "secret-card", role: "status" },
    h("div", { class: "secret" },
      h("span", { text: `New key ${made.name || made.id}:` }), h("code", { id: "new-secret", text: made.key }),
      h("button", { type: "button", onclick: () => copy(made.key, "Key") }, "Copy"),
      h("span", { class: "muted", text: "Shown only this once: store it now." })),
    h("p", { class: "muted", text: `Base URLs: ${location.origin}/v1 for OpenAI SDKs and Codex CLI; ${location.origin} for Anthropic SDKs, Claude Code, google-genai and Gemini CLI.` }),
    tools.length ? [h("p", {}, h("strong", { text: `Set-up with ${model} (group ${made.group}${own ? `, made for ${own}` : ""}):` })), tabs, code,
      h("button", { type: "button", onclick: () => copy(code.textContent, "Set-up") }, "Copy set-up")] : null);
}

function keyForm(groups, square, onMade) {
  const modelsOf = g => square.models.filter(m => m.groups.includes(g));
  const list = h("datalist", { id: "group-models" });
  const group = h("select", { name: "group" }, groups.map(g => h("option", { value: g, text: `${g}${forTool((square.tools || {})[g])}` })));
  const fill = () => list.replaceChildren(...modelsOf(group.value).map(m => h("option", { value: m.name })));
  group.addEventListener("change", fill);
  fill();
  const form = h("form", { class: "inline", id: "new-key" },
    field("Group", group),
    field("Name", h("input", { name: "name" })),
    field("Expires (UTC)", h("input", { name: "expires_at", type: "datetime-local" })),
    field("Quota", h("input", { name: "quota", type: "number", min: "0", step: "any" })),
    field("Models (comma-separated)", h("input", { name: "models", list: "group-models", autocomplete: "off" })),
    field("Allowed IPs (CIDRs)", h("input", { name: "allowed_ips" })),
    h("button", { type: "submit", class: "primary" }, "Create key"), list);
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { group: f.get("group") };
    if (f.get("name")) body.name = f.get("name");
    if (f.get("expires_at")) body.expires_at = `${f.get("expires_at")}:00Z`;
    if (f.get("quota")) body.quota = Number(f.get("quota"));
    if (f.get("models")) body.models = names(f.get("models"));
    if (f.get("allowed_ips")) body.allowed_ips = names(f.get("allowed_ips"));
    try {
      const made = await api("POST", "/console/keys", body);
      state.secrets.set(made.id, { key: made.key, name: made.name, group: made.group });
      const chat = modelsOf(made.group).find(m => m.capabilities.includes("chat"));
      form.reset();
      fill();
      notice("");
      onMade(made, chat ? chat.name : null);
    } catch (e) { notice(e.message); }
  });
  return form;
}

export async function userKeysPage() {
  const [me, { data: keys }, square] = await Promise.all([
    api("GET", "/console/me"), api("GET", "/console/keys"), api("GET", "/console/square")]);
  const shown = h("div", { id: "secret-box" });
  const list = h("div");
  const path = k => `/console/keys/${encodeURIComponent(k.id)}`;
  const draw = () => list.replaceChildren(paged([
    { label: "Name", value: k => k.name || "—" },
    { label: "Id", value: k => h("span", { class: "nowrap", text: k.id }) },
    { label: "Group", value: k => k.group },
    { label: "Status", value: k => badge(k.status === "enabled", k.status) },
    { label: "Spent", num: true, value: k => money(k.spent) },
    { label: "Quota", num: true, value: k => k.quota === null ? "—" : money(k.quota) },
    { label: "Expires", value: k => k.expires_at || "never" },
    { label: "Models", value: k => (k.models || ["all of the group"]).join(", ") },
    { label: "Allowed IPs", value: k => (k.allowed_ips || ["anywhere"]).join(", ") },
    { label: "Actions", value: k => h("div", { class: "actions" },
      h("a", { href: `#usage?key=${encodeURIComponent(k.id)}`, class: "button" }, "Usage"),
      h("button", { type: "button", "aria-label": `${k.status === "enabled" ? "Disable" : "Enable"} key ${k.name || k.id}`,
        onclick: () => act(() => api("PATCH", path(k), { status: k.status === "enabled" ? "disabled" : "enabled" }), `Key ${k.name || k.id} updated.`) },
        k.status === "enabled" ? "Disable" : "Enable"),
      h("button", { type: "button", class: "danger", "aria-label": `Delete key ${k.name || k.id}`,
        onclick: () => confirm(`Delete key ${k.name || k.id}? It stops working at once.`) && act(() => api("DELETE", path(k)), `Key ${k.name || k.id} deleted.`) }, "Delete")) },
  ], keys, "No keys yet: create one above."));
  draw();
  const onMade = (made, model) => {
    keys.push({ ...made, spent: 0 });
    draw();
    shown.replaceChildren(newKeyBox(made, model, (square.tools || {})[made.group]));
  };
  const form = me.groups.length ? keyForm(me.groups, square, onMade)
    : h("p", { class: "muted", text: "You may not make keys in any group yet: ask the administrator." });
  return [h("h1", { text: "My keys" }),
    h("div", { class: "grid" }, h("div", { class: "card stat" }, h("span", { class: "muted", text: "Balance" }), h("strong", { text: money(me.balance) })),
      h("div", { class: "card stat" }, h("span", { class: "muted", text: "Groups" }), h("strong", { text: me.groups.join(", ") || "none" }))),
    h("div", { class: "card" }, h("h2", { text: "Create a key" }),
      h("p", { class: "muted", text: "Command-line tools need a key of their own group: choose the group made for your tool (shown beside its name)." }),
      form, shown),
    h("div", { class: "card" }, list)];
}

// ---- a user's usage, top-up and password --------------------------------------------------

export async function userUsagePage() {
  const key = new URLSearchParams(location.hash.split("?")[1] || "").get("key") || "";
  const [{ daily }, { data: keys }] = await Promise.all([
    api("GET", "/console/usage?limit=1"), api("GET", "/console/keys")]);
  const totals = new Map(totalsBy(daily, "key_id").map(t => [t.key_id, t]));
  const perKey = keys.map(k => {
    const t = totals.get(k.id) || { requests: 0, prompt_tokens: 0, cache_read_tokens: 0, cost: 0 };
    return { ...k, requests: t.requests, cost30: t.cost, prompt_tokens: t.prompt_tokens,
      cache_read_tokens: t.cache_read_tokens };
  });
  const fetchPage = async p => {
    const data = await api("GET", `/console/usage?${p}`);
    return { records: data.records, next: data.next_cursor };
  };
  // opened from a key's row: that key's records
  const browser = await usageBrowser(fetchPage, ["key", "model", "status", "from", "to"], false, key ? { key } : {});
  return [h("h1", { text: "My usage" }),
    chart("Cost per day", lastDays(30), daily, d => d.cost, money, "No cost in the last 30 days."),
    h("div", { class: "card", id: "by-key" }, h("h2", { text: "Per key" }), paged([
      { label: "Key", value: k => k.name || k.id },
      { label: "Id", value: k => k.id },
      { label: "Requests (30 days)", num: true, value: k => num(k.requests) },
      { label: "Cache hit rate (30 days)", num: true, value: k => hitRate(k) },
      { label: "Cost (30 days)", num: true, value: k => money(k.cost30) },
      { label: "Spent in all", num: true, value: k => money(k.spent) },
    ], perKey, "No keys yet.")),
    h("div", { class: "card", id: "by-model" }, h("h2", { text: "Per model (30 days)" }),
      table([{ label: "Model", value: r => r.model }, ...CACHE_COLUMNS], totalsBy(daily, "model"),
        "No usage in the last 30 days.")),
    browser];
}

export async function topUpPage() {
  const me = await api("GET", "/console/me");
  const balance = h("strong", { id: "balance", text: money(me.balance) });
  const code = h("input", { name: "code", required: true, autocomplete: "off", spellcheck: "false",
    size: 26, placeholder: "GW-XXXX-XXXX-XXXX-XXXX" });  // a whole code in sight
  const form = h("form", { class: "inline", id: "redeem" },
    field("Redemption code", code), h("button", { type: "submit", class: "primary" }, "Redeem"));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    try {
      const r = await api("POST", "/console/redeem", { code: code.value });
      balance.textContent = money(r.balance);
      form.reset();
      notice(`Code redeemed: your balance is now ${money(r.balance)}.`, true);
    } catch (e) { notice(e.message); }
  });
  return [h("h1", { text: "Top up" }),
    h("div", { class: "grid" }, h("div", { class: "card stat" }, h("span", { class: "muted", text: "Balance" }), balance)),
    h("div", { class: "card" }, h("h2", { text: "Redeem a code" }), form,
      h("p", { class: "muted", text: "Codes come from the administrator; each adds its amount to your account once." }))];
}

export async function passwordPage() {
  const me = await api("GET", "/console/me");
  const form = h("form", { class: "inline", id: "password" },
    field("Current password", h("input", { name: "current", type: "password", required: true, autocomplete: "current-password" })),
    field("New password (8 or more characters)", h("input", { name: "new", type: "password", required: true, minlength: "8", autocomplete: "new-password" })),
    h("button", { type: "submit", class: "primary" }, "Change password"));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const f = new FormData(form);
    try {
      await api("POST", "/console/password", { current: f.get("current"), new: f.get("new") });
      form.reset();
      notice("Password changed.", true);
    } catch (e) { notice(e.message); }
  });
  return [h("h1", { text: `Signed in as ${me.user.username}` }),
    h("div", { class: "card" }, h("h2", { text: "Change your password" }), form)];
}

// ---- the operator's users and codes -------------------------------------------------------

export async function usersPage() {
  const [{ data: users }, { data: accounts }, { data: groups }] = await Promise.all([
    api("GET", "/admin/users"), api("GET", "/admin/accounts"), api("GET", "/admin/groups")]);
  const path = u => `/admin/users/${encodeURIComponent(u.id)}`;
  const form = h("form", { class: "inline", id: "new-user" },
    field("Username", h("input", { name: "username", required: true, autocomplete: "off" })),
    field("Password", h("input", { name: "password", type: "password", required: true, minlength: "8", autocomplete: "new-password" })),
    field("Account", h("input", { name: "account", required: true, list: "user-accounts", autocomplete: "off" })),
    field("Groups (comma-separated)", h("input", { name: "groups", value: groups.length ? groups[0].name : "" })),
    h("button", { type: "submit", class: "primary" }, "Create user"),
    h("datalist", { id: "user-accounts" }, accounts.map(a => h("option", { value: a.id }))));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { username: f.get("username"), password: f.get("password"), account: f.get("account"), groups: names(f.get("groups")) };
    act(() => api("POST", "/admin/users", body), `User ${body.username} created.`);
  });
  const actions = u => h("div", { class: "actions" },
    h("button", { type: "button", "aria-label": `${u.status === "enabled" ? "Disable" : "Enable"} user ${u.username}`,
      onclick: () => act(() => api("PATCH", path(u), { status: u.status === "enabled" ? "disabled" : "enabled" }), `User ${u.username} updated.`) },
      u.status === "enabled" ? "Disable" : "Enable"),
    h("button", { type: "button", class: "danger", "aria-label": `Delete user ${u.username}`,
      onclick: () => confirm(`Delete user ${u.username} and its keys?`) && act(() => api("DELETE", path(u)), `User ${u.username} deleted.`) }, "Delete"));
  return [h("h1", { text: "Users" }),
    h("p", { class: "muted", text: "People who sign in with a username and a password and make their own keys in their groups. Disabling one ends its sessions and stops its keys." }),
    h("div", { class: "card" }, h("h2", { text: "Create a user" }), form),
    h("div", { class: "card" }, searchable("user-search", "username, account or group", [
      { label: "Username", value: u => u.username },
      { label: "Id", value: u => u.id },
      { label: "Account", value: u => u.account },
      { label: "Groups", value: u => u.groups.join(", ") || "—" },
      { label: "Status", value: u => badge(u.status === "enabled", u.status) },
      { label: "Created", value: u => u.created_at || "—" },
      { label: "Actions", value: actions },
    ], users, u => [u.username, u.account, ...u.groups], "No users yet: create one above."))];
}

const CODE_COLUMNS = ["code", "amount", "expires_at"];

// ``who``: user id -> username, so that a code shows who redeemed it by name
function codesList(codes, who) {
  const user = c => c.user ? `${who.get(c.user) || "(deleted)"} (${c.user})` : "—";
  return searchable("code-search", "hint, status, account or user", [
    { label: "Hint", value: c => h("span", { class: "nowrap", text: c.hint }) },
    { label: "Amount", num: true, value: c => money(c.amount) },
    { label: "Status", value: c => badge(c.status === "unused", c.status) },
    { label: "Created", value: c => c.created_at },
    { label: "Expires", value: c => c.expires_at || "never" },
    { label: "Account", value: c => c.account || "—" },
    { label: "User", value: user },
    { label: "Used at", value: c => c.used_at || "—" },
  ], codes, c => [c.hint, c.status, c.account, c.user, who.get(c.user)], "No codes yet: create some above.");
}

export async function redemptionsPage() {
  const [{ data: codes }, { data: users }] = await Promise.all([
    api("GET", "/admin/redemptions"), api("GET", "/admin/users")]);
  const who = new Map(users.map(u => [u.id, u.username]));
  const list = h("div", {}, codesList(codes, who));
  const made = h("div", { id: "new-codes" });
  const form = h("form", { class: "inline", id: "new-codes-form" },
    field("Amount", h("input", { name: "amount", type: "number", min: "0", step: "any", required: true })),
    field("Count", h("input", { name: "count", type: "number", min: "1", max: "1000", step: "1", value: "1" })),
    field("Expires (UTC, optional)", h("input", { name: "expires_at", type: "datetime-local" })),
    h("button", { type: "submit", class: "primary" }, "Create codes"));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { amount: Number(f.get("amount")), count: Number(f.get("count") || 1) };
    if (f.get("expires_at")) body.expires_at = `${f.get("expires_at")}:00Z`;
    try {
      const { data } = await api("POST", "/admin/redemptions", body);
      const rows = data.map(c => ({ ...c, expires_at: body.expires_at || "" }));
      const text = csv(rows, CODE_COLUMNS);
      download("redemption-codes.csv", text);
      made.replaceChildren(h("div", { class: "secret-card", role: "status" },
        h("p", {}, h("strong", { text: `${rows.length} code${rows.length === 1 ? "" : "s"} made and saved as redemption-codes.csv.` }),
          h("span", { class: "muted", text: " Shown only now: hand them out, then leave this page." })),
        h("div", { class: "table-wrap" }, h("table", { id: "made-codes" },
          h("thead", {}, h("tr", {}, h("th", { text: "Code" }), h("th", { class: "num", text: "Amount" }))),
          h("tbody", {}, rows.map(c => h("tr", {}, h("td", {}, h("code", { text: c.code })), h("td", { class: "num", text: money(c.amount) })))))),
        h("button", { type: "button", onclick: () => download("redemption-codes.csv", text) }, "Download CSV again")));
      form.reset();
      notice("");
      const fresh = await api("GET", "/admin/redemptions");
      list.replaceChildren(...[codesList(fresh.data, who)].flat());
    } catch (e) { notice(e.message); }
  });
  return [h("h1", { text: "Top-up codes" }),
    h("p", { class: "muted", text: "Each code adds its amount to the account of the user who redeems it, once. The codes are shown (and downloaded as CSV) only when made; the list shows their hints." }),
    h("div", { class: "card" }, h("h2", { text: "Create codes" }), form, made),
    h("div", { class: "card" }, list)];
}
