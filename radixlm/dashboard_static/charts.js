// Live line charts over uPlot (vendored: uPlot.iife.min.js, MIT, uPlot.LICENSE): the last
// WINDOW points of each series, x in seconds (wall time).
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

class LiveChart {
  constructor(parent, name, title, labels, opts) {
    opts = opts || {};
    this.name = name;
    this.window = opts.window || 300;
    this.data = [[], ...labels.map(() => [])];
    this.box = RL.el("div", { class: "chart", "data-chart": name });
    parent.append(this.box);
    const series = [{}, ...labels.map((label, i) => ({
      label, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: true,
      value: (u, v) => (v === null || v === undefined ? "–" : v.toFixed(opts.digits === undefined ? 1 : opts.digits)),
    }))];
    this.plot = new uPlot({
      title, width: opts.width || 380, height: opts.height || 170, series,
      scales: { x: { time: true }, y: opts.range ? { range: opts.range } : { range: (u, lo, hi) => [0, Math.max(hi, opts.minMax || 1)] } },
      axes: [{}, { size: 50 }],
      legend: { live: false },
    }, this.data, this.box);
  }
  push(t, values) {
    this.data[0].push(t);
    values.forEach((v, i) => this.data[i + 1].push(v === undefined ? null : v));
    if (this.data[0].length > this.window) for (const s of this.data) s.shift();
    this.plot.setData(this.data);
  }
}
