// The ninfer-jax web page: chat through POST /v1/chat/completions (SSE stream) and plots of
// GET /metrics (Prometheus text), polled once a second. Plain JS, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY = 120;   // samples kept per plot (two minutes at one poll a second)
const MIN_SPAN = 30;   // the plots' x axis is at least this many samples wide
const POLL_MS = 1000;
const KEY_STORE = "ninfer-api-key";

const conversation = [];  // {role, content} of finished turns, sent with each request
let controller = null;    // the AbortController of the stream in flight
let modelId = null;

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text, state) {
  $("status").textContent = text;
  $("status").dataset.state = state;
}

// ---- chat ------------------------------------------------------------------------------

function addMessage(role, text) {
  const box = document.createElement("div");
  box.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  box.appendChild(label);
  if (role === "assistant") {
    const reasoning = document.createElement("div");
    reasoning.className = "reasoning";
    reasoning.title = "reasoning";
    box.appendChild(reasoning);
  }
  const answer = document.createElement("div");
  answer.className = "answer";
  answer.textContent = text || "";
  box.appendChild(answer);
  $("messages").appendChild(box);
  $("messages").scrollTop = $("messages").scrollHeight;
  return box;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (_) {
    return response.statusText;
  }
}

// Yields the parsed JSON of each `data:` event of an SSE body until [DONE].
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const box = addMessage("assistant", "");
  box.classList.add("streaming");
  const answer = box.querySelector(".answer");
  const reasoning = box.querySelector(".reasoning");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  setStatus("streaming…", "streaming");
  const request = { messages: conversation.slice(), stream: true,
                    max_tokens: Math.max(1, parseInt($("max-tokens").value, 10) || 256) };
  if (modelId) request.model = modelId;
  let finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(true), body: JSON.stringify(request),
      signal: controller.signal });
    if (!response.ok) throw new Error(`${response.status}: ${await errorText(response)}`);
    for await (const chunk of sseEvents(response.body)) {
      if (chunk.error) throw new Error(chunk.error.message || "stream error");
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) reasoning.textContent += delta.reasoning_content;
        if (delta.content) answer.textContent += delta.content;
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      $("messages").scrollTop = $("messages").scrollHeight;
    }
    setStatus(`done (${finish || "end of stream"})`, "done");
  } catch (err) {
    if (err.name === "AbortError") {
      setStatus("stopped", "stopped");
      box.dataset.stopped = "true";
    } else {
      const line = document.createElement("div");
      line.className = "error";
      line.textContent = String(err.message || err);
      box.appendChild(line);
      setStatus("error", "error");
    }
  } finally {
    box.classList.remove("streaming");
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    // Only the answer goes back into the conversation; reasoning is not replayed.
    conversation.push({ role: "assistant", content: answer.textContent });
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation.length = 0;
  $("messages").textContent = "";
  setStatus("", "idle");
});
$("api-key").value = sessionStorage.getItem(KEY_STORE) || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORE, $("api-key").value);
  loadModel();
});

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers(false) });
    if (!response.ok) throw new Error(await errorText(response));
    const body = await response.json();
    modelId = body.data && body.data.length ? body.data[0].id : null;
    $("model").textContent = "model: " + (modelId || "?");
  } catch (err) {
    $("model").textContent = "model: ? (" + (err.message || err) + ")";
  }
}

// ---- metrics ---------------------------------------------------------------------------

// Prometheus text exposition -> {name: sum of its samples over all label sets}.
function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const value = parseFloat(match[3]);
    if (!Number.isNaN(value)) values[match[1]] = (values[match[1]] || 0) + value;
  }
  return values;
}

