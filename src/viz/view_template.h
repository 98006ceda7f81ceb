// The interactive attention page: its CSS, static body and JS as raw strings, spliced by html.cpp
// around the data (inline JSON in <script id="attn-data">). Not a framework: plain DOM, SVG lines,
// canvas thumbnails; no URL anywhere (the SVG namespace is read from the page, not written here).
//
// Stable hooks for tests and users:
//   #layer-select (option value = layer)   .tab#tab-head/#tab-model/#tab-matrix, sections #view-*
//   .head-swatch[data-head][aria-pressed] > .ramp (the legend: the head's colour, weight 0 to 1)
//   #q-col .tok[data-side=q][data-i], #k-col .tok[data-side=k]
//   #lines > line[data-head][data-q][data-k][data-w], in increasing weight (the strongest drawn last, on
//     top); a line is hidden when it has computed display:none (focus filter, head toggle)
//   #model-grid .thumb[data-layer][data-head]   #notice (top-k)
//   #matrix[data-layer][data-head][data-x0][data-y0][data-cell][data-pool] (geometry in CSS pixels)
//   #scale-select (value row|absolute: the colour scale of every view), body[data-scale], .scale-note (the
//     scale in words, in each view)
//   #tab-rollout, #view-rollout, #rollout[data-layer][data-x0][data-y0][data-cell][data-pool] (hidden for
//     cross-attention: rollout needs self-attention)
//   body[data-ready="1"] once everything is drawn.
#pragma once

