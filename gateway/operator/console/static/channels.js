// The Channels page: the list (test, edit, disable, delete) and the form that adds or edits a
// channel of any type. A cloud type shows its own fields (config/clouds.py, docs/channels.md):
// azure its api_version (model_map names the deployments), bedrock its region and AWS keys,
// vertex its project, region and service account key. Secrets (the upstream API key, the AWS
// secret and session token, the service account key) are write-only: the admin API shows a
// hint at most, the form never holds them when editing, and a blank one is left unchanged.
// Editing a bedrock channel, a new access key ID replaces the whole set (a blank session token
// then clears the old one), and "Clear the stored AWS keys" goes back to the environment's.

import { act, api, field, h, notice, searchable, state } from "./ui.js";

const TYPES = ["openai", "anthropic", "gemini", "azure", "bedrock", "vertex"];
// the types whose base_url the region gives, and that sign with their own credentials
const REGIONAL = new Set(["bedrock", "vertex"]);
const URL_HINTS = {
  openai: "https://api.openai.com/v1", anthropic: "https://api.anthropic.com",
  gemini: "https://generativelanguage.googleapis.com", azure: "https://NAME.openai.azure.com",
  bedrock: "blank: https://bedrock-runtime.{region}.amazonaws.com",
  vertex: "blank: the region's aiplatform.googleapis.com",
};
// each cloud type's own fields: [name, label, input attributes, shown when editing]
const CLOUD = {
  azure: [["api_version", "API version", { placeholder: "2024-10-21", required: true }, true]],
  bedrock: [
    ["region", "AWS region", { placeholder: "us-east-1", required: true }, true],
    ["aws_access_key_id", "AWS access key ID (blank: the environment's credentials)", {}, false],
    ["aws_secret_access_key", "AWS secret access key", { type: "password" }, false],
    ["aws_session_token", "AWS session token (optional)", { type: "password" }, false],
  ],
  vertex: [
    ["project", "GCP project", { placeholder: "my-gcp-project", required: true }, true],
    ["region", "Vertex region", { placeholder: "us-east5 or global", required: true }, true],
    ["credentials", "Service account key (its JSON, or a file path on the server)", { textarea: true }, false],
  ],
};

// the AWS keys among bedrock's fields: cleared together
const AWS_KEYS = CLOUD.bedrock.map(([name]) => name).filter(name => name.startsWith("aws_"));

const names = s => String(s).split(",").map(x => x.trim()).filter(Boolean);
const mapText = m => Object.entries(m || {}).map(([a, b]) => `${a}=${b}`).join(", ");

