/* genprobe case report: the chapter's three interactive experiments — sampling lab, order trap,
 * KV-cache workload grid (no dependencies, offline).
 *
 * The sampler mirrors genprobe.engine.samplers exactly for what the lab exposes:
 *   trunc_then_temp : top-k -> top-p on the tau = 1 distribution, then tau on the survivors
 *   temp_then_trunc : tau first, then top-k -> top-p
 *   top-k keeps ties at the k-th value; top-p keeps the token that crosses p (mass strictly
 *   before a token < p), the top token always survives; removed tokens are -Infinity.
 */
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("case-data").textContent);
  const $ = (id) => document.getElementById(id);
  const fmt = (x, d) => (Number.isFinite(x) ? x.toFixed(d) : "–");

  // ---------------------------------------------------------------- sampler (mirror of Python)
  function topK(z, k) {
    const V = z.length;
    if (!k || k >= V) return z;
    const sorted = Array.from(z).sort((a, b) => b - a);
    const kth = sorted[k - 1];
    return z.map((v) => (v < kth ? -Infinity : v));
  }
  function topP(z, p) {
    if (p === null || p >= 1) return z;
    const idx = Array.from(z.keys()).sort((a, b) => z[b] - z[a] || a - b);
    const m = z[idx[0]];
    let sum = 0;
    for (const i of idx) sum += Math.exp(z[i] - m);
    const out = Float64Array.from(z);
    let before = 0;
    idx.forEach((i, rank) => {
      const pr = Math.exp(z[i] - m) / sum;
      if (rank > 0 && before >= p) out[i] = -Infinity;
      before += pr;
    });
    return out;
  }
  function processLogits(logits, tau, k, p, order) {
    let z = Float64Array.from(logits);
    const stages = order === "trunc_then_temp" ? ["top_k", "top_p", "temp"] : ["temp", "top_k", "top_p"];
    for (const s of stages) {
      if (s === "temp") { if (tau !== 1) z = z.map((v) => v / tau); }
      else if (s === "top_k") z = topK(z, k);
      else z = topP(z, p);
    }
    return z;
  }
  function softmax(z) {
    let m = -Infinity;
    for (const v of z) if (v > m) m = v;
    const e = z.map((v) => (v === -Infinity ? 0 : Math.exp(v - m)));
    let s = 0;
    for (const v of e) s += v;
    return e.map((v) => v / s);
  }
  function stats(probs) {
    let h = 0, kept = 0, pmax = 0;
    for (const q of probs) {
      if (q > 0) { kept++; h -= q * Math.log(q); }
      if (q > pmax) pmax = q;
    }
    return { kept, entropy: h, perplexity: Math.exp(h), maxProb: pmax };
  }
  function keptSetSize(logits, tau, k, p, order) {
    let n = 0;
    for (const v of processLogits(logits, tau, k, p, order)) if (v !== -Infinity) n++;
    return n;
  }
  // small seeded PRNG so a page reload replays the same draws
  function mulberry32(a) {
    return function () {
      a |= 0; a = (a + 0x6d2b79f5) | 0;
      let t = Math.imul(a ^ (a >>> 15), 1 | a);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  window.genprobe = { processLogits, keptSetSize, softmax, stats };

  function setOut(id, value, text) {
    const el = $(id);
    if (!el) return;
    el.dataset.value = String(value);
    el.textContent = text;
  }
  function hiDPI(canvas) {
    const r = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
    canvas.width = Math.round(w * r); canvas.height = Math.round(h * r);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return { ctx, w, h };
  }

  // ---------------------------------------------------------------- 3-1 sampling lab
  function initLab() {
    const dist = DATA.sampling && DATA.sampling.distribution;
    if (!dist || !$("lab")) return;
    const logits = Float64Array.from(dist.logits);
    const tokens = dist.tokens;
    const V = logits.length;
    const byProb = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);
    const rankOf = new Int32Array(V);
    byProb.forEach((t, r) => (rankOf[t] = r));
    const base = softmax(logits);
    const rng = mulberry32(20240607);
    $("lab-topk").max = String(V);
    let last = null, draws = 0;

    function read() {
      const tau = parseFloat($("lab-tau").value);
      const k = parseInt($("lab-topk").value, 10);
      const p = parseFloat($("lab-topp").value);
      const order = $("lab-order").value;
      return { tau, k, p, order };
    }
    function update() {
      const s = read();
      setOut("lab-tau-val", s.tau, s.tau.toFixed(2));
      setOut("lab-topk-val", s.k, s.k === 0 ? "off" : String(s.k));
      setOut("lab-topp-val", s.p, s.p >= 1 ? "1.00 (off)" : s.p.toFixed(2));
      const z = processLogits(logits, s.tau, s.k, s.p, s.order);
      const probs = softmax(z);
      const st = stats(probs);
      setOut("lab-kept", st.kept, `${st.kept} / ${V}`);
      setOut("lab-entropy", st.entropy, fmt(st.entropy, 3) + " nats");
      setOut("lab-ppl", st.perplexity, fmt(st.perplexity, 1));
      setOut("lab-maxp", st.maxProb, fmt(st.maxProb, 4));
      draw(z, probs);
      const top = byProb.filter((t) => z[t] !== -Infinity).slice(0, 12);
      $("lab-top").innerHTML = top.map((t) => `<span class="chip"><b>${esc(tokens[t])}</b> ${(probs[t] * 100).toFixed(1)}%</span>`).join(" ");
      return { z, probs };
    }
    function draw(z, probs) {
      const { ctx, w, h } = hiDPI($("lab-canvas"));
      const log = $("lab-log").checked;
      ctx.clearRect(0, 0, w, h);
      const bw = w / V;
      const floor = 1e-7;
      const yOf = (q) => (log ? Math.max(0, (Math.log10(Math.max(q, floor)) + 7) / 7) : q);
      for (let r = 0; r < V; r++) {
        const t = byProb[r];
        const kept = z[t] !== -Infinity;
        const q = kept ? probs[t] : base[t];
        const bh = yOf(q) * (h - 14);
        ctx.fillStyle = kept ? "#00838f" : "#cfd8dc";
        ctx.fillRect(r * bw, h - bh, Math.max(bw, 0.6), bh);
      }
      if (last !== null) {
        const x = rankOf[last] * bw;
        ctx.fillStyle = "#ef6c00";
        ctx.fillRect(x - 1, 0, 3, h);
      }
      ctx.fillStyle = "#555"; ctx.font = "11px system-ui, sans-serif";
      ctx.fillText(log ? "log10 probability (floor 1e-7), tokens sorted by probability" : "probability, tokens sorted by probability", 4, 11);
    }
    function drawSample() {
      const { probs } = update();
      let u = rng(), acc = 0, pick = byProb[0];
      for (const t of byProb) {
        if (probs[t] <= 0) continue;
        acc += probs[t];
        if (u < acc) { pick = t; break; }
        pick = t;
      }
      last = pick; draws++;
      const el = $("lab-sample");
      el.dataset.value = tokens[pick];
      el.dataset.id = String(pick);
      el.dataset.rank = String(rankOf[pick] + 1);
      el.dataset.draws = String(draws);
      el.innerHTML = `<span class="drawn">${esc(tokens[pick])}</span> rank ${rankOf[pick] + 1}, p = ${probs[pick].toFixed(4)}`;
      $("lab-history").textContent += tokens[pick].length > 1 ? `[${tokens[pick]}]` : tokens[pick];
      update();
    }
    ["lab-tau", "lab-topk", "lab-topp", "lab-order", "lab-log"].forEach((id) => $(id).addEventListener("input", update));
    $("lab-order").addEventListener("change", update);
    $("lab-draw").addEventListener("click", drawSample);
    $("lab-reset").addEventListener("click", () => {
      $("lab-tau").value = "1"; $("lab-topk").value = "0"; $("lab-topp").value = "1";
      $("lab-order").value = "trunc_then_temp"; last = null; $("lab-history").textContent = ""; update();
    });
    window.addEventListener("resize", update);
    update();
    $("lab").dataset.ready = "1";
  }

  // ---------------------------------------------------------------- 3-2 order trap
  function initTrap() {
    const dist = DATA.sampling && DATA.sampling.distribution;
    if (!dist || !$("trap")) return;
    const logits = Float64Array.from(dist.logits);
    const taus = [];
    for (let t = 0.25; t <= 3.0001; t += 0.05) taus.push(Math.round(t * 100) / 100);
    function update() {
      const tau = parseFloat($("trap-tau").value), p = parseFloat($("trap-p").value);
      setOut("trap-tau-val", tau, tau.toFixed(2));
      setOut("trap-p-val", p, p.toFixed(3));
      const a = keptSetSize(logits, tau, 0, p, "trunc_then_temp");
      const b = keptSetSize(logits, tau, 0, p, "temp_then_trunc");
      setOut("trap-a", a, String(a));
      setOut("trap-b", b, String(b));
      const ratio = Math.max(a, b) / Math.min(a, b);
      setOut("trap-ratio", ratio, ratio.toFixed(1) + "×");
      chart(p, tau);
    }
    function chart(p, tauNow) {
      const { ctx, w, h } = hiDPI($("trap-canvas"));
      ctx.clearRect(0, 0, w, h);
      const pad = { l: 44, r: 18, t: 20, b: 26 };
      const V = logits.length;
      const ya = taus.map((t) => keptSetSize(logits, t, 0, p, "trunc_then_temp"));
      const yb = taus.map((t) => keptSetSize(logits, t, 0, p, "temp_then_trunc"));
      const X = (t) => pad.l + ((t - taus[0]) / (taus[taus.length - 1] - taus[0])) * (w - pad.l - pad.r);
      const Y = (n) => h - pad.b - (Math.log10(n) / Math.log10(V)) * (h - pad.t - pad.b);
      ctx.strokeStyle = "#bbb"; ctx.lineWidth = 1; ctx.font = "10px system-ui, sans-serif"; ctx.fillStyle = "#666";
      [1, 10, 100, 1000].forEach((n) => { ctx.beginPath(); ctx.moveTo(pad.l, Y(n)); ctx.lineTo(w - pad.r, Y(n)); ctx.stroke(); ctx.fillText(String(n), 6, Y(n) + 3); });
      [0.5, 1, 1.5, 2, 2.5].forEach((t) => ctx.fillText(String(t), X(t) - 6, h - 8));
      const line = (ys, col) => { ctx.strokeStyle = col; ctx.lineWidth = 2; ctx.beginPath(); ys.forEach((n, i) => (i ? ctx.lineTo(X(taus[i]), Y(n)) : ctx.moveTo(X(taus[i]), Y(n)))); ctx.stroke(); };
      line(ya, "#00838f"); line(yb, "#ef6c00");
      ctx.strokeStyle = "#333"; ctx.setLineDash([3, 3]); ctx.beginPath(); ctx.moveTo(X(tauNow), pad.t); ctx.lineTo(X(tauNow), h - pad.b); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = "#666"; ctx.fillText("kept set (log scale)", 6, 11); ctx.fillText("τ = 3", X(3) - 14, h - 8);
    }
    ["trap-tau", "trap-p"].forEach((id) => $(id).addEventListener("input", update));
    window.addEventListener("resize", update);
    update();
    $("trap").dataset.ready = "1";
  }

  // ---------------------------------------------------------------- 3-3 KV-cache workload grid
  function initGrid() {
    if (!$("kvgrid")) return;
    const P = (DATA.cache_timing && DATA.cache_timing.prompt_len) || 7;
    let step = null, timer = null;
    const counts = (N, upto) => {
      let naive = 0, cached = 0;
      for (let i = 0; i < upto; i++) { naive += P + i; cached += i === 0 ? P : 1; }
      return { naive, cached };
    };
    function paint(canvas, N, upto, cachedMode) {
      const { ctx, w, h } = hiDPI(canvas);
      ctx.clearRect(0, 0, w, h);
      const cols = P + N - 1, rows = N;
      const cw = w / cols, ch = h / rows;
      ctx.fillStyle = "#f3f5f7"; ctx.fillRect(0, 0, w, h);
      for (let i = 0; i < upto; i++) {
        const y = i * ch;
        if (cachedMode) {
          if (i === 0) { ctx.fillStyle = "#00838f"; ctx.fillRect(0, y, P * cw, Math.max(ch, 0.8)); }
          else {
            ctx.fillStyle = "#e0f2f1"; ctx.fillRect(0, y, (P + i - 1) * cw, Math.max(ch, 0.8));
            ctx.fillStyle = "#00838f"; ctx.fillRect((P + i - 1) * cw, y, Math.max(cw, 0.8), Math.max(ch, 0.8));
          }
        } else {
          ctx.fillStyle = "#ef6c00"; ctx.fillRect(0, y, (P + i) * cw, Math.max(ch, 0.8));
          if (i > 0) { ctx.fillStyle = "#2e7d32"; ctx.fillRect((P + i - 1) * cw, y, Math.max(cw, 0.8), Math.max(ch, 0.8)); }
        }
      }
    }
    function update() {
      const N = parseInt($("kv-len").value, 10);
      const upto = step === null ? N : Math.min(step, N);
      setOut("kv-len-val", N, String(N));
      setOut("kv-step", upto, `${upto} / ${N}`);
      const c = counts(N, upto);
      setOut("kv-naive-count", c.naive, c.naive.toLocaleString("en"));
      setOut("kv-cached-count", c.cached, c.cached.toLocaleString("en"));
      const ratio = c.cached ? c.naive / c.cached : 0;
      setOut("kv-ratio", ratio, ratio ? ratio.toFixed(1) + "×" : "–");
      paint($("kv-naive"), N, upto, false);
      paint($("kv-cached"), N, upto, true);
    }
    function play() {
      if (timer) { clearInterval(timer); timer = null; }
      const N = parseInt($("kv-len").value, 10);
      step = 0; update();
      const dt = Math.max(12, Math.round(2500 / N));
      timer = setInterval(() => {
        step++; update();
        if (step >= N) { clearInterval(timer); timer = null; step = null; update(); }
      }, dt);
    }
    $("kv-len").addEventListener("input", () => { if (timer) { clearInterval(timer); timer = null; } step = null; update(); });
    $("kv-play").addEventListener("click", play);
    window.addEventListener("resize", update);
    update();
    $("kvgrid").dataset.ready = "1";
  }

  function esc(s) {
    return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  }

  initLab();
  initTrap();
  initGrid();
  document.body.dataset.ready = "1";
})();
