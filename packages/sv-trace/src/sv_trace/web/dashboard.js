// The live dashboard: asks for the API key when the server needs one, then draws each
// server-sent frame of /dashboard/events.
"use strict";

const rates = [];
const HISTORY = 120; // frames in the tokens/s line: a minute at two frames a second

function text(id, value) { document.getElementById(id).textContent = value; }

function ms(value) { return value === null || value === undefined ? "—" : value.toFixed(1); }

function fillTable(id, rows, cells) {
  const body = document.querySelector("#" + id + " tbody");
  body.textContent = "";
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.className = "req-row";
    tr.dataset.request = String(row.request);
    cells(row).forEach(function (value, i) {
      const td = document.createElement("td");
      if (i === 0) {
        const swatch = document.createElement("i");
        swatch.className = "swatch";
        swatch.style.background = requestColor(row.request);
        td.appendChild(swatch);
      }
      td.appendChild(document.createTextNode(String(value)));
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

function draw(frame) {
  text("meta", frame.model + " · live, a frame every 0.5 s");
  text("f-tps", frame.tokens_per_s.toFixed(1));
  text("f-ttft", ms(frame.ttft_recent_ms) + " · " + ms(frame.ttft_ms));
  text("f-itl", ms(frame.itl_recent_ms) + " · " + ms(frame.itl_ms));
  text("f-running", String(frame.running));
  text("f-waiting", String(frame.waiting));
  text("f-steps", frame.steps + " · " + frame.admission_waits + " · " + frame.preemptions);
  rates.push(frame.tokens_per_s);
  if (rates.length > HISTORY) rates.shift();
  const top = Math.max(1, Math.max.apply(null, rates));
  document.getElementById("tps-line").setAttribute("d", rates.map(function (v, i) {
    return (i ? "L" : "M") + (i * 240 / (HISTORY - 1)).toFixed(1) + " " + (58 - (v / top) * 56).toFixed(1);
  }).join(" "));
  const view = frame.view;
  if (!view) return;
  const pool = view.pool;
  text("f-pages", pool.assigned + " · " + pool.cached + " · " + pool.free);
  drawPool(document.getElementById("pool"), pool);
  fillTable("running", view.running, function (r) {
    return ["request " + r.request, r.phase, r.prompt_tokens, r.output_tokens + " / " + r.max_new_tokens, r.pages, r.row];
  });
  fillTable("queue", view.queue, function (r) {
    return ["request " + r.request, r.prompt_tokens, r.waited ? "yes" : "no", r.preemptions];
  });
}

function listen() {
  document.getElementById("key-form").hidden = true;
  document.getElementById("live").hidden = false;
  const source = new EventSource("/dashboard/events");
  source.onmessage = function (event) { draw(JSON.parse(event.data)); };
  source.onerror = function () { text("meta", "disconnected; retrying…"); };
}

async function login(key) {
  const response = await fetch("/dashboard/session", { method: "POST", headers: { Authorization: "Bearer " + key } });
  return response.ok;
}

async function main() {
  const state = await (await fetch("/dashboard/session")).json();
  if (!state.key_required || state.authorized) return listen();
  // A key in the fragment (/dashboard#key=KEY) is used once and taken out of the address bar.
  const fragment = new URLSearchParams(location.hash.slice(1)).get("key");
  if (fragment) {
    window.history.replaceState(null, "", location.pathname);
    if (await login(fragment)) return listen();
  }
  const form = document.getElementById("key-form");
  form.hidden = false;
  text("meta", "locked");
  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    if (await login(document.getElementById("key-input").value)) listen();
    else text("key-error", "incorrect API key");
  });
}

main();
