// The radix tree's largest shared prefixes as an icicle: one row per tree level, each node as
// wide as the tokens in and below it; orange when running requests lock it (darker: more locks),
// else blue, paler the longer since its last use; dashed: only in host memory (hierarchical
// cache L2); a bar on its right end: it keeps a hybrid model's state snapshot (a reusable prefix
// ends there). Hover: its text (with --dashboard-show-text) and numbers.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const ROW = 30;
const WIDTH = 1000;

function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function nodeColor(n, maxRank) {
  if (n.lock_ref > 0) return `hsl(24, 90%, ${Math.max(35, 60 - 6 * Math.min(n.lock_ref, 4))}%)`;
  const age = maxRank > 0 ? n.lru_rank / maxRank : 0;
  return `hsl(215, 65%, ${Math.round(40 + 40 * age)}%)`;
}

function describe(n) {
  const lines = [];
  if (n.text !== undefined) lines.push(n.text);
  lines.push(`${n.tokens} tokens here, ${n.subtree_tokens} in and below, prefix of ${n.depth_tokens}`);
  lines.push(`locks ${n.lock_ref}, LRU rank ${n.lru_rank}, ${n.children} children, ${n.tier}` +
             (n.namespaced ? ", namespaced" : "") + (n.snapshot ? ", state snapshot" : ""));
  return lines.join("\n");
}

function drawTree(container, tip, nodes) {
  const kids = new Map([[null, []]]);
  for (const n of nodes) {
    kids.set(n.id, []);
  }
  for (const n of nodes) (kids.get(n.parent) || kids.get(null)).push(n);
  const maxRank = nodes.reduce((m, n) => Math.max(m, n.lru_rank), 0);
  const top = kids.get(null);
  const total = top.reduce((s, n) => s + n.subtree_tokens, 0);
  const placed = [];
  let depth = 0;
  const place = (list, x0, width, parentTokens, level) => {
    let x = x0;
    depth = Math.max(depth, level + 1);
    for (const n of list) {
      const w = parentTokens > 0 ? width * n.subtree_tokens / parentTokens : 0;
      placed.push({ n, x, w, level });
      place(kids.get(n.id) || [], x, w, n.subtree_tokens, level + 1);
      x += w;
    }
  };
  place(top, 0, WIDTH, total, 0);
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${Math.max(depth, 1) * ROW}`, width: "100%",
                            height: Math.max(depth, 1) * ROW, preserveAspectRatio: "none", id: "treesvg" });
  for (const { n, x, w, level } of placed) {
    const g = svg("g", { class: "node", "data-id": n.id, "data-parent": n.parent === null ? "" : n.parent,
                         "data-tokens": n.tokens, "data-depth": n.depth_tokens, "data-children": n.children,
                         "data-lock": n.lock_ref, "data-snapshot": n.snapshot ? 1 : 0 });
    const rect = svg("rect", { x: x + 0.5, y: level * ROW + 1, width: Math.max(w - 1, 0.5), height: ROW - 2,
                               fill: nodeColor(n, maxRank), rx: 2 });
    if (n.tier !== "l1") rect.setAttribute("stroke-dasharray", "4 2");
    g.append(rect);
    if (n.snapshot) {  // the state snapshot sits after the node's last token
      g.append(svg("rect", { x: x + Math.max(w - 3.5, 0.5), y: level * ROW + 1, width: 3, height: ROW - 2,
                             fill: "hsl(140, 60%, 35%)", class: "snapshot" }));
    }
    if (w > 40) {
      const label = svg("text", { x: x + 4, y: level * ROW + ROW / 2 + 4, class: "nodelabel" });
      const raw = n.text !== undefined ? n.text.replace(/\s+/g, " ") : `${n.tokens} tok`;
      label.textContent = raw.slice(0, Math.floor(w / 7));
      g.append(label);
    }
    const title = svg("title");
    title.textContent = describe(n);
    g.append(title);
    g.addEventListener("mousemove", (ev) => {
      tip.textContent = describe(n);
      tip.hidden = false;
      tip.style.left = ev.pageX + 12 + "px";
      tip.style.top = ev.pageY + 12 + "px";
    });
    g.addEventListener("mouseleave", () => { tip.hidden = true; });
    root.append(g);
  }
  container.replaceChildren(nodes.length ? root : RL.el("p", { class: "muted" }, "The tree is empty."));
}
