// The server's dashboard: charts, the radix tree and the recent requests from /dashboard/stream,
// the playground (playground.js). window.radixlmDashboard exposes the charts (tests read it).
"use strict";

(function () {
  const box = document.getElementById("charts");
  const charts = {
    throughput: new LiveChart(box, "throughput", "Throughput (tok/s)", ["output", "prompt"]),
    latency: new LiveChart(box, "latency", "Latency, last 60 s (ms)",
                           ["TTFT p50", "TTFT p90", "TTFT p99", "ITL p50", "ITL p99"]),
    requests: new LiveChart(box, "requests", "Requests", ["running", "waiting", "retracted"], { digits: 0 }),
    cache: new LiveChart(box, "cache", "KV and cache (%)", ["KV used by running", "KV held by tree", "cache hit rate"],
                         { range: [0, 100] }),
    spec: new LiveChart(box, "spec", "Speculative acceptance (tokens / verify)", ["accept length"], { digits: 2 }),
    tiers: new LiveChart(box, "tiers", "Hierarchical cache hits (tok/s)", ["L2", "L3"]),
  };
  const ms = (v) => (v === null || v === undefined ? null : 1000 * v);
  const pct = (v) => (v === null || v === undefined ? null : 100 * v);
  let lastTree = "";
  let showText = false;
  let retractedAtStart = null;
  const tip = document.getElementById("treetip");

  function recentRow(r) {
    const when = new Date(r.finished_at * 1000).toLocaleTimeString();
    const head = r.prompt_head !== null ? r.prompt_head
      : RL.el("span", { class: "muted" }, showText ? "(no text)" : "hidden (--dashboard-show-text)");
    return RL.el("tr", { "data-rid": r.rid },
      RL.el("td", {}, when), RL.el("td", { class: "prompt" }, head), RL.el("td", {}, r.prompt_tokens),
      RL.el("td", {}, RL.fmt(100 * r.cached_share, 0) + "%"), RL.el("td", {}, RL.fmt(ms(r.ttft), 0)),
      RL.el("td", {}, r.completion_tokens), RL.el("td", {}, r.finish_reason || "–"));
  }

  function onEvent(ev) {
    if (ev.error) {
      RL.setStatus(ev.error.message, "bad");
      return;
    }
    RL.setStatus("live", "good");
    document.getElementById("model").textContent = ev.model;
    showText = ev.show_text;
    Playground.model = ev.model;
    const s = ev.state, r = ev.rates, l = ev.latency;
    if (retractedAtStart === null) retractedAtStart = s.num_retracted;
    charts.throughput.push(ev.t, [r.output_tok_s, r.prompt_tok_s]);
    charts.latency.push(ev.t, [ms(l.ttft_p50), ms(l.ttft_p90), ms(l.ttft_p99), ms(l.itl_p50), ms(l.itl_p99)]);
    charts.requests.push(ev.t, [s.num_running, s.num_waiting, s.num_retracted - retractedAtStart]);
    charts.cache.push(ev.t, [pct(s.kv_usage), pct(s.kv_cached), pct(s.cache_hit_rate)]);
    charts.spec.push(ev.t, [s.spec_accept_length]);
    charts.tiers.push(ev.t, [r.l2_hit_tok_s, r.l3_hit_tok_s]);
    const treeJson = JSON.stringify(ev.tree);
    if (treeJson !== lastTree) {  // redraw only on change: a hovered node stays put
      lastTree = treeJson;
      drawTree(document.getElementById("tree"), tip, ev.tree);
    }
    document.getElementById("treeinfo").textContent =
      `${ev.tree.length} nodes shown; KV pool ${s.max_total_num_tokens} tokens` +
      (ev.show_text ? "" : "; token text hidden (start the server with --dashboard-show-text to show it)");
    document.getElementById("recentbody").replaceChildren(...ev.recent.map(recentRow));
    document.getElementById("finished").textContent = `${ev.finished_total} finished since start`;
  }

  Playground.init();
  RL.stream("/dashboard/stream", onEvent);
  window.radixlmDashboard = { charts };
})();
