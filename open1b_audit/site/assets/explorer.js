/* open1b run explorer: curves as inline SVG (run page) and the static search (search page).
   Data arrive as window.OPEN1B_RUN / OPEN1B_CHUNKS / OPEN1B_SEARCH / OPEN1B_SEARCH_TEXT from
   <script src> files, which file:// allows. Text from the corpus is only ever set with textContent. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg", W = 660, H = 180, PAD = 64;

  function svg(tag, attrs, parent) {
    var n = document.createElementNS(NS, tag);
    for (var k in attrs) n.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(n);
    return n;
  }
  function node(tag, text, parent, attrs) {
    var n = document.createElement(tag);
    if (text !== null && text !== undefined) n.textContent = text;
    for (var k in attrs || {}) n.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(n);
    return n;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e6)) ? v.toExponential(3) : String(+v.toPrecision(5));
  }

  // ------------------------------------------------------------------ curves
  function draw(fig, xs, ys, marks) {
    var old = fig.querySelector("svg");
    if (old) fig.removeChild(old);
    var pts = [];
    for (var i = 0; i < xs.length; i++) if (ys[i] !== null && ys[i] !== undefined) pts.push([xs[i], ys[i]]);
    fig.hidden = pts.length === 0;
    if (!pts.length) return;
    var x0 = pts[0][0], x1 = pts[pts.length - 1][0], y0 = Infinity, y1 = -Infinity;
    pts.forEach(function (p) { y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]); });
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 += 0.5 * (Math.abs(y0) || 1); y0 -= 0.5 * (Math.abs(y0) || 1); }
    function X(x) { return PAD + (x - x0) / (x1 - x0) * (W - PAD - 8); }
    function Y(y) { return 8 + (y1 - y) / (y1 - y0) * (H - 30); }
    var s = svg("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H}, fig);
    svg("rect", {x: PAD, y: 8, width: W - PAD - 8, height: H - 30, "class": "frame"}, s);
    marks.phases.forEach(function (x) {
      if (x > x0 && x <= x1) svg("line", {x1: X(x), x2: X(x), y1: 8, y2: H - 22, "class": "phase"}, s);
    });
    var d = pts.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1); });
    svg("path", {d: d.join(""), "class": "curve", "data-points": pts.length}, s);
    marks.skipped.forEach(function (x) {
      if (x >= x0 && x <= x1) svg("circle", {cx: X(x), cy: H - 24, r: 3, "class": "skipped"}, s);
    });
    [[y1, 14], [y0, H - 22]].forEach(function (t) {
      svg("text", {x: PAD - 4, y: t[1], "text-anchor": "end"}, s).textContent = fmt(t[0]);
    });
    svg("text", {x: PAD, y: H - 6}, s).textContent = fmt(x0);
    svg("text", {x: W - 8, y: H - 6, "text-anchor": "end"}, s).textContent = fmt(x1);
  }

  function runPage(RUN) {
    var xkey = "step", zoom = null;
    function marks() {
      var ph = RUN.phases.slice(1).map(function (p) { return xkey === "step" ? p.first_step : p.tokens_before; });
      return {phases: ph, skipped: xkey === "step" ? RUN.skipped : RUN.skipped_tokens};
    }
    function redraw() {
      var figs = document.querySelectorAll("figure.chart");
      for (var i = 0; i < figs.length; i++) {
        var k = figs[i].getAttribute("data-series");
        if (zoom) {
          var xs = [], ys = [];
          zoom.forEach(function (c) {
            if (!c[k]) return;
            for (var j = 0; j < c.step.length; j++) {
              if (c.step[j] < zoom.a || c.step[j] > zoom.b) continue;
              xs.push(c[xkey][j]); ys.push(c[k][j]);
            }
          });
          draw(figs[i], xs, ys, marks());
        } else {
          var sr = RUN.overview.series[k];
          draw(figs[i], sr ? sr[xkey] : [], sr ? sr.y : [], marks());
        }
      }
    }
    function load(i, done) {
      var have = window.OPEN1B_CHUNKS && window.OPEN1B_CHUNKS[i];
      if (have) return done(have);
      var t = document.createElement("script");
      t.src = "data/curves-" + i + ".js";
      t.onload = function () { done(window.OPEN1B_CHUNKS[i]); };
      document.body.appendChild(t);
    }
    var radios = document.querySelectorAll("input[name=x]");
    for (var i = 0; i < radios.length; i++) radios[i].addEventListener("change", function (ev) {
      xkey = ev.target.value; redraw();
    });
    var form = document.getElementById("zoom");
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var a = parseInt(form.a.value, 10) || 1, b = parseInt(form.b.value, 10) || RUN.steps;
      a = Math.max(1, a); b = Math.min(RUN.steps, Math.max(a, b));
      var first = Math.floor((a - 1) / RUN.chunk_steps), last = Math.floor((b - 1) / RUN.chunk_steps);
      var got = [], left = last - first + 1;
      for (var c = first; c <= last; c++) (function (c) {
        load(c, function (chunk) { got[c - first] = chunk; if (--left === 0) { zoom = got; zoom.a = a; zoom.b = b; redraw(); } });
      })(c);
    });
    form.addEventListener("reset", function () { zoom = null; setTimeout(redraw, 0); });
    redraw();
  }

  // ------------------------------------------------------------------ static search
  function stepOfWindow(S, m) {
    var t = m * S.seq_tokens, r = null;
    S.runs.forEach(function (x) { if (x[3] <= t) r = x; });
    return r[0] + Math.floor((t - r[3]) / (r[2] * S.seq_tokens));
  }
  function stepRef(S, n, parent) {
    if (S.written.indexOf(n) >= 0) node("a", "step " + n, parent, {href: "step-" + n + ".html"});
    else node("span", "step " + n + " (not written in this site; open1b-audit serve shows it)", parent);
  }
  function searchPage(S) {
    var q = new URLSearchParams(window.location.search).get("q") || "";
    var out = document.getElementById("results"), hits = 0;
    if (!q) return;
    node("p", "results for: " + q, out, {"class": "note"});
    if (/^\d+$/.test(q.trim())) {
      var n = parseInt(q, 10);
      if (n >= 1 && n <= S.last_step) { stepRef(S, n, node("p", null, out, {"class": "hit"})); hits++; }
      if (n < S.total_windows) {
        var p = node("p", "window " + n + " is in ", out, {"class": "hit"});
        stepRef(S, stepOfWindow(S, n), p); hits++;
      }
    }
    // the documents' text comes in data/search-text-I.js chunks: load them all, then match
    var left = S.text_chunks.length;
    function matchAll() {
      var texts = window.OPEN1B_SEARCH_TEXT || {}, c = 0;
      S.docs.forEach(function (d, i) {
        while (c + 1 < S.text_chunks.length && S.text_chunks[c + 1] <= i) c++;
        var text = texts[c] ? texts[c][i - S.text_chunks[c]] : "";
        if (d.id !== q && text.indexOf(q) < 0) return;
        var p = node("p", null, out, {"class": "hit doc"});
        node("a", d.id, p, {href: "doc-" + d.key + ".html"});
        node("span", " (" + d.source + "): steps ", p);
        d.steps.forEach(function (s, i) {
          if (i) node("span", ", ", p);
          if (S.written.indexOf(s) >= 0) node("a", String(s), p, {href: "step-" + s + ".html"});
          else node("span", String(s), p);
        });
        hits++;
      });
      if (!hits) node("p", "nothing found among the " + S.docs.length + " documents of the " +
                      S.written.length + " steps this site was written with", out);
      out.setAttribute("data-done", "1");
    }
    if (!left) return matchAll();
    S.text_chunks.forEach(function (_, c) {
      var t = document.createElement("script");
      t.src = "data/search-text-" + c + ".js";
      t.onload = t.onerror = function () { if (--left === 0) matchAll(); };
      document.body.appendChild(t);
    });
  }

  if (window.OPEN1B_RUN) runPage(window.OPEN1B_RUN);
  if (window.OPEN1B_SEARCH) searchPage(window.OPEN1B_SEARCH);
})();
