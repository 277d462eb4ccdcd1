// The oncelog console: one page, no dependencies. Every view is built from
// a JSON view of the broker (/v1/console/...), fetched again every
// POLL_MS. Everything a client chose (ids, topics, client ids) is put into
// the page as text, never as HTML.
"use strict";

const POLL_MS = 1500;
const state = { form: {}, view: "overview", arg: "", params: new URLSearchParams(), actions: { enabled: false, authentication: "none" }, timer: null, seq: 0, loadedOnce: false };

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v; // CSSOM: allowed by the page's CSP, unlike a style attribute
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

const fmt = {
  n: (v) => (v === null || v === undefined ? "—" : Number(v).toLocaleString("en-US")),
  bytes(v) {
    if (v === null || v === undefined) return "—";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v : v.toFixed(1)) + " " + u[i];
  },
  age(ms) {
    if (ms === null || ms === undefined || ms < 0) return "—";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + (s % 60) + " s";
    const hr = Math.floor(m / 60);
    return hr + " h " + (m % 60) + " min";
  },
  time(ms) {
    if (!ms || ms < 0) return "—";
    const d = new Date(ms);
    return d.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  },
  rate: (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)),
};

// An input of a view's body: what was typed survives the body's refreshes.
function field(id, attrs, fallback) {
  const value = id in state.form ? state.form[id] : fallback;
  return h("input", Object.assign({ id, value, oninput: (e) => { state.form[id] = e.target.value; } }, attrs));
}

function link(href, text) { return h("a", { href }, text); }
function txnLink(id) { return id ? link("#/txn/" + encodeURIComponent(id), id) : "—"; }
function badge(text, kind) { return h("span", { class: "badge" + (kind ? " " + kind : "") }, text); }

