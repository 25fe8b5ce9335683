// The TideMQ dashboard: polls /admin/overview, /admin/clients, /admin/rules (the event rules)
// and /admin/cluster (a replicated store group, where there is one) every second, turns two
// successive overviews (and rule listings) into rates, and looks messages up (/admin/messages) with their trace
// (/admin/trace). Data reaches the DOM through textContent only, never as markup.
"use strict";

const POLL_MS = 1000;
const MAX_CLIENT_ROWS = 50;
const CREDENTIALS_KEY = "tidemq.adminAuthorization"; // the Authorization header: Bearer or Basic

let previous = null; // the last overview, for rates
let previousRules = null; // the last rule listing: {time, delivered: Map of name to count}, for rates
let paused = false; // waiting for credentials

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- the admin API --------------------------------------------------------------------------
async function api(path) {
  const headers = { Accept: "application/json" };
  const credentials = sessionStorage.getItem(CREDENTIALS_KEY);
  if (credentials) headers.Authorization = credentials;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      const body = await response.json();
      if (body && body.error) message = body.error;
    } catch (_) { /* not JSON: keep the status line */ }
    throw new HttpError(response.status, message);
  }
  return response.json();
}

// 401: no credentials, or refused ones; 403: a user who is not one of admin_users
function needCredentials(error) {
  paused = true;
  const form = document.getElementById("token-form");
  form.hidden = false;
  const refused = Boolean(sessionStorage.getItem(CREDENTIALS_KEY));
  document.getElementById("token-error").textContent = refused ? "refused: " + error.message : "";
  setStatus("error", "admin token or an admin user's credentials needed");
  document.getElementById("token-input").focus();
}

function basicCredentials(user, password) {
  const bytes = new TextEncoder().encode(user + ":" + password);
  return "Basic " + btoa(String.fromCharCode(...bytes));
}

function setStatus(state, text) {
  const status = document.getElementById("status");
  status.dataset.state = state;
  status.textContent = text;
}

// -- formatting -----------------------------------------------------------------------------
const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

function count(n) {
  return n === null || n === undefined ? "–" : integer.format(n);
}

function rate(n) {
  if (n === null) return "–";
  return n >= 100 ? integer.format(n) : decimal.format(n);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? integer.format(n) : decimal.format(n)) + " " + units[i];
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 0.001) return decimal.format(s * 1e6) + " µs";
  if (s < 1) return decimal.format(s * 1e3) + " ms";
  return decimal.format(s) + " s";
}

function clock(ms) {
  const d = new Date(ms);
  const pad = (n, w) => String(n).padStart(w, "0");
  return pad(d.getHours(), 2) + ":" + pad(d.getMinutes(), 2) + ":" + pad(d.getSeconds(), 2) + "." +
    pad(d.getMilliseconds(), 3);
}

function cell(row, text, field) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (field) td.dataset.field = field;
  return td;
}

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

function perSecond(now, before, dt) {
  return before === undefined || dt <= 0 ? null : Math.max(0, now - before) / dt;
}

// -- rendering ------------------------------------------------------------------------------
function renderProtocols(overview) {
  const body = document.querySelector("#protocols tbody");
  const dt = previous ? (overview.time - previous.time) / 1000 : 0;
  body.replaceChildren();
  for (const [name, p] of Object.entries(overview.protocols)) {
    const before = previous && previous.protocols[name] ? previous.protocols[name] : {};
    const row = body.insertRow();
    row.dataset.protocol = name;
    cell(row, name, "protocol");
    cell(row, count(p.connections), "connections");
    cell(row, rate(perSecond(p.messages_in, before.messages_in, dt)), "messages_in_rate");
    cell(row, rate(perSecond(p.messages_out, before.messages_out, dt)), "messages_out_rate");
    cell(row, bytes(perSecond(p.bytes_in, before.bytes_in, dt)) + "/s", "bytes_in_rate");
    cell(row, bytes(perSecond(p.bytes_out, before.bytes_out, dt)) + "/s", "bytes_out_rate");
    cell(row, count(p.messages_in), "messages_in");
    cell(row, count(p.messages_out), "messages_out");
    cell(row, count(p.dropped), "dropped");
  }
  setText("mqtt-sessions", count(overview.mqtt_sessions));
}

