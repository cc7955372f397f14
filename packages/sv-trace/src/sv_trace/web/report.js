// The trace report: reads the trace's figures from #trace-data and draws every section.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const data = JSON.parse(document.getElementById("trace-data").textContent);
const steps = data.steps;
const firstStep = steps.length ? steps[0].step : 0;
const lastStep = steps.length ? steps[steps.length - 1].step : 0;
const span = lastStep - firstStep + 1;
const pxPerStep = Math.max(1, Math.min(14, Math.floor(900 / Math.max(1, span))));

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const key in attrs || {}) node.setAttribute(key, attrs[key]);
  if (text !== undefined) node.textContent = text;
  return node;
}

function figure(label, value) {
  const box = el("div", { class: "figure" });
  box.appendChild(el("div", { class: "value" }, String(value)));
  box.appendChild(el("div", { class: "label" }, label));
  return box;
}

function drawHeader() {
  const h = data.header;
  document.getElementById("meta").textContent =
    data.source + " · " + (h.model || "") + " on " + (h.device || "?") + " · " + h.policy + " batching, " +
    h.admission + " admission · " + h.num_pages + " pages of " + h.page_size + " tokens · " +
    steps.length + " steps · recorded " + h.created;
  const box = document.getElementById("stats");
  const s = data.stats;
  if (!s) {
    box.appendChild(figure("the trace has no end line (the process was killed?)", "—"));
    return;
  }
  box.appendChild(figure("pool size (pages)", s.pool_pages));
  box.appendChild(figure("peak active requests", s.peak_running));
  box.appendChild(figure("largest decode batch", s.largest_decode_batch));
  box.appendChild(figure("peak assigned pages", s.peak_assigned_pages));
  box.appendChild(figure("admission waits", s.admission_waits));
  box.appendChild(figure("prefix-cache hit tokens", s.prefix_cache_hit_tokens));
  box.appendChild(figure("preemptions (tokens recomputed)", s.preemptions + " (" + s.recomputed_tokens + ")"));
  box.appendChild(figure("final free pages", s.free_pages));
  if (s.drafted_tokens > 0) {  // a speculating engine's (checked as counts when present)
    const rate = Math.round((100 * (s.accepted_tokens || 0)) / s.drafted_tokens);
    box.appendChild(figure("draft tokens verified (accepted)", s.drafted_tokens + " (" + (s.accepted_tokens || 0) + ", " + rate + "%)"));
  }
  const reasons = {};
  for (const st of steps) if (st.wait) reasons[st.wait] = (reasons[st.wait] || 0) + 1;
  const parts = Object.keys(reasons).sort().map(function (r) { return r + ": " + reasons[r]; });
  document.getElementById("waits").textContent =
    parts.length ? "steps whose plan left the head of the queue waiting, by reason — " + parts.join(", ") : "no request ever waited at the head of the queue";
}

function stepX(step) { return (step - firstStep) * pxPerStep; }

function bar(svg, cls, step, width, title) {
  const r = el("svg:rect", { class: cls, x: stepX(step), y: 1, width: Math.max(1, width * pxPerStep), height: 12 });
  r.appendChild(el("svg:title", {}, title));
  svg.appendChild(r);
}

function runs(list) {
  // Consecutive step numbers as [first, count] runs.
  const out = [];
  for (const s of list) {
    const last = out[out.length - 1];
    if (last && last[0] + last[1] === s) last[1] += 1; else out.push([s, 1]);
  }
  return out;
}

function drawTimeline() {
  const box = document.getElementById("timeline");
  for (const r of data.requests) {
    const row = el("div", { class: "req-row", "data-request": String(r.id) });
    const finish = r.finish ? r.finish : "running";
    row.appendChild(el("div", { class: "label" }, "request " + r.id + " · " + finish));
    const svg = el("svg:svg", { width: span * pxPerStep + 4, height: 14 });
    const start = r.running_from !== null ? r.running_from : r.admitted.length ? r.admitted[0] : (r.end_step !== null ? r.end_step : lastStep + 1);
    if (start > r.queued_step) bar(svg, "queued", r.queued_step, start - r.queued_step, "queued from step " + r.queued_step);
    for (const w of r.waits) bar(svg, "wait", w[0], 1, "step " + w[0] + ": waits (" + w[1] + ")");
    for (const run of runs(r.decode)) bar(svg, "decode", run[0], run[1], "decode, steps " + run[0] + "–" + (run[0] + run[1] - 1));
    for (const c of r.prefill) bar(svg, "prefill", c[0], 1, "step " + c[0] + ": prefill positions " + c[1] + "–" + (c[2] - 1));
    for (const p of r.preempted) bar(svg, "preempt", p, 1, "step " + p + ": preempted");
    if (r.end_step !== null) bar(svg, r.finish === "cancelled" ? "cancel" : "finish", r.end_step, 1, "step " + r.end_step + ": " + r.finish);
    row.appendChild(svg);
    box.appendChild(row);
  }
}