class Plot {
  // series: [{label, color}]; max: a fixed ceiling, or null to fit the data
  constructor(canvas, series) {
    this.canvas = canvas;
    this.series = series;
    this.data = series.map(() => []);
    this.ceiling = null;
  }
  push(values, ceiling) {
    values.forEach((v, i) => {
      this.data[i].push(v);
      if (this.data[i].length > HISTORY) this.data[i].shift();
    });
    this.ceiling = ceiling;
    this.draw();
  }
  draw() {
    const c = this.canvas, g = c.getContext("2d");
    const ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth || c.width, h = c.clientHeight || c.height;
    if (c.width !== Math.round(w * ratio)) { c.width = Math.round(w * ratio); c.height = Math.round(h * ratio); }
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, h);
    const left = 36, top = 6, bottom = h - 14, right = w - 6;
    const top_value = this.ceiling || Math.max(1, ...this.data.flat()) * 1.15;
    g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280"; g.font = "10px system-ui"; g.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      const y = bottom - f * (bottom - top);
      g.beginPath(); g.moveTo(left, y); g.lineTo(right, y); g.stroke();
      g.fillText(formatNumber(top_value * f), 2, y + 3);
    }
    // Fills from the left for the first MIN_SPAN samples, then scrolls up to HISTORY.
    const span = Math.max(MIN_SPAN, ...this.data.map((points) => points.length));
    const dx = (right - left) / (span - 1);
    this.data.forEach((points, i) => {
      if (!points.length) return;
      g.strokeStyle = this.series[i].color; g.lineWidth = 1.6; g.beginPath();
      points.forEach((v, j) => {
        const y = bottom - Math.min(1, v / top_value) * (bottom - top);
        if (j) g.lineTo(left + j * dx, y); else g.moveTo(left, y);
      });
      g.stroke();
    });
    let x = left;
    this.series.forEach((s) => {
      g.fillStyle = s.color; g.fillText(s.label, x, h - 2); x += g.measureText(s.label).width + 12;
    });
  }
}

function formatNumber(v) {
  if (v >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(1);
}

const plots = {
  throughput: new Plot($("plot-throughput"), [{ label: "generated tok/s", color: "#2563eb" },
                                              { label: "prefill tok/s", color: "#9333ea" }]),
  lanes: new Plot($("plot-lanes"), [{ label: "running", color: "#059669" },
                                    { label: "waiting", color: "#d97706" }]),
  kv: new Plot($("plot-kv"), [{ label: "used pages", color: "#dc2626" }]),
  cache: new Plot($("plot-cache"), [{ label: "prefix-cached pages", color: "#0891b2" },
                                    { label: "host tier MiB", color: "#7c3aed" }]),
};
let previous = null;  // {time, values} of the last poll

async function poll() {
  try {
    const response = await fetch("/metrics", { headers: headers(false) });
    if (!response.ok) throw new Error(`${response.status}: ${await errorText(response)}`);
    const values = parseMetrics(await response.text());
    const now = performance.now();
    const rate = (name) => previous
      ? Math.max(0, (values[name] - previous.values[name]) / ((now - previous.time) / 1000)) || 0 : 0;
    const generated = rate("ninfer_generation_tokens_total");
    const prefilled = rate("ninfer_prefill_tokens_total");
    const lanes = values.ninfer_requests_running || 0, waiting = values.ninfer_requests_waiting || 0;
    const capacity = values.ninfer_device_kv_capacity_pages || 0;
    const used = values.ninfer_device_kv_used_pages || 0;
    const cached = values.ninfer_device_kv_cached_pages || 0;
    const hostMib = (values.ninfer_host_context_used_bytes || 0) / 1048576;
    const hostCap = (values.ninfer_host_context_capacity_bytes || 0) / 1048576;
    plots.throughput.push([generated, prefilled], null);
    plots.lanes.push([lanes, waiting], Math.max(values.ninfer_max_concurrency || 1, waiting));
    plots.kv.push([used], capacity || null);
    plots.cache.push([cached, hostMib], null);
    $("v-throughput").textContent = generated.toFixed(1);
    $("v-lanes").textContent = `${lanes} / ${values.ninfer_max_concurrency || "?"}`;
    $("v-waiting").textContent = String(waiting);
    $("v-kv").textContent = `${used} / ${capacity}` + (capacity ? ` (${(100 * used / capacity).toFixed(1)}%)` : "");
    $("v-cache").textContent = String(cached);
    $("v-host").textContent = `${hostMib.toFixed(1)} / ${hostCap.toFixed(0)} MiB`;
    $("v-totals").textContent = `generated ${values.ninfer_generation_tokens_total || 0} tokens, ` +
      `prompt ${values.ninfer_prompt_tokens_total || 0} (cached ${values.ninfer_prompt_tokens_cached_total || 0})`;
    $("v-totals").dataset.generated = String(values.ninfer_generation_tokens_total || 0);
    $("metrics-status").textContent = "";
    previous = { time: now, values };
  } catch (err) {
    $("metrics-status").textContent = "(" + (err.message || err) + ")";
  }
}

loadModel();
poll();
setInterval(poll, POLL_MS);