function renderStore(overview) {
  const s = overview.store;
  if (!s) return;
  setText("store-queues", count(s.queues));
  setText("store-commitlog", bytes(s.commitlog_bytes));
  setText("store-dispatch-lag", bytes(s.dispatch_lag_bytes));
  setText("store-backlog", count(s.backlog_messages) + " messages");
  const latency = s.put_latency;
  const before = previous && previous.store ? previous.store.put_latency : null;
  const dt = previous ? (overview.time - previous.time) / 1000 : 0;
  let puts = null;
  let mean = null;
  if (before && dt > 0) {
    const n = latency.count - before.count;
    puts = Math.max(0, n) / dt;
    mean = n > 0 ? (latency.sum_s - before.sum_s) / n : null;
  }
  setText("store-put-rate", rate(puts));
  setText("store-put-mean", seconds(mean));
  setText("store-put-pct", seconds(latency.p50_s) + " / " + seconds(latency.p99_s));
  setText("store-loop-lag", seconds(s.event_loop_lag_s));
  const alarm = document.getElementById("store-alarm");
  alarm.textContent = s.resource_alarm ? "RAISED: publishers blocked" : "off";
  alarm.className = s.resource_alarm ? "error" : "";
}

function renderBacklogs(overview) {
  const body = document.querySelector("#backlogs tbody");
  body.replaceChildren();
  for (const b of overview.backlogs) {
    const row = body.insertRow();
    cell(row, b.kind, "kind");
    cell(row, b.name, "name");
    cell(row, count(b.lag), "lag");
  }
  if (overview.backlogs.length === 0) {
    const row = body.insertRow();
    const td = cell(row, "nothing is behind");
    td.colSpan = 3;
    td.className = "empty";
  }
  setText("backlogs-partial", overview.backlogs_partial ? "Only the first 10,000 MQTT sessions were read." : "");
}

function renderClients(clients) {
  const body = document.querySelector("#clients tbody");
  body.replaceChildren();
  for (const c of clients.slice(0, MAX_CLIENT_ROWS)) {
    const row = body.insertRow();
    row.dataset.protocol = c.protocol;
    cell(row, c.protocol, "protocol");
    cell(row, c.id, "id");
    cell(row, c.peer, "peer");
    cell(row, c.username, "username");
  }
  if (clients.length === 0) {
    const td = cell(body.insertRow(), "no client is connected");
    td.colSpan = 4;
    td.className = "empty";
  }
  setText("clients-more", clients.length > MAX_CLIENT_ROWS ?
    "… and " + count(clients.length - MAX_CLIENT_ROWS) + " more (tidemq ctl clients lists them all)" : "");
}

// rows of /admin/cluster; null: this node is in no replicated group (the section stays hidden)
function renderGroup(rows) {
  const section = document.getElementById("group-section");
  section.hidden = rows === null;
  if (rows === null) return;
  const body = document.querySelector("#group tbody");
  body.replaceChildren();
  for (const r of rows) {
    const row = body.insertRow();
    row.dataset.node = r.node;
    cell(row, r.node, "node");
    cell(row, r.role, "role");
    cell(row, r.epoch === null ? "–" : count(r.epoch), "epoch");
    cell(row, r.in_sync === "leader" ? "leader" : r.in_sync ? "yes" : "no", "in_sync");
    cell(row, r.end === null ? "–" : bytes(r.end), "end");
    cell(row, r.lag_bytes === null || r.lag_bytes === undefined ? "–" : bytes(r.lag_bytes), "lag_bytes");
    cell(row, r.lag_s === null || r.lag_s === undefined ? "–" : decimal.format(r.lag_s), "lag_s");
  }
}

async function pollGroup() {
  try {
    renderGroup(await api("admin/cluster"));
  } catch (error) {
    if (error.status === 404) {
      renderGroup(null);
    } else {
      setText("group-note", "cannot read the group: " + error.message);
    }
  }
}