function chart(svg, series, onPick) {
  // Stacked bars per step: series = [[class, value(step)], ...], bottom first.
  const width = Math.max(1, span * pxPerStep);
  svg.setAttribute("viewBox", "0 0 " + width + " 90");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.style.width = Math.min(1000, width) + "px";
  let max = 1;
  for (const st of steps) {
    let total = 0;
    for (const s of series) total += s[1](st);
    max = Math.max(max, total);
  }
  for (const st of steps) {
    let y = 90;
    for (const s of series) {
      const h = (s[1](st) / max) * 88;
      if (h > 0) {
        const r = el("svg:rect", { class: s[0], x: stepX(st.step), y: y - h, width: Math.max(1, pxPerStep - (pxPerStep > 3 ? 1 : 0)), height: h });
        r.appendChild(el("svg:title", {}, "step " + st.step + ": " + s[0] + " " + s[1](st)));
        r.addEventListener("click", function () { onPick(st.index); });
        svg.appendChild(r);
        y -= h;
      }
    }
  }
  const cursor = el("svg:rect", { class: "cursor", x: 0, y: 0, width: pxPerStep, height: 90 });
  svg.appendChild(cursor);
  return { max: max, cursor: cursor };
}

function drawBatch(onPick) {
  const svg = document.getElementById("batch");
  const c = chart(svg, [["tokens", function (st) { return st.tokens; }]], onPick);
  let d = "";
  for (const st of steps) {
    const y = 90 - ((st.prefills + st.decodes) / c.max) * 88;
    d += (d ? " L" : "M") + (stepX(st.step) + pxPerStep / 2) + " " + y.toFixed(1);
  }
  if (d) svg.appendChild(el("svg:path", { class: "line", d: d }));
  return c.cursor;
}

function drawPoolChart(onPick) {
  return chart(document.getElementById("pool-chart"), [
    ["assigned", function (st) { return st.assigned; }],
    ["cachedbar", function (st) { return st.cached; }],
    ["free", function (st) { return st.free; }],
  ], onPick).cursor;
}

function probability(logprob) { return Math.exp(logprob); }

function showTooltip(target, token) {
  const tip = document.getElementById("tooltip");
  tip.textContent = "";
  const table = el("table");
  const head = el("tr", { class: "chosen" });
  head.appendChild(el("td", {}, JSON.stringify(token[1])));
  head.appendChild(el("td", {}, token[2] === null ? "" : "p=" + probability(token[2]).toFixed(4)));
  head.appendChild(el("td", {}, "id " + token[0] + ", step " + token[4]));
  table.appendChild(head);
  token[3].forEach(function (alt, i) {
    const row = el("tr", { class: "alt" });
    row.appendChild(el("td", {}, (i + 1) + ". " + JSON.stringify(alt[0])));
    row.appendChild(el("td", {}, probability(alt[1]).toFixed(4)));
    row.appendChild(el("td", {}, "logprob " + alt[1].toFixed(3)));
    table.appendChild(row);
  });
  tip.appendChild(table);
  tip.hidden = false;
  const box = target.getBoundingClientRect();
  tip.style.left = Math.min(window.innerWidth - 370, box.left) + "px";
  tip.style.top = (box.bottom + 6) + "px";
}

function drawTexts() {
  const box = document.getElementById("texts");
  const tip = document.getElementById("tooltip");
  for (const r of data.requests) {
    const section = el("div", { class: "req-text", "data-request": String(r.id) });
    section.appendChild(el("h3", {}, "request " + r.id + " · " + (r.finish || "running") + " · " +
      r.tokens.length + " tokens" + (r.prompt_tokens !== null ? " after a " + r.prompt_tokens + "-token prompt" : "")));
    const details = el("details");
    details.appendChild(el("summary", {}, "prompt"));
    details.appendChild(el("pre", {}, r.prompt_text));
    section.appendChild(details);
    const line = el("div", { class: "tokens" });
    r.tokens.forEach(function (token, i) {
      const span = el("span", { class: "tok", "data-request": String(r.id), "data-index": String(i) }, token[1]);
      if (token[2] !== null) span.style.background = "hsla(" + (120 * probability(token[2])).toFixed(0) + ", 70%, 60%, 0.35)";
      span.addEventListener("mouseenter", function () { span.classList.add("active"); showTooltip(span, token); });
      span.addEventListener("mouseleave", function () { span.classList.remove("active"); tip.hidden = true; });
      line.appendChild(span);
    });
    section.appendChild(line);
    box.appendChild(section);
  }
}

function main() {
  drawHeader();
  drawTimeline();
  const slider = document.getElementById("step-slider");
  const label = document.getElementById("step-label");
  const pool = document.getElementById("pool");
  const cursors = [];
  function show(index) {
    if (!steps.length) { label.textContent = "no steps"; return; }
    slider.value = String(index);
    const st = steps[index];
    drawPool(pool, data.pools[index]);
    label.textContent = "step " + st.step + " · " + st.assigned + " assigned, " + st.cached + " cached, " + st.free +
      " free · " + st.prefills + " prefill chunks, " + st.decodes + " decodes, " + st.tokens + " tokens · " +
      st.waiting + " waiting" + (st.host_ms !== null ? " · host " + st.host_ms.toFixed(2) + " ms" : "") +
      (st.device_ms !== null ? " · GPU " + st.device_ms.toFixed(3) + " ms" : "");
    for (const c of cursors) c.setAttribute("x", String(stepX(st.step)));
  }
  cursors.push(drawBatch(show));
  cursors.push(drawPoolChart(show));
  slider.max = String(Math.max(0, steps.length - 1));
  slider.addEventListener("input", function () { show(Number(slider.value)); });
  // Open on the step that held the most pages: the busiest picture of the pool.
  let busiest = 0;
  steps.forEach(function (st, i) { if (st.assigned > steps[busiest].assigned) busiest = i; });
  show(busiest);
  drawTexts();
}

main();
