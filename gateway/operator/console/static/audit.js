// The audit log's page (the admin's): who changed what, when, from where, filtered and paged
// by the server (GET /admin/audit), newest first; Export CSV saves every matching entry with
// the console's CSV (ui.js: a formula-like cell is written as text). Every value reaches the
// page as text, never as markup.

import { EXPORT_MAX, EXPORT_PAGE, call, csv, download, field, h, nextDay, notice, num, table } from "./ui.js";

const PAGE_SIZE = 50;
const COLUMNS = ["time", "actor", "action", "object_type", "object_id", "fields", "ip_range", "status", "via", "request_id"];

// a change's fields as one line: name=value, secrets already masked by the server
function fieldsText(fields) {
  return Object.entries(fields || {}).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(", ") || "—";
}

function entriesTable(entries) {
  return table([
    { label: "Time (UTC)", value: e => e.time.replace("T", " ").replace("Z", "") },
    { label: "Actor", value: e => e.actor },
    { label: "Action", value: e => h("code", { text: e.action }) },
    { label: "Object", value: e => e.object_id ? `${e.object_type} ${e.object_id}` : e.object_type },
    { label: "Fields", value: e => h("span", { class: "fields", text: fieldsText(e.fields) }) },
    { label: "From", value: e => e.ip_range || "—" },
    { label: "Via", value: e => e.via },
    { label: "Status", num: true, value: e => h("span", { class: `badge ${e.status < 400 ? "ok" : "off"}`, text: String(e.status) }) },
  ], entries, "No audit entries match.");
}

export async function auditPage() {
  const inputs = {
    actor: ["Actor", h("input", { name: "actor", placeholder: "admin, user, user:dana, cli" })],
    action: ["Action", h("input", { name: "action", placeholder: "key, key.create, …" })],
    object: ["Object", h("input", { name: "object", placeholder: "channel or channel:oa-1" })],
    status: ["Status", h("input", { name: "status", placeholder: "any, ok, error or 404" })],
    from: ["From (UTC day)", h("input", { name: "from", type: "date" })],
    to: ["To (UTC day, included)", h("input", { name: "to", type: "date" })],
  };
  const read = () => {
    const p = new URLSearchParams();
    for (const [n, [, input]] of Object.entries(inputs)) {
      const v = input.value.trim();
      if (!v) continue;
      if (n === "from") p.set("since", v);
      else if (n === "to") p.set("until", nextDay(v));
      else p.set(n, v);
    }
    return p;
  };
  const fetchPage = async p => {
    const { data } = await call("GET", `/admin/audit?${p}`);
    return { entries: data.data, next: data.next_cursor };
  };
  const box = h("div", { id: "audit-results" });
  const exported = h("p", { class: "muted", role: "status", id: "audit-export" });
  let filters = read(), starts = [""], page = 0;
  const load = async () => {
    const p = new URLSearchParams(filters);
    p.set("limit", String(PAGE_SIZE));
    if (starts[page]) p.set("cursor", starts[page]);
    try {
      const { entries, next } = await fetchPage(p);
      starts = starts.slice(0, page + 1);
      if (next) starts.push(next);
      const go = step => { page += step; load(); };
      box.replaceChildren(entriesTable(entries),
        h("div", { class: "pager" },
          h("button", { type: "button", disabled: page === 0, onclick: () => go(-1) }, "Previous"),
          h("span", { class: "muted", id: "audit-page", text: `Page ${page + 1}: ${entries.length} entr${entries.length === 1 ? "y" : "ies"}` }),
          h("button", { type: "button", disabled: !next, onclick: () => go(1) }, "Next")));
    } catch (e) { notice(e.message); }
  };
  const exportAll = async () => {
    const rows = [];
    let cursor = "";
    exported.textContent = "Exporting…";
    try {
      do {
        const p = new URLSearchParams(filters);
        p.set("limit", String(EXPORT_PAGE));
        if (cursor) p.set("cursor", cursor);
        const { entries, next } = await fetchPage(p);
        rows.push(...entries.map(e => ({ ...e, fields: JSON.stringify(e.fields) })));
        cursor = next;
      } while (cursor && rows.length < EXPORT_MAX);
      download("audit.csv", csv(rows.slice(0, EXPORT_MAX), COLUMNS));
      exported.textContent = `Exported ${num(Math.min(rows.length, EXPORT_MAX))} entr${rows.length === 1 ? "y" : "ies"}.`;
    } catch (e) { exported.textContent = ""; notice(e.message); }
  };
  const form = h("form", { class: "inline", id: "audit-filter" },
    Object.values(inputs).map(([label, input]) => field(label, input)),
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
  return [h("h1", { text: "Audit log" }),
    h("p", { class: "muted", text: "Every change made through the admin API, the console and the command line: who, what, when and from which address range. Secrets are never recorded." }),
    h("div", { class: "card" }, form, exported), h("div", { class: "card" }, box)];
}