// rows of /admin/rules, read at `time` (epoch ms): one row a rule, its deliveries per second from
// the listing before
function renderRules(rows, time) {
  const table = document.getElementById("rules");
  table.hidden = false;
  document.getElementById("rules-about").hidden = false;
  setText("rules-note", "");
  const body = table.tBodies[0];
  const dt = previousRules ? (time - previousRules.time) / 1000 : 0;
  body.replaceChildren();
  for (const r of rows) {
    const before = previousRules ? previousRules.delivered.get(r.name) : undefined;
    const row = body.insertRow();
    row.dataset.rule = r.name;
    row.dataset.state = r.state;
    cell(row, r.name, "name");
    cell(row, r.state, "state");
    cell(row, count(r.matched), "matched");
    cell(row, count(r.delivered), "delivered");
    cell(row, rate(perSecond(r.delivered, before, dt)), "delivered_rate");
    cell(row, count(r.retried), "retried");
    cell(row, count(r.dead_lettered), "dead_lettered");
    cell(row, count(r.lag), "lag");
    const latency = cell(row, r.target_latency_ms === null ? "" : r.target_latency_ms.toFixed(2), "target_latency_ms");
    latency.title = count(r.target_calls) + " calls";
    const error = cell(row, r.last_error, "last_error");
    if (r.last_error) error.title = r.last_error;
  }
  if (rows.length === 0) {
    const td = cell(body.insertRow(), "no rule (tidemq ctl rules create, or event_rules in the configuration)");
    td.colSpan = 10;
    td.className = "empty";
  }
  previousRules = { time, delivered: new Map(rows.map((r) => [r.name, r.delivered])) };
}

// a node without the rules: the table gives way to `text`, what the node said
function rulesElsewhere(text) {
  document.getElementById("rules").hidden = true;
  document.getElementById("rules-about").hidden = true;
  previousRules = null;
  setText("rules-note", text);
}

async function pollRules() {
  try {
    renderRules(await api("admin/rules"), Date.now());
  } catch (error) {
    if (error.status === 421) {
      rulesElsewhere(error.message); // a gateway node: the message names the node that keeps them
    } else if (error.status === 404 || error.status === 501) {
      rulesElsewhere("no rules engine on this node" + (error.status === 501 ? ": " + error.message : ""));
    } else if (error.status !== 401 && error.status !== 403) { // (credentials: the overview asks)
      setText("rules-note", "cannot read the rules: " + error.message);
    }
  }
}

// -- polling --------------------------------------------------------------------------------
async function poll() {
  if (paused) return;
  try {
    const [overview, clients] = await Promise.all([api("admin/overview"), api("admin/clients"), pollGroup(),
      pollRules()]);
    renderProtocols(overview);
    renderStore(overview);
    renderBacklogs(overview);
    renderClients(clients);
    previous = overview;
    setStatus("live", "live · " + clock(overview.time));
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      needCredentials(error);
    } else {
      setStatus("error", "cannot read the gateway: " + error.message);
    }
  }
}

// -- message lookup and trace ---------------------------------------------------------------
function query(params) {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) search.set(k, v);
  return search.toString();
}

function renderMessages(messages) {
  const body = document.querySelector("#messages tbody");
  body.replaceChildren();
  for (const m of messages) {
    const row = body.insertRow();
    cell(row, m.msg_id, "msg_id");
    cell(row, m.topic, "topic");
    cell(row, m.key, "key");
    cell(row, new Date(m.store_timestamp).toISOString(), "store_timestamp");
    cell(row, count(m.size), "size");
    cell(row, Object.entries(m.queues).map(([q, o]) => q + "@" + o).join(" "), "queues");
    cell(row, m.body !== undefined ? m.body : "(binary) " + m.body_base64, "body");
  }
  setText("message-status", messages.length ? count(messages.length) + " found" : "no message found");
}

const EVENT_BASE = new Set(["type", "msg_id", "time", "protocol", "client"]);

