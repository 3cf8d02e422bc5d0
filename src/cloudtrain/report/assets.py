"""The report's inline stylesheet and script (no network: everything ships in the page).

The script reads the JSON in <script id="report-data">, draws each plot as SVG with a hover
read-out, draws the event timeline, and records what it drew on <body>:
`data-plots-drawn` (plots with data), `data-points` (points drawn) and, if anything threw,
`data-js-error`. With `?selftest=1` in the URL it also hovers the first plot and records the
read-out in `data-hover-test` (used by the headless-browser test). All text is inserted with
textContent, never parsed as HTML.
"""

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dde5; --bg:#ffffff; --card:#f6f7f9;
  --critical:#b3261e; --warn:#9a6700; --info:#1f5fa8; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); margin: 0 auto; max-width: 1180px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; }
.sub { color: var(--muted); margin-bottom: 18px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { color: var(--muted); font-weight: 600; white-space: nowrap; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px; }
.plot { background: var(--card); border-radius: 8px; padding: 10px 12px; position: relative; }
.plot h3 { font-size: 14px; margin: 0 0 4px; }
.plot svg { width: 100%; height: 220px; display: block; }
.plot .empty { color: var(--muted); padding: 30px 0; }
.axis text { fill: var(--muted); font-size: 11px; }
.axis line, .gridline { stroke: var(--line); }
.tip { position: absolute; pointer-events: none; background: #fff; border: 1px solid var(--line);
  border-radius: 6px; padding: 4px 8px; font-size: 12px; white-space: pre; display: none;
  box-shadow: 0 2px 6px rgba(0,0,0,.12); z-index: 2; }
.legend { font-size: 12px; color: var(--muted); }
.legend span { margin-right: 12px; } .legend i { display: inline-block; width: 10px;
  height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
.finding { border-left: 4px solid var(--line); background: var(--card); border-radius: 6px;
  padding: 8px 12px; margin: 8px 0; }
.finding.critical { border-color: var(--critical); } .finding.warn { border-color: var(--warn); }
.finding.info { border-color: var(--info); }
.finding .sev { font-weight: 700; text-transform: uppercase; font-size: 11px; }
.finding.critical .sev { color: var(--critical); } .finding.warn .sev { color: var(--warn); }
.finding.info .sev { color: var(--info); }
.finding dl { display: grid; grid-template-columns: 110px 1fr; gap: 2px 10px; margin: 6px 0 0; }
.finding dt { color: var(--muted); } .finding dd { margin: 0; }
pre { background: #f0f1f4; padding: 8px; overflow: auto; max-height: 320px; font-size: 12px; }
details summary { cursor: pointer; color: var(--muted); }
.timeline svg { width: 100%; height: 90px; display: block; }
.ok { color: var(--muted); }
"""

JS = r"""
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) {
    body.setAttribute("data-js-error", String(e.message || e));
  });
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#2f6fd6", "#d9480f", "#2b8a3e", "#9c36b5", "#c92a2a", "#0b7285", "#e67700",
                "#5c940d", "#862e9c", "#364fc7"];
  var data = JSON.parse(document.getElementById("report-data").textContent);

  function svg(tag, attrs, parent) {
    var node = document.createElementNS(NS, tag);
    for (var k in attrs) { node.setAttribute(k, String(attrs[k])); }
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) { return "-"; }
    var a = Math.abs(v);
    if (a >= 1e9) { return (v / 1e9).toFixed(2) + "G"; }
    if (a >= 1e6) { return (v / 1e6).toFixed(2) + "M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(1) + "k"; }
    if (a >= 100) { return v.toFixed(0); }
    if (a >= 1) { return v.toFixed(2); }
    return v.toPrecision(3);
  }
  function ticks(lo, hi, n) {
    var span = hi - lo || 1, step = Math.pow(10, Math.floor(Math.log10(span / n)));
    var err = n / span * step;
    if (err <= 0.15) { step *= 10; } else if (err <= 0.35) { step *= 5; }
    else if (err <= 0.75) { step *= 2; }
    var out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) { out.push(t); }
    return out;
  }
  function extent(series, key) {
    var lo = Infinity, hi = -Infinity;
    series.forEach(function (s) { s[key].forEach(function (v) {
      if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }); });
    return [lo, hi];
  }
  function nearest(xs, x) {
    var lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) {
      var mid = (lo + hi) >> 1;
      if (xs[mid] < x) { lo = mid; } else { hi = mid; }
    }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  function drawPlot(box, plot) {
    var W = 640, H = 220, L = 56, R = 12, T = 10, B = 30;
    var root = svg("svg", {viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none",
                           role: "img", "data-plot": plot.key}, box);
    var xr = extent(plot.series, "x"), yr = extent(plot.series, "y");
    var ylo = Math.min(0, yr[0]), yhi = yr[1] > ylo ? yr[1] * 1.05 : ylo + 1;
    if (plot.key === "loss") { ylo = yr[0] * 0.95; yhi = yr[1] * 1.02 + 1e-9; }
    var xlo = xr[0], xhi = xr[1] > xr[0] ? xr[1] : xr[0] + 1;
    function X(v) { return L + (v - xlo) / (xhi - xlo) * (W - L - R); }
    function Y(v) { return T + (1 - (v - ylo) / (yhi - ylo)) * (H - T - B); }
    var axis = svg("g", {"class": "axis"}, root);
    var yt = ticks(ylo, yhi, 4), ywhole = yt.length < 2 || yt[1] - yt[0] >= 1;
    yt.forEach(function (t) {
      svg("line", {"class": "gridline", x1: L, x2: W - R, y1: Y(t), y2: Y(t)}, axis);
      svg("text", {x: L - 6, y: Y(t) + 4, "text-anchor": "end"}, axis).textContent =
        ywhole && Math.abs(t) < 1e4 ? t.toFixed(0) : fmt(t);
    });
    var xt = ticks(xlo, xhi, 6), whole = xt.length < 2 || xt[1] - xt[0] >= 1;
    xt.forEach(function (t) {
      svg("text", {x: X(t), y: H - 10, "text-anchor": "middle"}, axis).textContent =
        whole ? t.toFixed(0) : fmt(t);
    });
    var points = 0;
    plot.series.forEach(function (s, i) {
      var d = "", pen = false;
      for (var j = 0; j < s.x.length; j++) {
        if (s.y[j] === null || !isFinite(s.y[j])) { pen = false; continue; }
        d += (pen ? "L" : "M") + X(s.x[j]).toFixed(1) + "," + Y(s.y[j]).toFixed(1);
        pen = true; points++;
      }
      if (d) { svg("path", {d: d, fill: "none", stroke: COLORS[i % COLORS.length],
                            "stroke-width": 1.6, "vector-effect": "non-scaling-stroke"}, root); }
    });
    var cursor = svg("line", {y1: T, y2: H - B, stroke: "#888", "stroke-dasharray": "3,3",
                              visibility: "hidden"}, root);
    var tip = document.createElement("div");
    tip.className = "tip";
    box.appendChild(tip);
    var overlay = svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B,
                               fill: "transparent"}, root);
    function hover(clientX) {
      var r = root.getBoundingClientRect();
      var x = xlo + ((clientX - r.left) / (r.width || 1) * W - L) / (W - L - R) * (xhi - xlo);
      var lines = ["t = " + fmt(x) + " min"];
      plot.series.forEach(function (s) {
        if (!s.x.length) { return; }
        var j = nearest(s.x, x);
        lines.push(s.label + ": " + fmt(s.y[j]) + (plot.unit ? " " + plot.unit : ""));
      });
      cursor.setAttribute("x1", X(x)); cursor.setAttribute("x2", X(x));
      cursor.setAttribute("visibility", "visible");
      tip.textContent = lines.join("\n");
      tip.style.display = "block";
      var left = clientX - box.getBoundingClientRect().left + 12;
      tip.style.left = Math.min(box.clientWidth - 160, Math.max(0, left)) + "px";
      tip.style.top = "34px";
      return tip.textContent;
    }
    overlay.addEventListener("mousemove", function (e) { hover(e.clientX); });
    overlay.addEventListener("mouseleave", function () {
      tip.style.display = "none"; cursor.setAttribute("visibility", "hidden");
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    plot.series.forEach(function (s, i) {
      var item = document.createElement("span"), sw = document.createElement("i");
      sw.style.background = COLORS[i % COLORS.length];
      item.appendChild(sw); item.appendChild(document.createTextNode(s.label));
      legend.appendChild(item);
    });
    box.appendChild(legend);
    root.setAttribute("data-points", String(points));
    return {points: points, hover: hover, root: root};
  }

  function drawTimeline(box, runs) {
    var W = 1000, H = 24 + 26 * runs.length, L = 150, R = 16;
    var root = svg("svg", {viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none"}, box);
    root.style.height = H + "px";
    var hi = 0;
    runs.forEach(function (r) { hi = Math.max(hi, r.duration_min || 0);
      r.events.forEach(function (e) { hi = Math.max(hi, e.t_min); }); });
    hi = hi || 1;
    var kinds = {};
    runs.forEach(function (r, i) {
      var y = 16 + i * 26;
      svg("text", {x: L - 8, y: y + 4, "text-anchor": "end", "font-size": 12}, root)
        .textContent = r.label;
      svg("line", {x1: L, x2: L + (r.duration_min || hi) / hi * (W - L - R), y1: y, y2: y,
                   stroke: "#c5cad3", "stroke-width": 6, "stroke-linecap": "round"}, root);
      r.events.forEach(function (e) {
        if (!(e.kind in kinds)) { kinds[e.kind] = Object.keys(kinds).length; }
        var c = svg("circle", {cx: L + e.t_min / hi * (W - L - R), cy: y, r: 6,
                               fill: COLORS[kinds[e.kind] % COLORS.length]}, root);
        svg("title", {}, c).textContent = e.kind + " at " + fmt(e.t_min) + " min: " + e.message;
      });
    });
    return Object.keys(kinds).length;
  }

  var drawn = 0, total = 0, first = null;
  data.plots.forEach(function (plot) {
    var box = document.getElementById("plot-" + plot.key);
    if (!box) { return; }
    var has = plot.series.some(function (s) {
      return s.y.some(function (v) { return v !== null; });
    });
    if (!has) {
      var empty = document.createElement("div");
      empty.className = "empty"; empty.textContent = "not recorded for this run";
      box.appendChild(empty); return;
    }
    var result = drawPlot(box, plot);
    drawn++; total += result.points;
    if (!first) { first = result; }
  });
  var tl = document.getElementById("timeline");
  if (tl) { body.setAttribute("data-event-kinds", String(drawTimeline(tl, data.timeline))); }
  body.setAttribute("data-plots-drawn", String(drawn));
  body.setAttribute("data-points", String(total));
  if (first && /[?&]selftest=1/.test(window.location.search)) {
    var r = first.root.getBoundingClientRect();
    body.setAttribute("data-hover-test", first.hover(r.left + r.width * 0.5).replace(/\n/g, " | "));
  }
})();
"""
