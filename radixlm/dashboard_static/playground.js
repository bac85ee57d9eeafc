// The playground: a chat through the server's own /v1/chat/completions (the OpenAI route), with
// sampling controls, a JSON-schema or regex constraint, streaming, and each turn's cached share
// (usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens).
"use strict";

const Playground = {
  messages: [],
  model: "default",
  busy: false,

  init() {
    document.getElementById("pgform").addEventListener("submit", (ev) => { ev.preventDefault(); Playground.send(); });
    document.getElementById("pgclear").addEventListener("click", () => {
      Playground.messages = [];
      document.getElementById("pgmessages").replaceChildren();
    });
    const kind = document.getElementById("pgconstraint");
    const box = document.getElementById("pgconstraintbox");
    const sync = () => { box.hidden = kind.value === "none"; };
    kind.addEventListener("change", sync);
    sync();
  },

  number(id) {
    const v = document.getElementById(id).value.trim();
    return v === "" ? undefined : Number(v);
  },

  body() {
    const msgs = [];
    const system = document.getElementById("pgsystem").value.trim();
    if (system) msgs.push({ role: "system", content: system });
    const body = {
      model: Playground.model,
      messages: msgs.concat(Playground.messages),
      temperature: Playground.number("pgtemperature"),
      top_p: Playground.number("pgtopp"),
      top_k: Playground.number("pgtopk"),
      max_tokens: Playground.number("pgmaxtokens"),
      stream: document.getElementById("pgstream").checked,
    };
    if (body.stream) body.stream_options = { include_usage: true };
    const kind = document.getElementById("pgconstraint").value;
    const text = document.getElementById("pgconstrainttext").value;
    if (kind === "json_schema") {
      body.response_format = { type: "json_schema", json_schema: { name: "playground", schema: JSON.parse(text) } };
    } else if (kind === "regex") {
      body.regex = text;
    }
    return body;
  },

  turn(role, text) {
    const content = RL.el("div", { class: "content" }, text);
    const meta = RL.el("div", { class: "turnmeta" });
    const div = RL.el("div", { class: "turn " + role }, RL.el("b", {}, role), content, meta);
    document.getElementById("pgmessages").append(div);
    return { div, content, meta };
  },

  showUsage(meta, usage, finish) {
    if (!usage) return;
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    const share = usage.prompt_tokens ? cached / usage.prompt_tokens : 0;
    meta.dataset.cached = cached;
    meta.dataset.promptTokens = usage.prompt_tokens;
    meta.textContent = `cached ${(100 * share).toFixed(0)}% (${cached} of ${usage.prompt_tokens} prompt tokens), ` +
                       `${usage.completion_tokens} tokens` + (finish ? `, ${finish}` : "");
  },

  async send() {
    if (Playground.busy) return;
    const input = document.getElementById("pginput");
    const text = input.value;
    if (!text.trim()) return;
    let body;
    try {
      Playground.messages.push({ role: "user", content: text });
      body = Playground.body();
    } catch (e) {
      Playground.messages.pop();
      Playground.turn("error", "the constraint is not valid JSON: " + e.message);
      return;
    }
    input.value = "";
    Playground.turn("user", text);
    const out = Playground.turn("assistant", "");
    out.div.classList.add("pending");
    Playground.busy = true;
    let answer = "";
    let usage = null;
    let finish = null;
    try {
      const resp = await fetch("/v1/chat/completions", {
        method: "POST", headers: RL.headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
      });
      if (resp.status === 401) {
        RL.askKey(await RL.errorMessage(resp), () => {});
        throw new Error("an API key is needed");
      }
      if (!resp.ok) throw new Error(await RL.errorMessage(resp));
      if (body.stream) {
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const line = buf.slice(0, cut).trim();
            buf = buf.slice(cut + 2);
            if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
            const chunk = JSON.parse(line.slice(6));
            if (chunk.error) throw new Error(chunk.error.message);
            if (chunk.usage) usage = chunk.usage;
            for (const c of chunk.choices || []) {
              if (c.delta && c.delta.content) answer += c.delta.content;
              if (c.finish_reason) finish = c.finish_reason;
            }
            out.content.textContent = answer;
          }
        }
      } else {
        const r = await resp.json();
        answer = r.choices[0].message.content || "";
        finish = r.choices[0].finish_reason;
        usage = r.usage;
        out.content.textContent = answer;
      }
      Playground.messages.push({ role: "assistant", content: answer });
      Playground.showUsage(out.meta, usage, finish);
      out.div.classList.add("done");
    } catch (e) {
      Playground.messages.pop();  // the user's turn had no answer: not sent again
      out.div.classList.add("failed");
      out.meta.textContent = "error: " + e.message;
    } finally {
      out.div.classList.remove("pending");
      Playground.busy = false;
    }
  },
};
