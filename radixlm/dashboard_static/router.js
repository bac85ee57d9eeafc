// The router's dashboard: one card per worker, side by side, each with its own charts (rates from
// the worker's running totals between two events).
"use strict";

(function () {
  const cards = new Map();  // url -> {box, charts, last}
  const pct = (v) => (v === null || v === undefined ? null : 100 * v);

  function card(url) {
    let c = cards.get(url);
    if (c) return c;
    const box = RL.el("div", { class: "worker", "data-worker": url });
    const head = RL.el("h3", {}, url);
    const info = RL.el("div", { class: "muted workerinfo" });
    box.append(head, info);
    document.getElementById("workers").append(box);
    const opts = { width: 320, height: 140 };
    c = {
      box, info, last: null,
      charts: {
        throughput: new LiveChart(box, "throughput", "tok/s", ["output", "prompt"], opts),
        requests: new LiveChart(box, "requests", "requests", ["running", "waiting", "router load"],
                                Object.assign({ digits: 0 }, opts)),
        cache: new LiveChart(box, "cache", "%", ["KV used", "cache hit rate"], Object.assign({ range: [0, 100] }, opts)),
      },
    };
    cards.set(url, c);
    return c;
  }

  function onEvent(ev) {
    RL.setStatus("live", "good");
    const seen = new Set();
    let healthy = 0;
    for (const w of ev.workers) {
      seen.add(w.url);
      const c = card(w.url);
      if (w.healthy) healthy++;
      c.box.dataset.healthy = w.healthy;
      const s = w.state;
      c.info.textContent = (w.healthy ? "healthy" : "unhealthy: " + w.note) +
        `, ${w.routed} routed, ${w.errors} errors` + (w.error ? `; ${w.error}` : "") + (w.model ? `; ${w.model}` : "");
      if (!s) continue;
      let out = null, prompt = null;
      if (c.last && ev.t > c.last.t) {
        const dt = ev.t - c.last.t;
        out = Math.max(0, s.generated_tokens - c.last.s.generated_tokens) / dt;
        prompt = s.prompt_tokens >= c.last.s.prompt_tokens ? (s.prompt_tokens - c.last.s.prompt_tokens) / dt : null;
      }
      c.last = { t: ev.t, s };
      const total = s.max_total_num_tokens || 1;
      c.charts.throughput.push(ev.t, [out, prompt]);
      c.charts.requests.push(ev.t, [s.num_running, s.num_waiting, w.load]);
      c.charts.cache.push(ev.t, [pct((total - s.available_kv_tokens - s.evictable_tokens) / total), pct(s.cache_hit_rate)]);
    }
    for (const [url, c] of cards) {
      if (!seen.has(url)) {  // removed from the router
        c.box.remove();
        cards.delete(url);
      }
    }
    document.getElementById("summary").textContent = `${ev.workers.length} workers, ${healthy} healthy`;
  }

  RL.stream("/dashboard/stream", onEvent);
  window.radixlmDashboard = { cards };
})();