function details(event) {
  return Object.entries(event)
    .filter(([k]) => !EVENT_BASE.has(k))
    .map(([k, v]) => k + "=" + (typeof v === "object" && v !== null ? JSON.stringify(v) : v))
    .join("  ");
}

function renderTimeline(trace) {
  const body = document.querySelector("#timeline tbody");
  const status = document.getElementById("trace-status");
  body.replaceChildren();
  const events = trace.events || [];
  const first = events.length ? events[0].time : 0;
  for (const e of events) {
    const row = body.insertRow();
    row.dataset.type = e.type;
    cell(row, clock(e.time), "time");
    cell(row, decimal.format(e.time - first), "offset_ms");
    cell(row, e.type, "type");
    cell(row, e.msg_id, "msg_id");
    cell(row, e.protocol, "protocol");
    cell(row, e.client, "client");
    cell(row, details(e), "details");
  }
  if (events.length) {
    status.dataset.state = "events";
    status.textContent = count(events.length) + " events";
  } else if (trace.tracing && trace.tracing.length === 0) {
    status.dataset.state = "off";
    status.textContent = "no trace events: message trace is off on every listener (configuration: trace)";
  } else {
    status.dataset.state = "empty";
    status.textContent = "no trace events for this message (yet: events are written every 0.1 s)";
  }
}

async function lookUp(event) {
  event.preventDefault();
  const msgId = document.getElementById("trace-msg-id").value.trim();
  const key = document.getElementById("trace-key").value.trim();
  const topic = document.getElementById("trace-topic").value.trim();
  const errorLine = document.getElementById("trace-error");
  const status = document.getElementById("trace-status");
  errorLine.textContent = "";
  if (!msgId && !key) {
    errorLine.textContent = "give a message id, or a key (and its topic, to see the stored message)";
    return;
  }
  // the store finds messages by key within a topic; the trace finds them by key alone
  const byId = { msg_id: msgId, topic }; // (a client's msgId is looked for in every topic without one)
  const found = msgId ? api("admin/messages?" + query(byId)) :
    topic ? api("admin/messages?" + query({ key, topic })) : Promise.resolve(null);
  setText("message-status", "looking up…");
  status.dataset.state = "loading";
  status.textContent = "looking up…";
  const [messages, trace] = await Promise.allSettled([
    found,
    api("admin/trace?" + query(msgId ? { msg_id: msgId } : { key })),
  ]);
  if (messages.status === "fulfilled" && messages.value === null) {
    document.querySelector("#messages tbody").replaceChildren();
    setText("message-status", "give the topic too to see the stored message");
  } else if (messages.status === "fulfilled") {
    renderMessages(messages.value);
  } else {
    document.querySelector("#messages tbody").replaceChildren();
    setText("message-status", "lookup failed: " + messages.reason.message);
    if (messages.reason.status === 401 || messages.reason.status === 403) needCredentials(messages.reason);
  }
  if (trace.status === "fulfilled") {
    renderTimeline(trace.value);
  } else {
    document.querySelector("#timeline tbody").replaceChildren();
    if (trace.reason.status === 404) {
      status.dataset.state = "unavailable";
      status.textContent = "trace not available (this gateway has no /admin/trace)";
    } else {
      status.dataset.state = "error";
      status.textContent = "trace failed: " + trace.reason.message;
    }
  }
}

// -- start ----------------------------------------------------------------------------------
function start() {
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = document.getElementById("token-input").value.trim();
    const user = document.getElementById("user-input").value.trim();
    const password = document.getElementById("password-input").value;
    if (!token && !(user && password)) return;
    sessionStorage.setItem(CREDENTIALS_KEY, token ? "Bearer " + token : basicCredentials(user, password));
    document.getElementById("token-form").hidden = true;
    for (const id of ["token-input", "user-input", "password-input"]) document.getElementById(id).value = "";
    paused = false;
    setStatus("starting", "connecting…");
    poll();
  });
  document.getElementById("trace-form").addEventListener("submit", lookUp);
  loop();
}

// One poll at a time: the next starts a second after the last one ended.
async function loop() {
  await poll();
  setTimeout(loop, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);
