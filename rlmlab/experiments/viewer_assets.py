"""The stylesheet and script inlined into every `rlmlab view` page (see `rlmlab.experiments.viewer`).

The script reads the page's embedded JSON and draws on demand: the per-bin table, a filtered
list one page of rows at a time, and one expression in detail. Every string from the data goes
into the document through `textContent`, never as markup.
"""

CSS = r"""
:root{--bad:#c62828;--ok:#2e7d32;--mark:#fff3c4;--line:#ddd;--dim:#777;--ctl:#1565c0}
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;padding:10px 16px;color:#222}
body.index{max-width:1200px;margin:auto}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:18px 0 6px}h3{font-size:15px;margin:14px 0 4px}
code,.tok,.strip,.cell{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:12.5px}
.meta,.stats{margin:2px 0;color:#444}.note{background:#f5f5f5;border-left:3px solid #999;padding:4px 8px;margin:6px 0}
.back{margin:0}
table{border-collapse:collapse}
table.report td,table.report th,#bins td,#bins th{border:1px solid var(--line);padding:2px 6px;text-align:right}
table.report td:first-child,table.report th:first-child,#bins td:first-child{text-align:left}
figure{margin:10px 0}figure img{max-width:100%;border:1px solid var(--line)}figcaption{color:var(--dim);font-size:12px}
#bins{margin:6px 0;overflow-x:auto}#bins a{cursor:pointer;color:#0645ad}
#main{display:grid;grid-template-columns:minmax(360px,38%) minmax(0,1fr);gap:14px;align-items:start}
#left,#detail{max-height:calc(100vh - 20px);overflow:auto;position:sticky;top:10px}
.filters{display:flex;flex-wrap:wrap;gap:4px;margin-bottom:4px}.filters select,.filters input{max-width:100%}
.pager{margin:4px 0}
table.list{width:100%;table-layout:fixed}
table.list th{text-align:left;font-weight:600;border-bottom:1px solid var(--line);position:sticky;top:0;background:#fff}
table.list td{padding:1px 4px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;border-bottom:1px solid #f0f0f0}
table.list th:nth-child(1){width:44px}table.list th:nth-child(2){width:64px}table.list th:nth-child(3){width:18px}
table.list th:nth-child(4){width:150px}table.list th:nth-child(5),table.list th:nth-child(6){width:44px}
table.list tr{cursor:pointer}table.list tr:hover{background:#f3f6ff}table.list tr.sel{background:#dde6ff}
td.num{text-align:right}td.expr{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
tr.ok .mark{color:var(--ok)}tr.bad .mark{color:var(--bad)}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:1px 10px;margin:6px 0}.facts dt{color:var(--dim)}
.facts dd{margin:0}
.good{color:var(--ok);font-weight:600}.wrong{color:var(--bad);font-weight:600}
.exprline{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;word-break:break-all;
  background:#f7f7f7;padding:4px 6px}
.cols{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:10px}
.box{border:1px solid var(--line);padding:6px;border-radius:3px}
.box.mine{border-color:#5c6bc0;box-shadow:0 0 0 1px #5c6bc0}
.box h4{margin:0 0 4px;font-size:13px}
.badge{background:#5c6bc0;color:#fff;border-radius:3px;padding:0 4px;font-size:11px;margin-left:4px}
.strip{line-height:1.9;word-break:break-word}.strip.scroll{max-height:220px;overflow:auto}
.tok{padding:0 2px;margin-right:3px;border-radius:2px;background:#f1f1f1;white-space:pre}
.tok.ctl{color:var(--ctl);font-weight:600}.tok.ctx{background:#e8eaf6}.tok.prompt{background:#eceff1;color:#555}
.tok.next{outline:2px solid var(--bad)}
.stack .lvl{display:grid;grid-template-columns:64px minmax(0,1fr);gap:6px;border-top:1px dashed var(--line);
  padding:2px 0}
.stack .lvl.top{background:#f3f4fd}.stack .lvl span.d{color:var(--dim);font-size:12px}
.trace{max-height:50vh;overflow:auto;border:1px solid var(--line);padding:4px;line-height:1.2}
.cell{display:inline-flex;flex-direction:column;margin:0 2px 5px 0;vertical-align:top;border-radius:2px;padding:0 2px;
  background:#fafafa}
.cell span{white-space:pre;min-height:1.2em}.cell .ctl{color:var(--ctl);font-weight:600}
.cell .p{color:#555;border-top:1px dotted #ccc}
.cell.prompt{background:#eceff1;color:#555}.cell.diff{background:#ffebee}.cell.diff .p{color:var(--bad);font-weight:600}
.cell.first{outline:2px solid var(--bad);background:var(--mark)}.cell.after{opacity:.85}
.legend{color:var(--dim);font-size:12px;margin:2px 0}
.hint{color:var(--dim)}
button{font:inherit}
"""