// "alias=upstream-name, other=name": the names the channel's upstream knows the models by
function modelMap(s) {
  const out = {};
  for (const pair of names(s)) {
    const at = pair.indexOf("=");
    if (at < 1 || at === pair.length - 1) throw new Error(`model_map: "${pair}" is not model=upstream-name`);
    out[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
  }
  return out;
}

// one group of fields per cloud type, each input named by its type ("bedrock.region"), so that
// two types' "region" stay apart; only the chosen type's group is shown and enabled
function cloudGroups() {
  const groups = {};
  for (const [type, fields] of Object.entries(CLOUD)) {
    groups[type] = h("div", { class: "cloud-fields", "data-type": type, hidden: true },
      fields.map(([name, label, attrs]) => {
        const { textarea, ...rest } = attrs;
        const input = textarea
          ? h("textarea", { name: `${type}.${name}`, rows: 3, autocomplete: "off", spellcheck: "false", ...rest })
          : h("input", { name: `${type}.${name}`, autocomplete: "off", ...rest });
        return field(label, input);
      }));
  }
  return groups;
}

// the credential's hint; a service account's (its whole e-mail) in the title, to keep the row short
function keyColumn(c) {
  if (c.credentials_hint) return h("span", { title: c.credentials_hint, text: "service account" });
  return h("span", { class: "nowrap", text: c.api_key_hint || c.aws_access_key_id_hint || "—" });
}

function cloudColumn(c) {
  const where = [c.api_version && `api ${c.api_version}`, c.project, c.region].filter(Boolean);
  return where.length ? `${c.type} (${where.join(", ")})` : c.type;
}

export async function channelsPage() {
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
  let editingAwsKeys = false;  // it is a bedrock channel with AWS keys stored
  const clouds = cloudGroups();
  const keyLabel = h("span", { text: "Upstream API key (blank when editing: unchanged)" });
  const mapLabel = h("span", { text: "Model map (model=upstream model, …)" });
  const keyInput = h("input", { name: "api_key", type: "password", autocomplete: "off" });
  const keyField = h("label", {}, keyLabel, keyInput);
  // editing a bedrock channel that holds AWS keys: drop them (null restores the default, the
  // environment's credential chain)
  const clearAws = h("input", { type: "checkbox", name: "clear_aws" });
  const clearAwsField = h("label", { class: "check", hidden: true }, clearAws,
    " Clear the stored AWS keys (use the environment's credentials)");
  clearAws.addEventListener("change", () => {
    for (const name of AWS_KEYS) form.elements[`bedrock.${name}`].disabled = clearAws.checked;
  });
  const typeSelect = h("select", { name: "type" }, TYPES.map(t => h("option", { value: t, text: t })));
  const baseUrl = h("input", { name: "base_url", type: "url" });
  // the form as the chosen type has it: its own fields shown (and only they sent), the key
  // and base URL as the type takes them
  const showType = () => {
    const type = typeSelect.value;
    for (const [t, group] of Object.entries(clouds)) {
      group.hidden = t !== type;
      for (const input of group.querySelectorAll("input, textarea")) input.disabled = t !== type;
    }
    clearAwsField.hidden = !(type === "bedrock" && editingAwsKeys);
    clearAws.checked = false;
    keyField.hidden = REGIONAL.has(type);
    keyInput.disabled = REGIONAL.has(type);
    baseUrl.required = !REGIONAL.has(type);
    baseUrl.placeholder = URL_HINTS[type];
    mapLabel.textContent = type === "azure" ? "Deployments (model=deployment, …)" : "Model map (model=upstream model, …)";
  };
  typeSelect.addEventListener("change", showType);
  const heading = h("h2", { text: "Add a channel" });
  const edit = c => {
    editing = c.name;
    heading.textContent = `Edit channel ${c.name}`;
    editingAwsKeys = c.type === "bedrock" && Boolean(c.aws_access_key_id_hint);
    for (const [name, value] of [["name", c.name], ["type", c.type], ["base_url", c.base_url],
      ["api_key", ""], ["groups", (c.groups || []).join(", ")], ["models", (c.models || []).join(", ")],
      ["model_map", mapText(c.model_map)], ["priority", c.priority], ["weight", c.weight],
      ["status", c.status || "enabled"]]) form.elements[name].value = value;
    for (const [type, fields] of Object.entries(CLOUD)) {
      for (const [name, , , shown] of fields) {
        const input = form.elements[`${type}.${name}`];
        input.value = shown && type === c.type ? (c[name] ?? "") : "";
        const hint = type === c.type && c[`${name}_hint`];  // a secret: its hint at most
        input.placeholder = hint ? `${hint} (blank: unchanged)` : (CLOUD[type].find(f => f[0] === name)[2].placeholder || "");
      }
    }
    showType();
    form.elements.name.readOnly = true;
    form.querySelector("button[type=submit]").textContent = `Save channel ${c.name}`;
    cancel.hidden = false;
    baseUrl.focus();
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
  const cancel = h("button", { type: "button", hidden: true, onclick: () => state.render() }, "Cancel");
  const form = h("form", { class: "inline", id: "new-channel" },
    field("Name", h("input", { name: "name", required: true })),
    field("Type", typeSelect),
    field("Base URL", baseUrl),
    keyField,
    Object.values(clouds),
    clearAwsField,
    field("Groups (comma-separated)", h("input", { name: "groups", value: groups.length ? groups[0].name : "" })),
    field("Models (comma-separated)", h("input", { name: "models", list: "model-names", autocomplete: "off" })),
    h("label", {}, mapLabel, h("input", { name: "model_map", autocomplete: "off", placeholder: "chat-small=gpt-4o-mini" })),
    field("Priority", h("input", { name: "priority", type: "number", value: "0" })),
    field("Weight", h("input", { name: "weight", type: "number", min: "0", step: "1", value: "1" })),
    field("Status", h("select", { name: "status" }, ["enabled", "disabled"].map(t => h("option", { value: t, text: t })))),
    h("button", { type: "submit", class: "primary" }, "Add channel"), cancel,
    h("datalist", { id: "model-names" }, models.map(m => h("option", { value: m.name }))));
  showType();
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const f = new FormData(form);  // disabled inputs (another type's fields) are not in it
    const type = f.get("type");
    let body;
    try {
      body = { name: f.get("name"), type, base_url: f.get("base_url"),
        groups: names(f.get("groups")), models: names(f.get("models")),
        model_map: modelMap(f.get("model_map")), priority: Number(f.get("priority") || 0),
        weight: Number(f.get("weight") || 0), status: f.get("status") };
    } catch (e) { notice(e.message); return; }
    if (!REGIONAL.has(type)) body.api_key = f.get("api_key") || "";
    else if (!body.base_url) delete body.base_url;  // the region's
    for (const [name, , , shown] of CLOUD[type] || []) {
      const value = String(f.get(`${type}.${name}`) || "").trim();
      if (value || (editing === null && shown)) body[name] = value;  // a blank secret: unchanged
    }
    if (type === "bedrock" && editing !== null) {
      if (f.get("clear_aws")) for (const name of AWS_KEYS) body[name] = null;
      else if (body.aws_access_key_id) {  // a new key: the old secret and token are not its
        if (!body.aws_secret_access_key) { notice("AWS secret access key: required with a new access key ID."); return; }
        body.aws_session_token ??= null;
      }
    }
    if (editing === null) {
      act(() => api("POST", "/admin/channels", body), `Channel ${body.name} added.`);
      return;
    }
    const name = editing;
    delete body.name;
    if (!body.api_key) delete body.api_key;  // blank: the key stays as it is
    act(() => api("PATCH", `/admin/channels/${encodeURIComponent(name)}`, body), `Channel ${name} saved.`);
  });
  return [h("h1", { text: "Channels" }), h("div", { class: "card" }, heading, form),
    h("div", { class: "card" }, result, searchable("channel-search", "name, type, URL, region, group or model", [
    { label: "Name", value: c => h("span", { class: "nowrap", text: c.name }) },
    { label: "Type", value: cloudColumn },
    { label: "Base URL", value: c => c.base_url },
    { label: "Key", value: keyColumn },
    { label: "Groups", value: c => (c.groups || []).join(", ") },
    { label: "Models", value: c => (c.models || []).map(m => c.model_map && c.model_map[m] ? `${m} → ${c.model_map[m]}` : m).join(", ") },
    { label: "Priority", num: true, value: c => c.priority },
    { label: "Weight", num: true, value: c => c.weight },
    { label: "Status", value: c => h("span", { class: `badge ${c.status === "disabled" ? "off" : "ok"}`, text: c.status || "enabled" }) },
    { label: "Health", value: c => h("span", { class: `badge ${c.health === "cooling" ? "off" : "ok"}`,
      text: c.health === "cooling" ? `cooling ${c.cooling_for}s` : "healthy" }) },
    { label: "Actions", value: actions },
  ], data, c => [c.name, c.type, c.base_url, c.region, c.project, c.status, ...(c.groups || []), ...(c.models || [])],
    "No channels yet: add one above."))];
}