function table(headers, rows, rowAttrs) {
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { class: x.endsWith("#") ? "num" : "" }, x.replace(/#$/, ""))))),
    h("tbody", {}, rows.length ? rows.map((r, i) => h("tr", rowAttrs ? rowAttrs(i) : {}, r.map((c, j) =>
      h("td", { class: headers[j].endsWith("#") ? "num" : "" }, c)))) :
      h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none"))));
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

function spark(values, label, unit) {
  const w = 160, hgt = 34;
  const max = Math.max(1e-9, ...values);
  const pts = values.map((v, i) => `${values.length < 2 ? 0 : (i / (values.length - 1)) * w},${hgt - (v / max) * (hgt - 2) - 1}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", hgt); svg.setAttribute("viewBox", `0 0 ${w} ${hgt}`);
  const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  pl.setAttribute("points", pts); pl.setAttribute("fill", "none"); pl.setAttribute("stroke", "#1565c0"); pl.setAttribute("stroke-width", "1.5");
  svg.append(pl);
  const last = values.length ? values[values.length - 1] : 0;
  return h("div", { class: "card spark", "data-metric": label }, h("div", { class: "k" }, label), h("div", { class: "v" }, fmt.rate(last) + " " + unit), svg);
}

function card(k, v, attrs) { return h("div", Object.assign({ class: "card" }, attrs || {}), h("div", { class: "k" }, k), h("div", { class: "v" }, v)); }

function pager(p, onPage) {
  if (!p || p.pages <= 1) return h("span", { class: "muted" }, p ? `${fmt.n(p.total)} rows` : "");
  return h("span", { class: "pager" },
    h("button", { disabled: p.page <= 1, onclick: () => onPage(p.page - 1) }, "‹ prev"),
    ` page ${p.page} of ${p.pages} (${fmt.n(p.total)} rows) `,
    h("button", { disabled: p.page >= p.pages, onclick: () => onPage(p.page + 1) }, "next ›"));
}

function setParam(k, v) {
  const q = new URLSearchParams(state.params);
  if (v === "" || v === null || v === undefined) q.delete(k); else q.set(k, v);
  if (k !== "page") q.delete("page");
  const base = "#/" + state.view + (state.arg ? "/" + encodeURIComponent(state.arg) : "");
  location.hash = base + (q.toString() ? "?" + q.toString() : "");
}

// ---- actions ----------------------------------------------------------

function actionButton(a) {
  if (!state.actions.enabled) return null;
  return h("button", { class: "danger", "data-action": a.action, onclick: () => confirmAction(a) }, a.label);
}

function confirmAction(a) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = a.label + "?";
  const text = document.getElementById("confirm-text");
  text.replaceChildren(h("span", {}, a.confirm || "This changes the broker's durable state. It cannot be undone."));
  let user = null, pass = null;
  if (state.actions.authentication === "basic") {
    user = h("input", { id: "confirm-user", placeholder: "SCRAM user", autocomplete: "username" });
    pass = h("input", { id: "confirm-password", type: "password", placeholder: "password", autocomplete: "current-password" });
    text.append(h("div", {}, user, " ", pass));
  }
  document.getElementById("confirm-cli").textContent = a.cli ? "same as: " + a.cli : "";
  dlg.onclose = async () => {
    if (dlg.returnValue !== "ok") return;
    const headers = {};
    if (user) headers["Authorization"] = "Basic " + btoa(unescape(encodeURIComponent(user.value + ":" + pass.value)));
    const q = new URLSearchParams(a.params || {});
    try {
      const r = await fetch("/v1/console/actions/" + a.action + "?" + q.toString(), { method: "POST", headers, credentials: "same-origin" });
      const body = await r.json().catch(() => ({}));
      setStatus(r.ok ? "done: " + a.label : "refused: " + (body.error || r.status), !r.ok);
    } catch (e) { setStatus("failed: " + e.message, true); }
    refresh();
  };
  dlg.returnValue = "";
  dlg.showModal();
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = "status" + (bad ? " error" : "");
}

// ---- views ------------------------------------------------------------

const views = {};

views.overview = {
  title: "Overview",
  controls() {
    const q = h("input", { id: "topic-filter", placeholder: "filter topics", value: state.params.get("q") || "", onchange: (e) => setParam("q", e.target.value) });
    const sort = h("select", { id: "topic-sort", onchange: (e) => setParam("sort", e.target.value) },
      [["name", "by name"], ["gap", "by LSO gap"], ["size", "by size"]].map(([v, t]) => h("option", { value: v, selected: (state.params.get("sort") || "name") === v }, t)));
    return [q, sort];
  },
  url: () => "/v1/console/overview?" + new URLSearchParams({ page: state.params.get("page") || 1, q: state.params.get("q") || "", sort: state.params.get("sort") || "name" }),
  render(d) {
    const b = d.broker, s = d.samples;
    const health = h("div", { class: "cards", id: "health" },
      card("broker", "node " + b.node_id + " · v" + b.version, { title: b.listeners.map((l) => `${l.name} ${l.protocol} ${l.address}`).join("\n") }),
      card("up", fmt.age(d.now_ms - b.started_ms)),
      card("connections", fmt.n(b.connections)),
      card("open transactions", fmt.n(b.open_transactions) + (b.oldest_open_transaction_ms ? " · oldest " + fmt.age(d.now_ms - b.oldest_open_transaction_ms) : ""), { id: "open-txns" }),
      card("parked", fmt.n(b.parked_transactions)),
      card("stuck (markers failing)", fmt.n(b.stuck_transactions)),
      card("commits / aborts", fmt.n(b.commits) + " / " + fmt.n(b.aborts)),
      card("fsync mean", b.fsync_mean_ms.toFixed(2) + " ms"),
    );
    const rates = h("div", { class: "cards", id: "rates" },
      spark(s.map((x) => x.appended_bytes_per_s / 1048576), "appended", "MiB/s"),
      spark(s.map((x) => x.fsync_ms), "fsync latency", "ms"),
      spark(s.map((x) => x.fsyncs_per_s), "fsyncs", "/s"),
      spark(s.map((x) => x.commits_per_s), "commits", "/s"),
      spark(s.map((x) => x.aborts_per_s), "aborts", "/s"),
      spark(s.map((x) => x.requests_per_s), "requests", "/s"),
    );
    const t = d.totals;
    const rows = d.topics.rows.map((r) => {
      const writers = r.writers.map((w) => badge(w.prefix, r.writers.length > 1 ? "warn" : "info"));
      if (r.writers.length > 1) writers.unshift(badge(r.writers.length + " writers", "bad"));
      const co = r.cutover ? badge(`cut-over ${r.cutover.from} → ${r.cutover.to}: ${r.cutover.phase}${r.cutover.done ? " (done)" : ""}`, r.cutover.phase === "Draining" ? "warn" : "info") : null;
      return [link("#/topic/" + encodeURIComponent(r.topic), r.topic), fmt.n(r.partitions), fmt.n(r.high_watermark),
        r.lso_gap ? h("span", {}, badge(fmt.n(r.lso_gap), "warn"), r.partitions > 1 ? " max " + fmt.n(r.max_lso_gap) : "") : "0",
        r.pinned_partitions ? link("#/stuck", fmt.n(r.pinned_partitions)) : "0",
        fmt.bytes(r.size_bytes), r.writer_prefix ? badge(r.writer_prefix, "ok") : h("span", { class: "muted" }, "any"), h("span", { class: "writers" }, writers), co];
    });
    return [health, rates,
      h("h2", {}, `Topics (${fmt.n(t.topics)} topics, ${fmt.n(t.partitions)} partitions, ${fmt.n(t.pinned_partitions)} with an LSO behind the high watermark)`),
      h("div", { class: "toolbar" }, pager(d.topics, (p) => setParam("page", p))),
      h("div", { id: "topics" }, table(["topic", "partitions#", "high watermark (sum)#", "LSO gap#", "pinned#", "size#", "writer fence", "writers seen (1 min)", "cut-over"], rows, (i) => ({ "data-topic": d.topics.rows[i].topic })))];
  },
};

views.topic = {
  title: () => "Topic " + state.arg,
  controls() {
    const only = h("label", {}, h("input", { type: "checkbox", checked: state.params.get("only") === "pinned", onchange: (e) => setParam("only", e.target.checked ? "pinned" : "") }), " only partitions with an LSO gap");
    return [only];
  },
  url: () => "/v1/console/topic?" + new URLSearchParams({ topic: state.arg, page: state.params.get("page") || 1, only: state.params.get("only") || "" }),
  render(d) {
    const rows = d.partitions.rows.map((p) => [fmt.n(p.partition), fmt.n(p.high_watermark), fmt.n(p.last_stable_offset), p.lso_gap ? badge(fmt.n(p.lso_gap), "warn") : "0",
      fmt.n(p.log_start_offset), fmt.bytes(p.size_bytes),
      p.open.map((o) => h("div", {}, txnLink(o.transactional_id), ` pid ${o.producer_id} e${o.producer_epoch} from offset ${fmt.n(o.first_offset)}`))]);
    const co = d.cutover ? h("p", {}, badge(`cut-over ${d.cutover.from} → ${d.cutover.to}: ${d.cutover.phase}${d.cutover.done ? " (done)" : ""}`, "info"),
      d.cutover.phase === "Draining" ? actionButton({ action: "cutover-rollback", label: "Roll back the cut-over", params: { topic: d.topic },
        cli: `oncelog cutover rollback ${d.topic}`, confirm: `Make ${d.cutover.from} the writer of ${d.topic} again (${d.cutover.to}'s transactions holding it are aborted).` }) : null) : null;
    let start = null;
    if (state.actions.enabled && !(d.cutover && d.cutover.phase === "Draining")) {
      const from = field("cutover-from", { placeholder: "from writer" }, d.writer_prefix || (d.writers[0] && d.writers[0].prefix) || "");
      const to = field("cutover-to", { placeholder: "to writer" }, "");
      const drain = field("cutover-drain", { placeholder: "drain timeout ms", size: 10 }, "300000");
      start = h("div", { class: "toolbar", id: "cutover-form" }, "Cut over: ", from, " → ", to, " drain ", drain,
        h("button", { class: "danger", "data-action": "cutover-start", onclick: () => confirmAction({ action: "cutover-start", label: "Start the cut-over",
          params: { topic: d.topic, from: from.value, to: to.value, drain_timeout_ms: drain.value },
          cli: `oncelog cutover start ${d.topic} --from ${from.value} --to ${to.value} --drain-timeout-ms ${drain.value}`,
          confirm: `From now on no new transaction of ${from.value} may write ${d.topic}; ${to.value}'s commits wait until ${from.value}'s open transactions end, then ${to.value} becomes its only writer and ${from.value} is fenced.` }) }, "Start cut-over…"));
    }
    return [h("p", {}, "writer fence: ", d.writer_prefix ? badge(d.writer_prefix, "ok") : "none", " · writers seen: ", d.writers.length ? d.writers.map((w) => badge(w.prefix, d.writers.length > 1 ? "warn" : "info")) : "none"), co, start,
      h("div", { class: "toolbar" }, pager(d.partitions, (p) => setParam("page", p))),
      table(["partition#", "high watermark#", "LSO#", "gap#", "log start#", "size#", "open transactions"], rows, (i) => ({ class: d.partitions.rows[i].lso_gap ? "pinned" : "" })),
      h("h2", {}, "Configs"), table(["config", "value"], Object.entries(d.configs))];
  },
};

function laneTrack(l, since, now) {
  const span = Math.max(1, now - since);
  const pos = (t) => Math.min(98.5, Math.max(0, ((t - since) / span) * 98.5));
  const track = h("div", { class: "track" });
  for (const e of l.events) {
    const t = e.time_ms;
    if ((e.event === "commit" || e.event === "abort") && e.duration_ms !== undefined) {
      const left = pos(t - e.duration_ms), right = pos(t);
      track.append(h("div", { class: "bar " + e.event, style: `left:${left}%;width:${Math.max(0.3, right - left)}%`,
        title: `${e.event} after ${e.duration_ms} ms · epoch ${e.epoch} · ${e.partitions ? e.partitions.join(", ") : ""}` }));
    } else if (e.event === "fence") {
      track.append(h("span", { class: "mark fence", style: `left:${pos(t)}%`,
        title: `fenced (${e.cause}) at ${fmt.time(t)}: epoch ${e.old_epoch} → ${e.epoch} by ${e.client_id || "?"} ${e.peer || ""}` }, `⚡${e.old_epoch}→${e.epoch}`));
    } else if (e.event === "init") {
      track.append(h("span", { class: "mark init", style: `left:${pos(t)}%`, title: `InitProducerId at ${fmt.time(t)}: producer ${e.producer_id} epoch ${e.epoch} by ${e.client_id || "?"} ${e.peer || ""}` }, "▾"));
    } else if (e.event === "rejected_write" || e.event === "fenced_request") {
      track.append(h("span", { class: "mark rejected", style: `left:${pos(t)}%`, title: `${e.event.replace("_", " ")} ×${e.count} (epoch ${e.epoch}): ${e.detail || ""}` }, "✕"));
    }
  }
  if (l.started_ms) {
    const left = pos(l.started_ms);
    track.append(h("div", { class: "bar " + (l.parked ? "parked" : "open"), style: `left:${left}%;width:${Math.max(0.3, 100 - left)}%`,
      title: `${l.parked ? "parked" : "open"} since ${fmt.time(l.started_ms)} (${fmt.age(now - l.started_ms)}) · ${l.partitions.join(", ")}` }));
  }
  return track;
}

views.transactions = {
  title: "Transactions",
  controls() {
    const list = h("datalist", { id: "writers" });
    const prefix = h("input", { id: "prefix-filter", list: "writers", placeholder: "writer or id prefix", value: state.params.get("prefix") || "", onchange: (e) => setParam("prefix", e.target.value) });
    const topic = h("input", { id: "topic-filter", placeholder: "topic", value: state.params.get("topic") || "", onchange: (e) => setParam("topic", e.target.value) });
    const win = h("select", { id: "window", onchange: (e) => setParam("window_ms", e.target.value) },
      [[60000, "last minute"], [300000, "last 5 min"], [900000, "last 15 min"], [3600000, "last hour"]].map(([v, t]) => h("option", { value: v, selected: String(state.params.get("window_ms") || 300000) === String(v) }, t)));
    return [prefix, list, topic, win];
  },
  url: () => "/v1/console/transactions?" + new URLSearchParams({ page: state.params.get("page") || 1, per_page: 25, prefix: state.params.get("prefix") || "", topic: state.params.get("topic") || "", window_ms: state.params.get("window_ms") || 300000 }),
  render(d) {
    const dl = document.getElementById("writers");
    if (dl) dl.replaceChildren(...d.writers.map((w) => h("option", { value: w.writer }, `${w.ids} ids`)));
    // Zoom to what the lanes hold (within the chosen window), with a margin.
    let earliest = d.now_ms;
    for (const l of d.lanes.rows) {
      if (l.started_ms) earliest = Math.min(earliest, l.started_ms);
      for (const e of l.events) earliest = Math.min(earliest, e.time_ms - (e.duration_ms || 0));
    }
    const since = Math.max(d.since_ms, earliest - Math.max(200, (d.now_ms - earliest) * 0.08));
    const lanes = d.lanes.rows.map((l) => {
      const lastFence = l.events.filter((e) => e.event === "fence").pop();
      return h("div", { class: "lane", "data-id": l.transactional_id },
        h("div", { class: "who" }, txnLink(l.transactional_id),
          h("div", { class: "sub" }, `writer ${l.writer} · ${l.state || "no state"}` + (l.producer_id !== null ? ` · pid ${l.producer_id} epoch ${l.producer_epoch}` : "") + (l.parked ? " · PARKED" : "")),
          lastFence ? h("div", { class: "sub fence-note" }, `fenced ${lastFence.old_epoch}→${lastFence.epoch} (${lastFence.cause}) by ${lastFence.client_id || "?"} ${lastFence.peer || ""}`) : null),
        laneTrack(l, since, d.now_ms));
    });
    return [h("div", { class: "legend" }, h("span", {}, h("i", { style: "background:var(--commit)" }), "committed"), h("span", {}, h("i", { style: "background:var(--abort)" }), "aborted"),
      h("span", {}, h("i", { style: "background:var(--open)" }), "open"), h("span", {}, h("i", { style: "background:var(--parked)" }), "parked"),
      h("span", { style: "color:var(--fence)" }, "⚡ fence old→new epoch (its cause and the fencer in its tooltip)"), h("span", { style: "color:var(--open)" }, "▾ InitProducerId"), h("span", { style: "color:var(--warn)" }, "✕ refused zombie request")),
      h("div", { class: "toolbar" }, pager(d.lanes, (p) => setParam("page", p)), h("span", { class: "muted" }, d.history_since_ms ? `history kept since ${fmt.time(d.history_since_ms)} (in memory)` : "")),
      h("div", { class: "timeline", id: "timeline" }, h("div", { class: "axis" }, h("span", {}, fmt.time(since)), h("span", {}, fmt.time(d.now_ms))), lanes.length ? lanes : h("p", { class: "muted", style: "padding:8px" }, "no transactional id matches"))];
  },
};

views.txn = {
  title: () => "Transactional id " + state.arg,
  url: () => "/v1/console/transaction?" + new URLSearchParams({ id: state.arg }),
  render(d) {
    const hist = d.history || {};
    const summary = h("div", { class: "cards", id: "txn-summary" },
      card("state", d.state || "unknown to the coordinator"),
      card("producer id / epoch", d.producer_id !== null ? `${d.producer_id} / ${d.producer_epoch}` : "—"),
      card("writer", d.writer),
      card("timeout", d.timeout_ms ? fmt.age(d.timeout_ms) : "—"),
      card("open for", d.started_ms ? fmt.age(d.now_ms - d.started_ms) : "—"),
      d.parked ? card("parked since", fmt.time(d.parked.parked_since_ms), { class: "card", style: "border-color:var(--parked)" }) : null);
    const parts = d.partitions.map((p) => [`${p.topic}-${p.partition}`, fmt.n(p.first_offset), fmt.n(p.high_watermark), fmt.n(p.last_stable_offset)]);
    const epochs = (hist.epochs || []).map((e) => [fmt.n(e.producer_id), fmt.n(e.epoch), fmt.time(e.since_ms), e.via, e.client_id || "—", e.peer || "—", e.ended_ms ? `${fmt.time(e.ended_ms)} (${e.ended_by})` : "current"]);
    const fences = (hist.fences || []).map((f) => [fmt.time(f.time_ms), f.cause, `${f.old_epoch} → ${f.new_epoch}`, f.client_id || "—", f.peer || "—", f.open_transaction ? "yes" : "no", (f.aborted_partitions || []).join(", ")]);
    const events = (hist.events || []).slice().reverse().map((e) => [fmt.time(e.time_ms), e.event + (e.count > 1 ? ` ×${e.count}` : ""), `${e.producer_id}/${e.old_epoch !== undefined ? e.old_epoch + "→" : ""}${e.epoch}`,
      (e.partitions || []).join(", "), e.duration_ms !== undefined ? e.duration_ms + " ms" : "", e.client_id || "", e.peer || "", e.detail || ""]);
    const markers = (d.markers || []).map((m) => [fmt.time(m.time_ms), m.commit ? badge("COMMIT", "ok") : badge("ABORT", "bad"), `${m.producer_id}/${m.epoch}`,
      m.partition, fmt.n(m.first_offset), fmt.n(m.marker_offset)]);
    return [summary,
      h("h2", {}, "Partitions of the current transaction"), table(["partition", "first offset#", "high watermark#", "LSO#"], parts),
      h("h2", {}, "Markers (recent ends)"), h("div", { id: "markers" }, table(["time", "marker", "producer/epoch", "partition", "first offset#", "marker offset#"], markers)),
      h("h2", {}, "Fences"), h("div", { id: "fences" }, table(["time", "cause", "epoch", "fencing client", "address", "transaction open", "aborted partitions"], fences)),
      h("h2", {}, "Epochs: who held which"), table(["producer id#", "epoch#", "since", "via", "client id", "address", "ended"], epochs),
      h("h2", {}, "Events"), table(["time", "event", "producer/epoch", "partitions", "took", "client id", "address", "detail"], events),
      h("p", { class: "muted" }, `History is in memory since ${fmt.time(hist.history_since_ms)}.`)];
  },
};

views.stuck = {
  title: "Why is my consumer stuck?",
  url: () => "/v1/console/stuck?" + new URLSearchParams({ page: state.params.get("page") || 1 }),
  render(d) {
    if (!d.partitions.total) return [h("p", { id: "nothing-stuck" }, "No partition's last stable offset trails its high watermark: read_committed consumers can read everything that was written.")];
    const rows = d.partitions.rows.map((r) => {
      const p = r.pinned_by;
      if (!p) return [`${r.topic}-${r.partition}`, fmt.n(r.high_watermark), fmt.n(r.last_stable_offset), badge(fmt.n(r.lso_gap), "warn"), "a transaction being completed (markers not yet durable)", "", "", "", ""];
      const kind = { open: "info", parked: "warn", orphan: "bad", completing: "info" }[p.kind];
      return [`${r.topic}-${r.partition}`, fmt.n(r.high_watermark), fmt.n(r.last_stable_offset), badge(fmt.n(r.lso_gap), "warn"),
        h("div", {}, txnLink(p.transactional_id), h("div", { class: "muted" }, `producer ${p.producer_id} epoch ${p.producer_epoch} · from offset ${fmt.n(p.first_offset)}`)),
        h("div", {}, badge(p.kind, kind), " ", p.state || ""),
        h("span", { class: "age" }, fmt.age(p.age_ms)) , p.client_id ? `${p.client_id} @ ${p.peer || "?"}` : (p.peer || "—"),
        h("div", { class: "advice" }, p.resolution.advice, p.resolution.actions.map((a) => h("div", {}, h("pre", {}, a.cli), actionButton(Object.assign({ confirm: `${a.label}: producer ${p.producer_id} epoch ${p.producer_epoch} at ${r.topic}-${r.partition}. ${p.resolution.advice}` }, a)))))];
    });
    return [h("div", { class: "toolbar" }, pager(d.partitions, (p) => setParam("page", p))),
      h("div", { id: "stuck" }, table(["partition", "high watermark#", "LSO#", "held back#", "pinned by", "state", "age", "client", "what resolves it"], rows, (i) => ({ "data-partition": `${d.partitions.rows[i].topic}-${d.partitions.rows[i].partition}` })))];
  },
};

views.groups = {
  title: "Consumer groups",
  controls: () => [h("input", { id: "group-filter", placeholder: "filter groups", value: state.params.get("q") || "", onchange: (e) => setParam("q", e.target.value) })],
  url: () => "/v1/console/groups?" + new URLSearchParams({ page: state.params.get("page") || 1, q: state.params.get("q") || "" }),
  render(d) {
    const rows = d.groups.rows.map((g) => [link("#/group/" + encodeURIComponent(g.group), g.group), g.state, fmt.n(g.members), fmt.n(g.generation), fmt.n(g.partitions),
      fmt.n(g.lag_committed), fmt.n(g.lag_uncommitted), g.pending_transactional_offsets ? badge(fmt.n(g.pending_transactional_offsets), "warn") : "0"]);
    return [h("div", { class: "toolbar" }, pager(d.groups, (p) => setParam("page", p))),
      table(["group", "state", "members#", "generation#", "partitions#", "lag to LSO#", "lag to high watermark#", "pending transactional offsets#"], rows)];
  },
};

views.group = {
  title: () => "Group " + state.arg,
  url: () => "/v1/console/group?" + new URLSearchParams({ group: state.arg, page: state.params.get("page") || 1 }),
  render(d) {
    const members = d.members.map((m) => [m.member_id, m.group_instance_id || "—", m.client_id, m.client_host, m.assignment.map((a) => `${a.topic} [${a.partitions.join(",")}]`).join("; ") || "—"]);
    const offsets = d.offsets.rows.map((o) => [`${o.topic}-${o.partition}`, fmt.n(o.committed), fmt.n(o.last_stable_offset), fmt.n(o.high_watermark), fmt.n(o.lag_committed), fmt.n(o.lag_uncommitted)]);
    const pending = d.pending.map((p) => [fmt.n(p.producer_id), txnLink(p.transactional_id), `${p.topic}-${p.partition}`, fmt.n(p.offset)]);
    return [h("div", { class: "cards" }, card("state", d.state), card("generation", fmt.n(d.generation)), card("protocol", d.protocol || "—"), card("lag to LSO", fmt.n(d.lag_committed)), card("lag to high watermark", fmt.n(d.lag_uncommitted))),
      h("h2", {}, "Members"), table(["member", "instance", "client id", "host", "assignment"], members),
      h("h2", {}, "Committed offsets"), h("div", { class: "toolbar" }, pager(d.offsets, (p) => setParam("page", p))),
      table(["partition", "committed#", "LSO#", "high watermark#", "lag to LSO#", "lag to high watermark#"], offsets),
      h("h2", {}, "Offsets pending in open transactions"), table(["producer id#", "transactional id", "partition", "offset#"], pending)];
  },
};

views.verify = {
  title: "Verification",
  controls: () => [h("input", { id: "verify-topic", placeholder: "topic (all when empty)", value: state.params.get("topic") || "", onchange: (e) => setParam("topic", e.target.value) })],
  url: () => "/v1/console/verify?" + new URLSearchParams({ topic: state.params.get("topic") || "" }),
  render(d) {
    if (!d.enabled) return [h("p", { id: "verify-off" }, "Live verification is off (verify.enable=false).")];
    const totals = Object.entries(d.anomalies_total).filter(([, n]) => n > 0);
    const found = totals.reduce((a, [, n]) => a + n, 0);
    const behind = d.partitions.filter((p) => p.verified_through < p.last_stable_offset);
    const cards = h("div", { class: "cards", id: "verify-summary" },
      card("anomalies", found ? badge(fmt.n(found), "bad") : badge("none", "ok"), { id: "verify-found" }),
      card("partitions verified", fmt.n(d.partitions.length) + (d.cluster_wide ? " (every broker's)" : "")),
      card("behind their LSO", fmt.n(behind.length)),
      card("read back by this broker", fmt.bytes(d.scrubbed_bytes)));
    const kinds = totals.map(([k, n]) => badge(`${k} ${fmt.n(n)}`, "bad"));
    const anomalies = d.anomalies.slice().reverse().map((a) => [fmt.time(a.found_ms), badge(a.kind, "bad"), `${a.topic}-${a.partition}`,
      a.first_offset === a.last_offset ? fmt.n(a.first_offset) : `${fmt.n(a.first_offset)}..${fmt.n(a.last_offset)}`,
      a.producer_id >= 0 ? `${a.producer_id}/${a.epoch}` : "—", a.detail]);
    const parts = d.partitions.map((p) => [`${p.topic}-${p.partition}`, fmt.n(p.verified_through), fmt.n(p.last_stable_offset),
      p.verified_through < p.last_stable_offset ? badge(fmt.n(p.last_stable_offset - p.verified_through), "warn") : "0",
      fmt.n(p.log_start_offset), fmt.n(p.passes), p.compacted ? "compacted" : fmt.n(p.remembered_batches)]);
    const uniques = d.unique.map((u) => [u.topic, fmt.n(u.keys), u.evicted ? badge(fmt.n(u.evicted), "warn") : "0", fmt.age(Date.now() - u.covered_since_ms)]);
    return [cards, kinds.length ? h("p", {}, kinds) : null,
      h("h2", {}, "Anomalies (newest first)"), h("div", { id: "verify-anomalies" }, table(["found", "kind", "partition", "offsets", "producer/epoch", "what"], anomalies, (i) => ({ "data-kind": d.anomalies[d.anomalies.length - 1 - i].kind }))),
      h("h2", {}, "Partitions"), h("div", { id: "verify-partitions" }, table(["partition", "verified through#", "LSO#", "to verify#", "log start#", "passes#", "batches remembered#"], parts, (i) => ({ "data-partition": `${d.partitions[i].topic}-${d.partitions[i].partition}` }))),
      h("h2", {}, "Business keys (verify.unique.key, this broker's)"), table(["topic", "keys#", "forgotten when full#", "checked back"], uniques)];
  },
};

// ---- navigation and polling ---------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const [view, ...rest] = (path || "overview").split("/");
  state.view = views[view] ? view : "overview";
  state.arg = rest.length ? decodeURIComponent(rest.join("/")) : "";
  state.params = new URLSearchParams(query || "");
}

function navigate() {
  parseHash();
  state.form = {};
  const v = views[state.view];
  for (const a of document.querySelectorAll("header nav a")) {
    const target = a.dataset.view;
    a.classList.toggle("active", target === state.view || (target === "transactions" && state.view === "txn") || (target === "groups" && state.view === "group") || (target === "overview" && state.view === "topic"));
  }
  const title = typeof v.title === "function" ? v.title() : v.title;
  document.title = title + " · oncelog";
  const main = document.getElementById("view");
  main.dataset.view = state.view;
  main.replaceChildren(h("h1", {}, title), h("div", { class: "toolbar", id: "controls" }, v.controls ? v.controls() : []), h("div", { id: "body" }, h("p", { class: "muted" }, "Loading…")));
  refresh();
}

async function refresh() {
  const v = views[state.view];
  const seq = ++state.seq;
  clearTimeout(state.timer);
  try {
    const [d] = await Promise.all([getJSON(v.url()), state.actionsReady]);
    if (seq !== state.seq) return;
    const typing = document.activeElement && document.activeElement.tagName === "INPUT" && document.getElementById("body").contains(document.activeElement);
    if (!document.getElementById("confirm").open && !typing) {
      document.getElementById("body").replaceChildren(...[v.render(d)].flat(Infinity).filter(Boolean));
    }
    const main = document.getElementById("view");
    main.dataset.state = "ready";
    main.dataset.updated = String(Date.now());
    setStatus("live · updated " + fmt.time(Date.now()) + (state.actions.enabled ? " · actions enabled" : " · read-only"));
    if (!state.loadedOnce) { state.loadedOnce = true; performance.mark("console-ready"); }
  } catch (e) {
    if (seq !== state.seq) return;
    document.getElementById("view").dataset.state = "error";
    setStatus("cannot reach the broker: " + e.message, true);
  }
  state.timer = setTimeout(refresh, POLL_MS);
}

window.addEventListener("hashchange", navigate);
window.addEventListener("DOMContentLoaded", () => {
  // fetched beside the first view's data, awaited before its first render
  state.actionsReady = getJSON("/v1/console/actions").then((a) => { state.actions = a; }, () => { /* read-only */ });
  navigate();
});