EVAL_JS = r"""
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const C = {};
  D.columns.forEach(function (c, i) { C[c] = i; });
  const A = D.alphabet, W = D.width, BASE = A.length, DIGIT = {};
  for (let i = 0; i < A.length; i++) DIGIT[A[i]] = i;
  const rows = D.rows, PER_PAGE = 100, CTL = {};
  // Spelled out so that no tag-like text appears anywhere in the page's source.
  ["call", "/call", "return", "/return"].forEach(function (n) { CTL["\u003c" + n + ">"] = 1; });
  const FIRST_CELLS = 4000;  // positions drawn before "show all": runaway traces reach 32k
  const mine = D.driver;  // "rm": this learner reads the active frame; "cot": the whole prefix

  function decode(s) {
    const out = new Array(s.length / W);
    for (let i = 0, k = 0; i < s.length; i += W, k++) {
      let v = 0;
      for (let j = 0; j < W; j++) v = v * BASE + DIGIT[s[i + j]];
      out[k] = D.tokens[v];
    }
    return out;
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function pct(k, n) { return n ? (100 * k / n).toFixed(1) + "%" : "–"; }
  function tok(t, cls) { return el("span", "tok" + (CTL[t] ? " ctl" : "") + (cls ? " " + cls : ""), t); }
  function strip(tokens, clsOf, scroll) {
    const s = el("div", "strip" + (scroll ? " scroll" : ""));
    const f = document.createDocumentFragment();
    for (let k = 0; k < tokens.length; k++) f.appendChild(tok(tokens[k], clsOf ? clsOf(k) : ""));
    s.appendChild(f);
    return s;
  }

  // --- per-bin table --------------------------------------------------------------------------
  function drawBins() {
    const box = document.getElementById("bins");
    if (!D.bins.length) return;
    const n = D.bins.map(function () { return [0, 0, 0, 0]; });
    rows.forEach(function (r) {
      const b = r[C.bin];
      if (b === null) return;
      n[b][0]++; n[b][1] += r[C.correct]; n[b][2] += r[C.valid]; n[b][3] += (r[C.diverge_at] === null ? 1 : 0);
    });
    const t = el("table"), head = el("tr"), lines = [["final answer", 1], ["valid traces", 2], ["exact traces", 3]];
    head.appendChild(el("th", "", "bin"));
    D.bins.forEach(function (b, i) {
      const th = el("th"), a = el("a", "", b);
      a.title = "show this bin only";
      a.addEventListener("click", function () { fBin.value = String(i); applyFilters(); });
      th.appendChild(a);
      head.appendChild(th);
    });
    t.appendChild(head);
    lines.forEach(function (l) {
      const tr = el("tr");
      tr.appendChild(el("td", "", l[0]));
      n.forEach(function (c) { tr.appendChild(el("td", "", pct(c[l[1]], c[0]))); });
      t.appendChild(tr);
    });
    const tr = el("tr");
    tr.appendChild(el("td", "", "expressions"));
    n.forEach(function (c) { tr.appendChild(el("td", "", c[0])); });
    t.appendChild(tr);
    box.appendChild(t);
  }

  // --- filters and list -----------------------------------------------------------------------
  const fBin = document.getElementById("f-bin"), fCorrect = document.getElementById("f-correct");
  const fCat = document.getElementById("f-cat"), fText = document.getElementById("f-text");
  let shown = [], page = 0, current = -1;

  function option(sel, value, label) { const o = el("option", "", label); o.value = value; sel.appendChild(o); }
  function fillFilters() {
    const perBin = D.bins.map(function () { return 0; }), perCat = D.categories.map(function () { return 0; });
    rows.forEach(function (r) { if (r[C.bin] !== null) perBin[r[C.bin]]++; perCat[r[C.category]]++; });
    if (D.bins.length) {
      option(fBin, "", "all bins");
      D.bins.forEach(function (b, i) { option(fBin, String(i), b + " (" + perBin[i] + ")"); });
    } else fBin.style.display = "none";
    option(fCat, "", "every outcome");
    D.categories.forEach(function (c, i) { option(fCat, String(i), c + " (" + perCat[i] + ")"); });
    [fBin, fCorrect, fCat].forEach(function (s) { s.addEventListener("change", applyFilters); });
    fText.addEventListener("input", applyFilters);
  }
  function applyFilters() {
    const b = fBin.value, c = fCorrect.value, k = fCat.value, t = fText.value.trim();
    shown = [];
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i];
      if (b !== "" && String(r[C.bin]) !== b) continue;
      if (c === "correct" && !r[C.correct]) continue;
      if (c === "wrong" && r[C.correct]) continue;
      if (k !== "" && String(r[C.category]) !== k) continue;
      if (t && r[C.expr].indexOf(t) < 0) continue;
      shown.push(i);
    }
    page = 0;
    drawList();
  }
  function drawList() {
    const body = document.getElementById("list-body");
    body.textContent = "";
    const start = page * PER_PAGE, end = Math.min(shown.length, start + PER_PAGE);
    const f = document.createDocumentFragment();
    for (let k = start; k < end; k++) {
      const i = shown[k], r = rows[i];
      const tr = el("tr", (r[C.correct] ? "ok" : "bad") + (i === current ? " sel" : ""));
      tr.dataset.i = i;
      tr.appendChild(el("td", "num", i));
      tr.appendChild(el("td", "", r[C.bin] === null ? "" : D.bins[r[C.bin]]));
      tr.appendChild(el("td", "mark", r[C.correct] ? "\u2713" : "\u2717"));
      const cat = D.categories[r[C.category]];
      const cell = el("td", "", cat.replace(/^invalid trace: /, "invalid: "));
      cell.title = cat;
      tr.appendChild(cell);
      tr.appendChild(el("td", "num", r[C.trace_len]));
      tr.appendChild(el("td", "num", r[C.diverge_at] === null ? "" : r[C.diverge_at]));
      const e = el("td", "expr", r[C.expr]);
      e.title = r[C.expr];
      tr.appendChild(e);
      f.appendChild(tr);
    }
    body.appendChild(f);
    document.getElementById("range").textContent = shown.length
      ? (start + 1) + "\u2013" + end + " of " + shown.length
        + (shown.length < rows.length ? " (of " + rows.length + ")" : "")
      : "no expression matches (of " + rows.length + ")";
    document.getElementById("prev").disabled = page === 0;
    document.getElementById("next").disabled = end >= shown.length;
  }
  document.getElementById("list-body").addEventListener("click", function (ev) {
    const tr = ev.target.closest("tr");
    if (tr && tr.dataset.i !== undefined) select(Number(tr.dataset.i));
  });
  document.getElementById("prev").addEventListener("click", function () { if (page > 0) { page--; drawList(); } });
  document.getElementById("next").addEventListener("click", function () {
    if ((page + 1) * PER_PAGE < shown.length) { page++; drawList(); }
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT" || !shown.length) return;
    const step = (ev.key === "ArrowDown" || ev.key === "j") ? 1 : (ev.key === "ArrowUp" || ev.key === "k") ? -1 : 0;
    if (!step) return;
    ev.preventDefault();
    const at = shown.indexOf(current);
    const k = at < 0 ? page * PER_PAGE : Math.max(0, Math.min(shown.length - 1, at + step));
    if (Math.floor(k / PER_PAGE) !== page) { page = Math.floor(k / PER_PAGE); drawList(); }
    select(shown[k]);
  });

  function select(i) {
    current = i;
    document.querySelectorAll("#list-body tr.sel").forEach(function (tr) { tr.classList.remove("sel"); });
    const tr = document.querySelector('#list-body tr[data-i="' + i + '"]');
    if (tr) { tr.classList.add("sel"); tr.scrollIntoView({block: "nearest"}); }
    drawDetail(i);
    if (history.replaceState) history.replaceState(null, "", "#" + i);
  }

  // --- one expression -------------------------------------------------------------------------
  function fact(dl, name, value, cls) {
    dl.appendChild(el("dt", "", name));
    dl.appendChild(el("dd", cls || "", value));
  }
  function drawDetail(i) {
    const r = rows[i], det = document.getElementById("detail");
    det.textContent = "";
    const gold = decode(r[C.gold]), P = r[C.prompt_len], d = r[C.diverge_at];
    const p = r[C.produced], produced = p === null ? null : (p === 1 ? gold : decode(p));
    det.appendChild(el("h2", "", "Expression " + i));
    det.appendChild(el("div", "exprline", r[C.expr]));
    const dl = el("dl", "facts");
    fact(dl, "value", r[C.value]);
    fact(dl, "prediction", r[C.prediction] === null ? "(none: the root never returned)" : r[C.prediction],
         r[C.correct] ? "good" : "wrong");
    fact(dl, "outcome", D.categories[r[C.category]]);
    if (r[C.bin] !== null) fact(dl, "bin", D.bins[r[C.bin]]);
    if (r[C.id] !== null) fact(dl, "id", r[C.id]);
    fact(dl, "trace tokens", "canonical " + gold.length + ", produced " +
         (r[C.pred_trace_len] === null ? "?" : r[C.pred_trace_len]));
    fact(dl, "first divergence", d === null ? "none: the produced trace is the canonical one"
         : "position " + d + " (token " + (d - P + 1) + " after the " + P + "-token expression)");
    det.appendChild(dl);
    if (d !== null) drawStack(det, r, gold, produced, d);
    drawTrace(det, gold, produced, P, d, false);
  }

  function drawStack(det, r, gold, produced, d) {
    det.appendChild(el("h3", "", "At the divergence"));
    const want = d < gold.length ? gold[d] : "(end: the canonical trace is complete)";
    let wrote;
    if (produced === null) wrote = "(not saved)";
    else wrote = d < produced.length ? produced[d] : "(nothing: the produced trace ends here)";
    const line = el("p");
    line.appendChild(document.createTextNode("Position " + d + ": the canonical trace continues with "));
    line.appendChild(tok(want));
    line.appendChild(document.createTextNode(", the model wrote "));
    line.appendChild(produced === null ? el("span", "hint", wrote) : tok(wrote, "next"));
    line.appendChild(document.createTextNode(". Both read the same " + d + " tokens up to here:"));
    det.appendChild(line);
    const stack = r[C.stack].map(decode), top = stack[stack.length - 1], m = r[C.top_m];
    const cols = el("div", "cols");
    const rm = el("div", "box" + (mine === "rm" ? " mine" : ""));
    const h = el("h4", "", "RM reads the active frame (depth " + stack.length + ", " + top.length + " tokens)");
    if (mine === "rm") h.appendChild(el("span", "badge", "this learner"));
    rm.appendChild(h);
    rm.appendChild(strip(top, function (k) { return k < m ? "ctx" : ""; }, false));
    rm.appendChild(el("div", "legend", "shaded: the frame's given context (m = " + m + "); then what it wrote since"));
    const cot = el("div", "box" + (mine === "cot" ? " mine" : ""));
    const h2 = el("h4", "", "CoT reads the whole prefix (" + d + " tokens)");
    if (mine === "cot") h2.appendChild(el("span", "badge", "this learner"));
    cot.appendChild(h2);
    const prefix = strip(gold.slice(0, d), function (k) { return k < r[C.prompt_len] ? "prompt" : ""; }, true);
    cot.appendChild(prefix);
    cols.appendChild(rm);
    cols.appendChild(cot);
    det.appendChild(cols);
    requestAnimationFrame(function () { prefix.scrollTop = prefix.scrollHeight; });
    if (stack.length > 1) {
      det.appendChild(el("h3", "", "Frame stack (root first; the top is RM's active frame)"));
      const box = el("div", "stack");
      stack.forEach(function (f, k) {
        const lvl = el("div", "lvl" + (k === stack.length - 1 ? " top" : ""));
        lvl.appendChild(el("span", "d", "depth " + (k + 1)));
        lvl.appendChild(strip(f, null, false));
        box.appendChild(lvl);
      });
      det.appendChild(box);
    }
  }

  function drawTrace(det, gold, produced, P, d, all) {
    const head = el("h3", "", produced === null
      ? "Canonical trace (the produced trace was not saved; the recorded divergence is marked)"
      : "Canonical trace (top) over produced trace (bottom), position by position");
    det.appendChild(head);
    const n = Math.max(gold.length, produced === null ? 0 : produced.length);
    const upto = all ? n : Math.min(n, Math.max(FIRST_CELLS, (d === null ? 0 : d) + 500));
    const box = el("div", "trace"), f = document.createDocumentFragment();
    let first = null;
    for (let k = 0; k < upto; k++) {
      const g = k < gold.length ? gold[k] : "", q = produced === null ? null : (k < produced.length ? produced[k] : "");
      let cls = "cell" + (k < P ? " prompt" : "");
      if (q !== null && g !== q) cls += " diff";
      if (k === d) cls += " first";
      else if (d !== null && k > d) cls += " after";
      const c = el("span", cls);
      c.title = "position " + k;
      c.appendChild(el("span", "g" + (CTL[g] ? " ctl" : ""), g));
      if (q !== null) c.appendChild(el("span", "p", q));
      if (k === d) first = c;
      f.appendChild(c);
    }
    box.appendChild(f);
    det.appendChild(box);
    if (upto < n) {
      const more = el("button", "", "show all " + n + " positions");
      more.addEventListener("click", function () {
        head.remove(); box.remove(); more.remove();
        drawTrace(det, gold, produced, P, d, true);
      });
      det.appendChild(more);
    }
    if (first) {
      requestAnimationFrame(function () { box.scrollTop = Math.max(0, first.offsetTop - box.offsetTop - 60); });
    }
  }

  drawBins();
  fillFilters();
  applyFilters();
  function show(i) {
    page = Math.max(0, Math.floor(shown.indexOf(i) / PER_PAGE));
    drawList();
    select(i);
  }
  const start = Number(location.hash.slice(1));
  if (location.hash.length > 1 && Number.isInteger(start) && start >= 0 && start < rows.length) show(start);
  else if (shown.length) {  // open on the first wrong answer: what one comes to look at
    const firstWrong = shown.find(function (i) { return !rows[i][C.correct]; });
    show(firstWrong === undefined ? shown[0] : firstWrong);
  }
})();
"""
