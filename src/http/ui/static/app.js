// kvmesh status page: polls GET /ui/state about once a second and renders it. Plain browser
// JavaScript, no framework and nothing from the network; every value goes in through
// textContent (never innerHTML), so a worker id, endpoint or reason cannot inject markup.
"use strict";

(() => {
  const POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 5000;
  const TOKEN_KEY = "kvmesh.apiToken";

  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = String(text);
    return e;
  };
  const fmt = (n, digits = 0) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits }));
  const pct = (r) => (r === null || r === undefined ? "-" : `${(100 * r).toFixed(1)}%`);
  const ms = (v) => (v === null || v === undefined ? "-" : `${Number(v).toFixed(1)} ms`);

  let query = "";
  let top = 48;
  let timer;
  let inFlight = false;

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  function showAuth(message) {
    $("data").hidden = true;
    $("auth").hidden = false;
    $("auth-error").textContent = message;
    $("conn").textContent = "waiting for the API token";
    $("auth-token").focus();
  }

  async function poll() {
    if (inFlight) return;
    inFlight = true;
    const headers = { accept: "application/json" };
    const t = token();
    if (t) headers.authorization = `Bearer ${t}`;
    const ctl = new AbortController();
    const abort = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const qs = new URLSearchParams({ top: String(top) });
      if (query) qs.set("q", query);
      const res = await fetch(`/ui/state?${qs.toString()}`, { headers, cache: "no-store", signal: ctl.signal });
      if (res.status === 401) {
        if (t) sessionStorage.removeItem(TOKEN_KEY);
        showAuth(t ? "That token was refused. Enter the daemon's API token." : "");
        return;
      }
      const body = await res.json();
      if (!res.ok) {
        setConn(`error ${res.status}: ${body.error ?? "?"}`, true);
        return;
      }
      render(body);
      setConn(`live, updated ${new Date().toLocaleTimeString()}`, false);
    } catch (err) {
      setConn(`no answer (${err && err.name === "AbortError" ? "timeout" : "unreachable"}), retrying`, true);
    } finally {
      clearTimeout(abort);
      inFlight = false;
      schedule();
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (!$("auth").hidden) return;
    timer = setTimeout(poll, POLL_MS);
  }

  function setConn(text, stale) {
    const c = $("conn");
    c.textContent = text;
    c.classList.toggle("stale", stale);
  }

  function render(s) {
    $("auth").hidden = true;
    $("data").hidden = false;
    renderReplica(s.replica);
    renderPeers(s.peers);
    renderRouting(s.routing);
    renderWorkers(s.workers, s.ranks);
  }

  function renderReplica(r) {
    $("replica-id").textContent = r.id;
    $("replica-endpoint").textContent = `${r.mesh_endpoint ?? "(no mesh)"} · http ${r.http}`;
    const dl = $("replica");
    const rows = [
      ["id", r.id],
      ["mesh endpoint", r.mesh_endpoint ?? "no mesh"],
      ["HTTP", r.http],
      ["ready", r.draining ? "draining" : r.ready ? "yes" : "no (no schedulable worker)"],
      ["load replication", r.load_replication],
      ["reservations live", fmt(r.reservations_active)],
      ["events shed", fmt(r.events_shed)],
      ["snapshots served / installed", `${fmt(r.snapshots_served)} / ${fmt(r.snapshots_installed)}`],
      ["divergence resyncs", fmt(r.divergence_resyncs)],
      ["uptime", `${fmt(r.uptime_s)} s`],
    ];
    dl.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", "", k), el("dd", "", v)]));
  }

  function renderPeers(peers) {
    $("peer-count").textContent = `(${peers.length})`;
    $("no-peers").hidden = peers.length > 0;
    const body = $("peers").tBodies[0];
    body.replaceChildren(
      ...peers.map((p) => {
        const tr = el("tr");
        tr.dataset.endpoint = p.endpoint;
        const state = el("td");
        state.append(el("span", `badge ${p.state}`, p.state));
        const sync = el("td");
        if (p.sync) sync.append(el("span", `badge ${p.sync}`, p.sync));
        tr.append(el("td", "", p.endpoint), el("td", "", p.origin ?? "-"), state, sync, el("td", "", p.last_seq ?? "-"), el("td", "", ms(p.lag_p50_ms)), el("td", "", ms(p.lag_p99_ms)), el("td", "", fmt(p.gaps)), el("td", "", fmt(p.snapshots)));
        return tr;
      }),
    );
  }

  function spark(svg, values) {
    const ns = "http://www.w3.org/2000/svg";
    const line = document.createElementNS(ns, "polyline");
    const nums = values.map((v) => (v === null ? 0 : v));
    const max = Math.max(1e-9, ...nums);
    const n = Math.max(2, nums.length);
    line.setAttribute("points", nums.map((v, i) => `${((i / (n - 1)) * 240).toFixed(1)},${(38 - (v / max) * 36).toFixed(1)}`).join(" "));
    svg.replaceChildren(line);
  }

  function renderRouting(r) {
    $("routing-window").textContent = `(rates over the last 10 s; history ${fmt(r.window_s)} s)`;
    $("sel-rate").textContent = fmt(r.recent.selections_per_s, 1);
    $("overlap").textContent = fmt(r.recent.mean_overlap_blocks, 1);
    $("hit-ratio").textContent = pct(r.recent.hit_ratio);
    $("err-rate").textContent = fmt(r.recent.errors_per_s, 1);
    $("sel-total").textContent = fmt(r.totals.selections);
    $("bind-live").textContent = fmt(r.bindings.live);
    $("bind-moved").textContent = fmt(r.bindings.moved);
    $("bind-rejected").textContent = fmt(r.bindings.rejected);
    $("bind-unpinned").textContent = fmt(r.bindings.unpinned);
    $("bind-conflicts").textContent = fmt(r.bindings.conflicts);
    spark($("spark-sel"), r.series.map((p) => p.selections_per_s));
    spark($("spark-hit"), r.series.map((p) => p.hit_ratio));
  }

  function bar(kind, label, value, max, text) {
    const row = el("div", `bar ${kind}`);
    const track = el("div", "track");
    const fill = el("div", "fill");
    fill.style.width = `${max > 0 ? Math.min(100, (100 * value) / max) : 0}%`;
    track.append(fill);
    row.append(el("span", "", label), track, el("span", "val", text));
    return row;
  }

  function renderWorkers(w, ranks) {
    $("worker-count").textContent = `(${fmt(w.total)} workers, ${fmt(ranks.total)} ranks)`;
    $("lifecycle").replaceChildren(...Object.entries(w.by_lifecycle).filter(([, n]) => n > 0).map(([k, n]) => el("span", `badge ${k}`, `${k}: ${n}`)));
    $("not-schedulable").replaceChildren(...w.not_schedulable.map((x) => el("li", "", `worker ${x.worker_id}: ${x.lifecycle}${x.reasons.length ? ` (${x.reasons.join("; ")})` : ""}`)));
    const t = ranks.totals;
    const cap = t.capacity_blocks > 0 ? ` of ${fmt(t.capacity_blocks)}` : "";
    $("rank-summary").textContent =
      `${ranks.query ? `${fmt(ranks.matched)} of ${fmt(ranks.total)} ranks match "${ranks.query}"` : `${fmt(ranks.total)} ranks`}; ` +
      `showing the ${fmt(ranks.rows.length)} busiest. In flight: ${fmt(t.active_requests)} requests on ${fmt(t.busy_ranks)} ranks, ` +
      `${fmt(t.active_blocks)}${cap} active blocks, ${fmt(t.prefill_tokens)} prefill tokens queued.`;
    $("ranks").replaceChildren(
      ...ranks.rows.map((r) => {
        const d = el("div", "rank");
        d.dataset.worker = r.worker_id;
        d.dataset.rank = String(r.dp_rank);
        const name = el("div", "name");
        name.append(el("b", "", `worker ${r.worker_id} / rank ${r.dp_rank}`), el("span", `badge ${r.lifecycle ?? ""}`, r.lifecycle ?? "?"));
        const blocksMax = r.capacity_blocks ?? t.max_active_blocks;
        d.append(
          name,
          bar("blocks", "blocks", r.active_blocks, blocksMax, r.capacity_blocks === null ? `${fmt(r.active_blocks)}` : `${fmt(r.active_blocks)} / ${fmt(r.capacity_blocks)}`),
          bar("requests", "requests", r.active_requests, t.max_active_requests, fmt(r.active_requests)),
          bar("prefill", "prefill tok", r.prefill_tokens, t.max_prefill_tokens, fmt(r.prefill_tokens)),
        );
        return d;
      }),
    );
  }

  function init() {
    $("auth-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const v = $("auth-token").value.trim();
      if (!v) return;
      sessionStorage.setItem(TOKEN_KEY, v);
      $("auth-token").value = "";
      $("auth").hidden = true;
      $("conn").textContent = "loading...";
      void poll();
    });
    let debounce;
    $("search").addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => {
        query = $("search").value.replace(/[^0-9]/g, "");
        void poll();
      }, 200);
    });
    $("top").addEventListener("change", () => {
      top = Number($("top").value);
      void poll();
    });
    void poll();
  }

  init();
})();