namespace attn::viz {

inline constexpr const char* kViewCss = R"attn(
:root { --ink: #1f2328; --muted: #656d76; --line: #d0d7de; --accent: #2171b5; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color: var(--ink); background: #fff; }
header { padding: 16px 24px 0; border-bottom: 1px solid var(--line); background: #f6f8fa; }
h1 { font-size: 20px; margin: 0 0 2px; }
#meta { margin: 0 0 8px; color: var(--muted); }
#notice { margin: 0 0 10px; padding: 6px 10px; background: #fff8c5; border: 1px solid #e3c76b;
          border-radius: 6px; }
nav { display: flex; gap: 4px; align-items: flex-end; }
.tab { border: 1px solid transparent; border-bottom: none; background: none; padding: 8px 14px;
       border-radius: 6px 6px 0 0; cursor: pointer; font: inherit; color: var(--muted); margin-bottom: -1px; }
.tab[aria-selected="true"] { background: #fff; border-color: var(--line); color: var(--ink); font-weight: 600; }
#layer-control { margin-left: auto; padding-bottom: 6px; color: var(--muted); }
select, .toolbar button { font: inherit; padding: 2px 6px; }
main { padding: 16px 24px 32px; }
[hidden] { display: none !important; }
.toolbar { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin-bottom: 6px; }
.hint { color: var(--muted); margin: 4px 0 12px; font-size: 13px; }
#head-legend { display: flex; gap: 4px; flex-wrap: wrap; }
.head-swatch { --c: #888; display: inline-flex; align-items: center; gap: 6px; height: 26px; padding: 0 8px;
               border-radius: 4px; border: 2px solid var(--c); background: #fff; color: var(--ink);
               font: 600 12px/1 system-ui, sans-serif; cursor: pointer; }
.head-swatch .ramp { width: 44px; height: 10px; border-radius: 2px; outline: 1px solid var(--line); }
.head-swatch[aria-pressed="false"] { border-color: var(--line); color: var(--muted); opacity: .5;
                                     text-decoration: line-through; }
#head-view { display: grid; grid-template-columns: max-content minmax(160px, 1fr) max-content; align-items: start; }
.col-head { font-size: 11px; color: var(--muted); text-transform: uppercase; letter-spacing: .06em;
            padding: 0 8px 4px; }
.col-head.q { text-align: right; }
.tok { height: 22px; line-height: 22px; padding: 0 8px; white-space: pre; cursor: pointer; border-radius: 3px;
       font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; }
#q-col .tok { text-align: right; }
.tok:hover, .tok.focus { box-shadow: inset 0 0 0 2px var(--accent); }
.tok.pinned { font-weight: 700; }
#lines { display: block; width: 100%; }
#lines line { stroke-width: 2; }
#lines line.off, #lines.focused line:not(.on) { display: none; }
#model-grid { border-collapse: collapse; }
#model-grid th { font-weight: 600; font-size: 12px; color: var(--muted); padding: 4px 8px; white-space: nowrap; }
#model-grid td { padding: 4px; }
#model-grid tr.current th { color: var(--accent); }
.thumb { image-rendering: pixelated; border: 1px solid var(--line); cursor: pointer; display: block; margin: auto; }
.thumb:hover { outline: 2px solid var(--accent); }
#matrix-caption, #rollout-caption { color: var(--muted); }
#scale-control { padding-bottom: 6px; color: var(--muted); }
.matrix-wrap { position: relative; display: inline-block; }
.matrix-tip { position: absolute; pointer-events: none; background: var(--ink); color: #fff; padding: 3px 7px;
              border-radius: 4px; font-size: 12px; white-space: pre; }
)attn";

inline constexpr const char* kViewBody = R"attn(
<header>
  <h1 id="title"></h1>
  <p id="meta"></p>
  <p id="notice" hidden></p>
  <nav>
    <button class="tab" id="tab-head" data-view="head">Head view</button>
    <button class="tab" id="tab-model" data-view="model">Model view</button>
    <button class="tab" id="tab-matrix" data-view="matrix">Matrix view</button>
    <button class="tab" id="tab-rollout" data-view="rollout">Rollout</button>
    <label id="layer-control">Layer <select id="layer-select"></select></label>
    <label id="scale-control">Colour <select id="scale-select">
      <option value="row">each row: 0 to its largest weight</option>
      <option value="absolute">absolute: 0 to 1 (bertviz)</option></select></label>
  </nav>
</header>
<main>
<section id="view-head" class="view">
  <div class="toolbar"><span>Heads</span><span id="head-legend"></span>
    <button id="heads-all">all</button><button id="heads-none">none</button></div>
  <p class="hint">A line's colour is its head; it runs from white (weight 0) to the head's full colour
    (<span class="scale-note"></span>), as in each head's key above. Where lines cross, the larger weight is
    drawn on top, so every head keeps its own colour. Hover a token to see only its lines; click it to pin
    (click again or press Esc to release). Click a head to hide or show its lines.</p>
  <div id="head-view">
    <div class="col-head q">queries</div><div></div><div class="col-head">keys</div>
    <div id="q-col"></div>
    <svg id="lines"></svg>
    <div id="k-col"></div>
  </div>
</section>
<section id="view-model" class="view" hidden>
  <p class="hint">Every head of every layer (rows: queries, columns: keys; colour: <span class="scale-note"></span>).
    Click one to open it in the matrix view.</p>
  <table id="model-grid"></table>
</section>
<section id="view-matrix" class="view" hidden>
  <div class="toolbar"><label>Head <select id="head-select"></select></label><span id="matrix-caption"></span></div>
  <div class="matrix-wrap"><canvas id="matrix"></canvas><div class="matrix-tip" id="matrix-tip" hidden></div></div>
</section>
<section id="view-rollout" class="view" hidden>
  <p class="hint">Attention rollout (Abnar &amp; Zuidema 2020): how much of each input token reaches each position
    through every layer up to the one chosen, the residual connection counted: per layer the heads' mean with
    the identity, 0.5·A + 0.5·I, rows renormalised, multiplied layer by layer. Row i is position i's mix of
    the input tokens (each row sums to 1); colour: <span class="scale-note"></span>.</p>
  <div class="toolbar"><span id="rollout-caption"></span></div>
  <div class="matrix-wrap"><canvas id="rollout"></canvas><div class="matrix-tip" id="rollout-tip" hidden></div></div>
</section>
</main>
)attn";

inline constexpr const char* kViewJs = R"attn(
"use strict";
(() => {
  const D = JSON.parse(document.getElementById("attn-data").textContent);
  const $ = (id) => document.getElementById(id);
  const SVG_NS = $("lines").namespaceURI;  // read from the page: the file names no URL at all
  const L = D.L, S = D.S, ROW = 22, FONT = getComputedStyle(document.body).fontFamily;
  const TABLEAU = [[78, 121, 167], [242, 142, 43], [225, 87, 89], [118, 183, 178], [89, 161, 79], [237, 201, 72],
                   [176, 122, 161], [255, 157, 167], [156, 117, 95], [186, 176, 172]];
  // on: per head of this layer; byQ/byK/byH: line records {el, h, q, k, w} by token and by head;
  // marked: lines now .on
  // scale: "row" or "absolute", the colour scale of every view; geom: per canvas id, what paint() drew
  const st = { layer: 0, on: [], focus: null, pinned: false, head: 0, byQ: [], byK: [], byH: [], marked: [],
               geom: {}, modelBuilt: false, scale: D.scale };
  // A weight's colour position on the scale shown: relative to its row's largest (top), or the weight itself.
  const shade = (w, top) => (st.scale === "absolute" ? w : w / top);
  const SCALE_WORDS = { row: "each query row relative to its own largest weight (100%), so a diffuse head looks as " +
                             "strong as a sharp one",
                        absolute: "absolute, weight 0 to 1 for every row (bertviz's scale): a diffuse head looks " +
                                  "pale" };

  const nHeads = (l) => D.layers[l].length;
  // Head h of n as [r, g, b]: Tableau 10 up to 10 heads, hues a golden angle apart (HSL 62%, 46%) beyond.
  function headRgb(h, n) {
    if (n <= TABLEAU.length) return TABLEAU[h];
    const hue = (h * 137.508) % 360, s = 0.62, l = 0.46, a = s * Math.min(l, 1 - l);
    const f = (m) => { const k = (m + hue / 30) % 12; return l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)); };
    return [0, 8, 4].map((m) => Math.round(255 * f(m)));
  }
  // An opaque colour between white (weight 0) and the head's (weight >= 1): no alpha, so overlapping
  // lines never blend into a colour that is no head's.
  const tint = (rgb, w) => `rgb(${rgb.map((c) => Math.round(255 - Math.min(1, w) * (255 - c))).join(", ")})`;
  // Row i of head h in layer l: [key indices (null: all S keys in order), weights]
  const row = (l, h, i) => { const hd = D.layers[l][h]; return [hd.k ? hd.k[i] : null, hd.w[i]]; };
  const fmt = (w) => String(Number(w.toPrecision(3)));
  function el(tag, attrs = {}, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // The colour scale of the PNGs (D.colours, evenly spaced sRGB stops), as a 256-entry table.
  const LUT = Array.from({ length: 256 }, (_, n) => {
    const c = D.colours, x = (n / 255) * (c.length - 1), k = Math.min(Math.floor(x), c.length - 2), a = x - k;
    return [0, 1, 2].map((m) => Math.round((1 - a) * c[k][m] + a * c[k + 1][m]));
  });
  const colour = (t) => LUT[Math.round(Math.min(Math.max(t, 0), 1) * 255)];

  // ---- header --------------------------------------------------------------------------------
  const counts = D.layers.map((x) => x.length), hmin = Math.min(...counts), hmax = Math.max(...counts);
  $("title").textContent = D.title;
  const NL = D.layers.length;
  $("meta").textContent = `${L} query tokens · ${S} key tokens · ${NL} layer${NL > 1 ? "s" : ""}` +
    ` · ${hmin === hmax ? hmin : hmin + "–" + hmax} heads · ${D.self ? "self" : "cross"}-attention`;
  if (D.top_k) {
    $("notice").hidden = false;
    $("notice").textContent = `Long input: each query row keeps only its ${D.top_k} largest of ${S} weights ` +
      `(top_k = ${D.top_k}); they hold ${(100 * D.kept_mass).toFixed(1)}% of the attention on average. ` +
      "The other weights are not drawn.";
  }

  // ---- head view -----------------------------------------------------------------------------
  function buildTokens() {
    const sides = [["q", D.query_labels, D.query_tokens, "query"], ["k", D.key_labels, D.key_tokens, "key"]];
    for (const [side, labels, raw, name] of sides) {
      labels.forEach((label, i) => {
        const t = el("div", { class: "tok", "data-side": side, "data-i": i,
                              title: `${name} ${i}: ${JSON.stringify(raw[i])}` }, label);
        t.addEventListener("mouseenter", () => { if (!st.pinned) setFocus({ side, i }); });
        t.addEventListener("mouseleave", () => { if (!st.pinned) setFocus(null); });
        t.addEventListener("click", (ev) => {
          ev.stopPropagation();
          const same = st.pinned && st.focus.side === side && st.focus.i === i;
          st.pinned = !same;
          setFocus(same ? null : { side, i });
        });
        $(side + "-col").append(t);
      });
    }
    $("lines").setAttribute("height", Math.max(L, S) * ROW);
    $("head-view").addEventListener("click", () => { if (st.pinned) setFocus(null); });
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") setFocus(null); });
  }

  function setFocus(f) {
    st.focus = f;
    if (!f) st.pinned = false;
    applyFocus();
  }

  // Show the lines of enabled heads (a hidden head's lines are .off) that touch the focused token (CSS
  // hides every line not marked .on while the svg is .focused), and shade the other column's tokens by
  // the largest visible weight to or from the focused one. Touches only the focused token's lines, so
  // hovering stays fast with tens of thousands of lines.
  function applyFocus() {
    const f = st.focus, svg = $("lines"), shade = { q: new Float32Array(L), k: new Float32Array(S) };
    for (const x of st.marked) x.el.classList.remove("on");
    st.marked = f ? (f.side === "q" ? st.byQ : st.byK)[f.i] : [];
    for (const x of st.marked) {
      x.el.classList.add("on");
      if (!st.on[x.h]) continue;
      const [side, idx] = f.side === "q" ? ["k", x.k] : ["q", x.q];
      shade[side][idx] = Math.max(shade[side][idx], x.w);
    }
    svg.classList.toggle("focused", !!f);
    for (const side of ["q", "k"]) {
      for (const t of $(side + "-col").children) {
        const i = +t.dataset.i, me = !!f && f.side === side && f.i === i, a = f && f.side !== side ? shade[side][i] : 0;
        t.classList.toggle("focus", me);
        t.classList.toggle("pinned", me && st.pinned);
        t.style.background = a > 0 ? `rgba(66, 146, 198, ${Math.min(1, a).toFixed(3)})` : "";
      }
    }
  }

  function buildSwatches() {
    const n = nHeads(st.layer), box = $("head-legend");
    if (st.on.length !== n) st.on = new Array(n).fill(true);
    box.replaceChildren();
    for (let h = 0; h < n; ++h) {
      const b = el("button", { class: "head-swatch", "data-head": h, "aria-pressed": st.on[h],
                               title: `head ${h}: click to hide or show its lines` }, `head ${h}`);
      const rgb = headRgb(h, n), ramp = el("span", { class: "ramp" });
      ramp.style.background = `linear-gradient(to right, ${tint(rgb, 0)}, ${tint(rgb, 1)})`;
      b.style.setProperty("--c", tint(rgb, 1));
      b.append(ramp);
      b.addEventListener("click", () => {
        st.on[h] = !st.on[h];
        b.setAttribute("aria-pressed", st.on[h]);
        showHead(h);
        applyFocus();
      });
      box.append(b);
    }
  }
  const showHead = (h) => { for (const x of st.byH[h] || []) x.el.classList.toggle("off", !st.on[h]); };
  const setAll = (v) => {
    st.on.fill(v);
    buildSwatches();
    st.on.forEach((_, h) => showHead(h));
    applyFocus();
  };
  $("heads-all").addEventListener("click", () => setAll(true));
  $("heads-none").addEventListener("click", () => setAll(false));

  // Every line of the layer, weakest first: SVG paints in document order, so where lines cross the
  // stronger one is on top. Lines span the svg's width (x2 = 100%), which is the page's.
  function drawLines() {
    const svg = $("lines"), l = st.layer, n = nHeads(l), all = [];
    st.marked = [];
    st.byQ = Array.from({ length: L }, () => []);
    st.byK = Array.from({ length: S }, () => []);
    st.byH = Array.from({ length: n }, () => []);
    for (let h = 0; h < n; ++h) {
      for (let i = 0; i < L; ++i) {
        const [ks, ws] = row(l, h, i), top = ws.reduce((m, w) => (w > m ? w : m), 0);
        ws.forEach((w, t) => {  // zero (masked) and null (non-finite) draw nothing; tinted relative to the row
          if (w > 0) all.push({ h, q: i, k: ks ? ks[t] : t, w, t: shade(w, top) });
        });
      }
    }
    all.sort((a, b) => a.w - b.w);
    const lines = document.createDocumentFragment();
    for (const x of all) {
      const line = document.createElementNS(SVG_NS, "line");
      line.setAttribute("x1", 0);
      line.setAttribute("y1", (x.q + 0.5) * ROW);
      line.setAttribute("x2", "100%");
      line.setAttribute("y2", (x.k + 0.5) * ROW);
      line.setAttribute("stroke", tint(headRgb(x.h, n), x.t));
      Object.assign(line.dataset, { head: x.h, q: x.q, k: x.k, w: x.w });
      x.el = line;
      st.byQ[x.q].push(x);
      st.byK[x.k].push(x);
      st.byH[x.h].push(x);
      lines.append(line);
    }
    svg.replaceChildren(lines);
    st.on.forEach((_, h) => showHead(h));
    applyFocus();
  }

  // ---- rasters: model thumbnails, the matrix and the rollout ------------------------------------
  // Rows i of an (L, S) matrix, as row() gives them: a head's, or the rollout through layer l.
  const headRows = (l, h) => (i) => row(l, h, i);
  const rolloutRows = (l) => (i) => { const r = D.rollout[l]; return [r.k ? r.k[i] : null, r.w[i]]; };
  // At most maxSide x maxSide cells; a cell shows the max of its pool x pool block: v the weight, t its
  // colour on the scale shown (st.scale: the row rule, so a causal view's first rows, one key of weight 1,
  // do not pale the rest; or absolute, bertviz's).
  function raster(rowOf, maxSide) {
    const pool = Math.max(1, Math.ceil(Math.max(L, S) / maxSide));
    const rows = Math.ceil(L / pool), cols = Math.ceil(S / pool);
    const v = new Float32Array(rows * cols), t = new Float32Array(rows * cols);
    for (let i = 0; i < L; ++i) {
      const [ks, ws] = rowOf(i), base = Math.floor(i / pool) * cols;
      const top = ws.reduce((m, w) => (w > m ? w : m), 0);
      ws.forEach((w, k) => {
        if (!(w > 0)) return;
        const p = base + Math.floor((ks ? ks[k] : k) / pool);
        v[p] = Math.max(v[p], w);
        t[p] = Math.max(t[p], shade(w, top));
      });
    }
    return { pool, rows, cols, v, t };
  }
  // One pixel per cell, coloured by t (0 .. 1 on the scale shown).
  function image(r) {
    const c = el("canvas", { width: r.cols, height: r.rows }), ctx = c.getContext("2d");
    const img = ctx.createImageData(r.cols, r.rows);
    r.t.forEach((x, p) => { img.data.set(colour(x), 4 * p); img.data[4 * p + 3] = 255; });
    ctx.putImageData(img, 0, 0);
    return c;
  }

  function buildModel() {
    if (st.modelBuilt) return;
    st.modelBuilt = true;
    // thumbnails as large as the page's width allows for one row of heads (84 to 240 px)
    const table = $("model-grid"), head = el("tr");
    const BOX = Math.max(84, Math.min(240, Math.floor((document.documentElement.clientWidth - 140) / hmax) - 10));
    head.append(el("th"));
    for (let h = 0; h < hmax; ++h) head.append(el("th", {}, `head ${h}`));
    table.append(head);
    D.layers.forEach((heads, l) => {
      const tr = el("tr", { "data-layer": l });
      tr.append(el("th", {}, D.layer_names[l]));
      for (let h = 0; h < hmax; ++h) {
        const td = el("td");
        if (h < heads.length) {
          const r = raster(headRows(l, h), BOX), c = image(r), scale = BOX / Math.max(r.rows, r.cols);
          c.className = "thumb";
          Object.assign(c.dataset, { layer: l, head: h });
          c.title = `${D.layer_names[l]} · head ${h}`;
          c.style.width = `${Math.round(r.cols * scale)}px`;
          c.style.height = `${Math.round(r.rows * scale)}px`;
          c.addEventListener("click", () => openMatrix(l, h));
          td.append(c);
        }
        tr.append(td);
      }
      table.append(tr);
    });
    markModelRow();
  }
  function markModelRow() {
    for (const tr of $("model-grid").querySelectorAll("tr[data-layer]"))
      tr.classList.toggle("current", +tr.dataset.layer === st.layer);
  }

  function drawMatrix() {
    const l = st.layer, h = Math.min(st.head, nHeads(l) - 1), r = raster(headRows(l, h), 800);
    st.head = h;
    $("head-select").value = h;
    paint($("matrix"), r);
    Object.assign($("matrix").dataset, { layer: l, head: h });
    $("matrix-caption").textContent = `${D.layer_names[l]} · head ${h} · rows: queries, columns: keys` +
      ` · colour: ${SCALE_WORDS[st.scale]}` + (r.pool > 1 ? ` · each cell: max of ${r.pool}×${r.pool}` : "");
  }
  function drawRollout() {
    const l = st.layer, r = raster(rolloutRows(l), 800);
    paint($("rollout"), r);
    $("rollout").dataset.layer = l;
    $("rollout-caption").textContent = `rollout through ${D.layer_names[l]} (layers 0–${l}) · rows: positions,` +
      ` columns: input tokens · colour: ${SCALE_WORDS[st.scale]}` +
      (r.pool > 1 ? ` · each cell: max of ${r.pool}×${r.pool}` : "");
  }

  // Raster r on canvas cv with the token labels and a colour bar; cell (i, j) starts at (x0 + j * cell,
  // y0 + i * cell), CSS pixels (cv's data-x0, data-y0, data-cell, data-pool).
  function paint(cv, r) {
    const ctx = cv.getContext("2d");
    const cell = Math.max(1, Math.min(36, Math.floor(800 / Math.max(r.rows, r.cols))));
    const per = cell / r.pool, size = Math.min(12, Math.max(8, per * 0.72)), step = Math.ceil((size + 2) / per);
    const label = (labels, i) => (step > 1 ? `${i} ` : "") + labels[i];
    const font = `${size}px ${FONT}`;
    ctx.font = font;
    let qw = 0, kw = 0;
    for (let i = 0; i < L; i += step) qw = Math.max(qw, ctx.measureText(label(D.query_labels, i)).width);
    for (let j = 0; j < S; j += step) kw = Math.max(kw, ctx.measureText(label(D.key_labels, j)).width);
    const rotate = step > 1 || kw > per - 2;
    const x0 = Math.ceil(qw) + 12, y0 = Math.ceil(rotate ? kw : size) + 12;
    const w = r.cols * cell, hgt = r.rows * cell, barH = Math.min(360, Math.max(120, hgt));
    const W = x0 + w + 80, H = y0 + Math.max(hgt, barH) + 12, dpr = window.devicePixelRatio || 1;
    cv.width = Math.ceil(W * dpr);
    cv.height = Math.ceil(H * dpr);
    cv.style.width = `${W}px`;
    cv.style.height = `${H}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, W, H);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(image(r), x0, y0, w, hgt);
    if (cell >= 10) {  // hairlines between cells of short inputs
      ctx.strokeStyle = "rgba(255, 255, 255, 0.7)";
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let c = 1; c < r.cols; ++c) { ctx.moveTo(x0 + c * cell, y0); ctx.lineTo(x0 + c * cell, y0 + hgt); }
      for (let q = 1; q < r.rows; ++q) { ctx.moveTo(x0, y0 + q * cell); ctx.lineTo(x0 + w, y0 + q * cell); }
      ctx.stroke();
    }
    ctx.strokeStyle = "#8c959f";
    ctx.strokeRect(x0 - 0.5, y0 - 0.5, w + 1, hgt + 1);
    ctx.font = font;
    ctx.fillStyle = "#1f2328";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (let i = 0; i < L; i += step) ctx.fillText(label(D.query_labels, i), x0 - 6, y0 + (i + 0.5) * per);
    for (let j = 0; j < S; j += step) {
      const x = x0 + (j + 0.5) * per;
      ctx.save();
      if (rotate) {
        ctx.translate(x, y0 - 6);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillText(label(D.key_labels, j), 0, 0);
      } else {
        ctx.textAlign = "center";
        ctx.textBaseline = "alphabetic";
        ctx.fillText(label(D.key_labels, j), x, y0 - 6);
      }
      ctx.restore();
    }
    // colour bar: bottom = 0, top = each row's largest weight, or 1 on the absolute scale
    const bx = x0 + w + 18, grad = ctx.createLinearGradient(0, y0 + barH, 0, y0);
    D.colours.forEach((c, k) => grad.addColorStop(k / (D.colours.length - 1), `rgb(${c})`));
    ctx.fillStyle = grad;
    ctx.fillRect(bx, y0, 12, barH);
    ctx.strokeRect(bx - 0.5, y0 - 0.5, 13, barH + 1);
    ctx.fillStyle = "#1f2328";
    ctx.textAlign = "left";
    ctx.font = `11px ${FONT}`;
    for (const t of [0, 0.5, 1])
      ctx.fillText(st.scale === "absolute" ? `${t}` : `${100 * t}%`, bx + 17, y0 + (1 - t) * barH);
    Object.assign(cv.dataset, { x0, y0, cell, pool: r.pool, scale: st.scale });
    st.geom[cv.id] = { x0, y0, cell, r };
  }

  for (const id of ["matrix", "rollout"]) {
    $(id).addEventListener("mousemove", (e) => tooltip(e, st.geom[id], $(id + "-tip")));
    $(id).addEventListener("mouseleave", () => { $(id + "-tip").hidden = true; });
  }
  function tooltip(e, g, tip) {
    const box = e.target.getBoundingClientRect();
    const x = e.clientX - box.left, y = e.clientY - box.top;
    const c = Math.floor((x - g.x0) / g.cell), q = Math.floor((y - g.y0) / g.cell), r = g.r;
    if (c < 0 || q < 0 || c >= r.cols || q >= r.rows) { tip.hidden = true; return; }
    const w = r.v[q * r.cols + c], p = r.pool;
    tip.textContent = p === 1
      ? `${D.query_labels[q]} (${q}) → ${D.key_labels[c]} (${c}): ${fmt(w)}`
      : `queries ${q * p}–${Math.min(L, (q + 1) * p) - 1} → keys ${c * p}–${Math.min(S, (c + 1) * p) - 1}: ` +
        `max ${fmt(w)}`;
    tip.hidden = false;
    tip.style.left = `${x + 14}px`;
    tip.style.top = `${y + 14}px`;
  }

  // ---- navigation ----------------------------------------------------------------------------
  function fillHeadSelect() {
    const sel = $("head-select");
    sel.replaceChildren(...Array.from({ length: nHeads(st.layer) }, (_, h) => el("option", { value: h }, `head ${h}`)));
    st.head = Math.min(st.head, nHeads(st.layer) - 1);
    sel.value = st.head;
  }
  function setLayer(l) {
    st.layer = l;
    $("layer-select").value = l;
    buildSwatches();
    drawLines();
    fillHeadSelect();
    markModelRow();
    if (!$("view-matrix").hidden) drawMatrix();
    if (!$("view-rollout").hidden) drawRollout();
  }
  function showView(v) {
    for (const name of ["head", "model", "matrix", "rollout"]) {
      $("view-" + name).hidden = name !== v;
      $("tab-" + name).setAttribute("aria-selected", name === v);
    }
    if (v === "model") buildModel();
    if (v === "matrix") drawMatrix();
    if (v === "rollout") drawRollout();
  }
  // Every view on scale s: its words, the lines, the thumbnails (drawn again when next shown), the rasters.
  function sayScale(s) {
    st.scale = s;
    $("scale-select").value = s;
    document.body.dataset.scale = s;
    for (const n of document.querySelectorAll(".scale-note")) n.textContent = SCALE_WORDS[s];
  }
  function setScale(s) {
    sayScale(s);
    drawLines();
    st.modelBuilt = false;
    $("model-grid").replaceChildren();
    if (!$("view-model").hidden) buildModel();
    if (!$("view-matrix").hidden) drawMatrix();
    if (!$("view-rollout").hidden) drawRollout();
  }
  function openMatrix(l, h) {
    st.head = h;
    setLayer(l);
    showView("matrix");
  }

  D.layer_names.forEach((name, l) => $("layer-select").append(el("option", { value: l }, name)));
  $("layer-select").addEventListener("change", (e) => setLayer(+e.target.value));
  $("head-select").addEventListener("change", (e) => { st.head = +e.target.value; drawMatrix(); });
  $("scale-select").addEventListener("change", (e) => setScale(e.target.value));
  $("tab-rollout").hidden = !D.rollout;  // cross-attention: nothing to roll out
  for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => showView(b.dataset.view));
  buildTokens();
  sayScale(st.scale);
  setLayer(0);
  showView("head");
  document.body.dataset.ready = "1";
})();
)attn";

}  // namespace attn::viz
