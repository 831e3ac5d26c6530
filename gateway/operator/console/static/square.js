// The model square, for everyone signed in: each model the viewer's groups reach, searched and
// filtered by capability and group, with its price in each of those groups (the group's ratio
// applied), its endpoints and a copyable snippet per client; and a "try it" box that sends one
// chat message through a key of the viewer's choosing and shows the reply. A key of one's own
// (a user's enabled keys, or a key session's key) goes through the console (POST /console/try,
// billed to that key): its secret was shown once and is kept nowhere, so the page never has
// it. A key pasted in (or made by the admin in this tab, kept in memory only) goes to
// /v1/chat/completions itself. Nothing of the exchange is kept here.

import { api, copy, field, h, notice, num, prices, state } from "./ui.js";

// the clients' code for a model, by what it can do: each capability's own endpoints
export function snippets(model, caps) {
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

export const CAPABILITIES = ["chat", "vision", "tools", "embeddings", "images", "audio", "rerank"];

// the prices of a model in each group the viewer sees it in, with the group's ratio
function groupPrices(m, ratios) {
  return h("ul", { class: "prices" }, m.groups.map(g => h("li", {},
    h("strong", { text: g }), ratios[g] !== 1 ? h("span", { class: "badge", text: `×${ratios[g]}` }) : null,
    ` ${prices(m.prices[g])}`)));
}

function modelCard(m, ratios) {
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
    h("p", { class: "muted", text: "Price per group (balance units):" }),
    groupPrices(m, ratios),
    h("p", {}, h("strong", { text: "Endpoints: " }), m.endpoints.map(e => e.replace("{model}", m.name)).join(" · ") || "—"),
    tabs, code,
    h("button", { type: "button", onclick: () => copy(code.textContent, "Snippet") }, "Copy snippet"));
}

// the keys the viewer may try without their secret: a user's enabled ones, a key session's own
async function ownKeys() {
  if (state.role === "user") return (await api("GET", "/console/keys")).data.filter(k => k.status === "enabled");
  if (state.role === "key") return [(await api("GET", "/console/me")).key];
  return [];
}

// one chat message through a key, the reply shown
async function tryIt(models) {
  const chat = models.filter(m => m.capabilities.includes("chat"));
  if (!chat.length) return null;
  const own = await ownKeys();
  const inTab = [...state.secrets.entries()].filter(([id]) => !own.some(k => k.id === id));
  const keys = h("select", { name: "key" },
    own.map(k => h("option", { value: `own:${k.id}`, text: `${k.name || k.id} (${k.group})` })),
    inTab.map(([id, k]) => h("option", { value: `tab:${id}`, text: `${k.name || id} (${k.group}, made in this tab)` })),
    h("option", { value: "", text: "a key I paste below" }));
  const pasted = h("input", { name: "pasted", type: "password", autocomplete: "off", placeholder: "sk-…" });
  const pasteField = field("Paste a key", pasted);
  const showPaste = () => { pasteField.hidden = keys.value !== ""; };
  keys.addEventListener("change", showPaste);
  showPaste();
  const model = h("select", { name: "model" }, chat.map(m => h("option", { value: m.name, text: m.name })));
  const message = h("input", { name: "message", value: "Say hello in five words.", required: true, maxlength: "4000" });
  const reply = h("p", { id: "try-reply", role: "status", class: "reply" });
  const cost = h("p", { id: "try-usage", class: "muted" });
  const form = h("form", { class: "inline", id: "try-it" },
    field("Model", model), field("Key", keys), pasteField, field("Message", message),
    h("button", { type: "submit", class: "primary" }, "Send"));
  form.addEventListener("submit", async ev => {
    ev.preventDefault();
    const [how, id] = keys.value.split(/:(.*)/s);
    const secret = how === "tab" ? state.secrets.get(id).key : pasted.value.trim();
    if (how !== "own" && !secret) { notice("Choose one of your keys, or paste one."); return; }
    notice("");
    reply.textContent = "Waiting for the reply…";
    cost.textContent = "";
    try {
      let out;
      if (how === "own") {
        out = await api("POST", "/console/try", { key: id, model: model.value, message: message.value });
      } else {
        const r = await fetch("/v1/chat/completions", {
          method: "POST", credentials: "omit",
          headers: { "content-type": "application/json", authorization: `Bearer ${secret}` },
          body: JSON.stringify({ model: model.value, messages: [{ role: "user", content: message.value }] }),
        });
        const data = await r.json();
        if (!r.ok) throw new Error((data.error && data.error.message) || `HTTP ${r.status}`);
        out = { reply: data.choices[0].message.content, usage: data.usage };
      }
      reply.textContent = out.reply;
      if (out.usage) cost.textContent = `${num(out.usage.prompt_tokens)} tokens in, ${num(out.usage.completion_tokens)} out, billed to this key like any call.`;
    } catch (e) { reply.textContent = `Failed: ${e.message}`; }
  });
  return h("div", { class: "card" }, h("h2", { text: "Try it" }),
    h("p", { class: "muted", text: own.length
      ? "One message through one of your keys, sent for you by the console (billed as any request). Your keys' secrets are not needed: they were shown once and are kept nowhere. Nothing of the exchange is kept here."
      : "One message through a key (billed as any request). Nothing of the exchange is kept here." }),
    form, reply, cost);
}

export async function squarePage() {
  const data = await api("GET", "/console/square");
  const search = h("input", { type: "search", id: "square-search", placeholder: "model name", autocomplete: "off" });
  const capability = h("select", { id: "square-capability" },
    h("option", { value: "", text: "any" }), CAPABILITIES.map(c => h("option", { value: c, text: c })));
  const groups = data.groups.length > 1 ? h("select", { id: "square-group" },
    h("option", { value: "", text: "any of mine" }), data.groups.map(g => h("option", { value: g, text: g }))) : null;
  const cards = h("div");
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    const shown = data.models.filter(m => (!q || m.name.toLowerCase().includes(q))
      && (!capability.value || m.capabilities.includes(capability.value))
      && (!groups || !groups.value || m.groups.includes(groups.value)));
    cards.replaceChildren(...(shown.length ? shown.map(m => modelCard(m, data.ratios))
      : [h("p", { class: "card muted", text: data.models.length ? "No model matches." : "No model is open to your groups yet." })]));
  };
  for (const el of [search, capability, groups]) if (el) el.addEventListener("input", draw);
  draw();
  const title = data.groups.length === 1 ? `Model square: ${data.groups[0]}` : "Model square";
  return [h("h1", { text: title }),
    h("p", { class: "muted", text: `Base URLs: OpenAI SDKs ${location.origin}/v1; Anthropic and google-genai SDKs ${location.origin}. Replace YOUR_KEY with your sk- key.` }),
    await tryIt(data.models),
    h("div", { class: "card inline filters" }, field("Search", search), field("Capability", capability), groups ? field("Group", groups) : null),
    cards];
}
