// Shared by the server's and the router's dashboard: the API key (entered once, kept for the
// tab's session, sent as Bearer) and a Server-Sent Events reader over fetch (EventSource cannot
// send an Authorization header).
"use strict";

const RL = {
  keyName: "radixlm.apiKey",
  key() { return sessionStorage.getItem(RL.keyName) || ""; },
  headers(extra) {
    const h = Object.assign({}, extra || {});
    const k = RL.key();
    if (k) h["Authorization"] = "Bearer " + k;
    return h;
  },
  setStatus(text, cls) {
    const el = document.getElementById("status");
    el.textContent = text;
    el.className = "status " + (cls || "");
  },
  // The key form appears when the server answers 401; a key entered there restarts `restart`.
  askKey(message, restart) {
    const form = document.getElementById("keyform");
    document.getElementById("keymsg").textContent = message;
    form.hidden = false;
    form.onsubmit = (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(RL.keyName, document.getElementById("apikey").value.trim());
      document.getElementById("apikey").value = "";
      form.hidden = true;
      restart();
    };
  },
  async errorMessage(resp) {
    try {
      const body = await resp.json();
      return (body.error && body.error.message) || body.message || JSON.stringify(body);
    } catch (e) {
      return resp.status + " " + resp.statusText;
    }
  },
  // Read `path` as SSE; onEvent(obj) per data line. Reconnects after a drop; stops on 401 until
  // the user enters a key.
  stream(path, onEvent) {
    let stopped = false;
    const run = async () => {
      while (!stopped) {
        let resp;
        try {
          resp = await fetch(path, { headers: RL.headers({ Accept: "text/event-stream" }) });
        } catch (e) {
          RL.setStatus("disconnected, retrying", "bad");
          await new Promise((r) => setTimeout(r, 2000));
          continue;
        }
        if (resp.status === 401) {
          RL.setStatus("API key needed", "bad");
          RL.askKey(await RL.errorMessage(resp), run);
          return;
        }
        if (!resp.ok) {
          RL.setStatus("error " + resp.status + ": " + (await RL.errorMessage(resp)), "bad");
          await new Promise((r) => setTimeout(r, 2000));
          continue;
        }
        RL.setStatus("live", "good");
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        try {
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let cut;
            while ((cut = buf.indexOf("\n\n")) >= 0) {
              const block = buf.slice(0, cut);
              buf = buf.slice(cut + 2);
              for (const line of block.split("\n")) {
                if (line.startsWith("data: ")) onEvent(JSON.parse(line.slice(6)));
              }
            }
          }
        } catch (e) {
          /* the connection dropped: reconnect below */
        }
        RL.setStatus("reconnecting", "bad");
        await new Promise((r) => setTimeout(r, 1000));
      }
    };
    run();
    return () => { stopped = true; };
  },
  el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  },
  fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    return Number(v).toFixed(digits === undefined ? 1 : digits);
  },
};
