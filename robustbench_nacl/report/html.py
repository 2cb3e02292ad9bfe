"""The leaderboard as one static HTML page: opens from disk, needs no network, no CDN, no build step.

CSS and JavaScript are inline; the table data is embedded as JSON in a ``<script
type="application/json">`` block (``<``, ``>`` and ``&`` escaped, so no row text can close the
script) and rendered with ``textContent`` only, so no row text is ever parsed as HTML. Plots are
``<img>`` tags with paths relative to the page, so the output directory can be moved as a whole.

Hooks for tests and scripts: rows are ``tr.entry[data-id]`` (stable ids), cells carry ``data-col``
and, when numeric, ``data-value``; provenance rows are ``tr.prov#prov-<id>``; ``body[data-images-loaded]``
counts the plots that finished loading.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from .aggregate import Entry
from .compare import table_delta
from .context import Context, distinct, provenance
from .export import display_order
from .fmt import MISSING, fmt_diff, fmt_interval, fmt_points, p_label, pct, round6
from .stats import Stat

_CSS = """
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --mute: #57606a; --line: #d0d7de;
  --head: #f6f8fa; --hi: #fff8c5; --ctrl: #eef1f4; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --mute: #8b949e;
  --line: #30363d; --head: #161b22; --hi: #3b2e00; --ctrl: #1c2128; } }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0 auto; padding: 1.5rem; max-width: 1400px; }
h1 { font-size: 1.5rem; margin: 0 0 .5rem; }
.lead { color: var(--mute); }
ul.legend { padding-left: 1.2rem; } ul.legend li { margin: .15rem 0; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.controls { display: flex; gap: 1rem; align-items: center; margin: 1rem 0 .5rem; flex-wrap: wrap; }
.controls input, .controls select { font: inherit; padding: .25rem .4rem; }
#count { color: var(--mute); }
/* the table fits the 1400 px page: headers and long text wrap, intervals sit under their value */
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .35rem; text-align: left;
  vertical-align: top; }
th { background: var(--head); position: sticky; top: 0; cursor: pointer; user-select: none;
  font-weight: 600; max-width: 9rem; }
th[aria-sort=ascending]::after { content: " ▲"; } th[aria-sort=descending]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td .ci { display: block; font-size: 11px; color: var(--mute); }
td[data-col=setting], td[data-col=dataset] { white-space: nowrap; }
td[data-col=key_params], td[data-col=differs], td[data-col=protocol] { max-width: 14rem;
  overflow-wrap: anywhere; font-size: 12px; }
tr.control td { background: var(--ctrl); }
tr.flagged td[data-col=sanity] { background: var(--hi); }
button.prov-toggle { border: 0; background: none; cursor: pointer; font: inherit; color: var(--mute);
  padding: 0 .3rem 0 0; }
tr.prov td { background: var(--head); }
tr.prov dl { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: .3rem 0; }
tr.prov dt { color: var(--mute); } tr.prov dd { margin: 0; word-break: break-all; }
table.static th { cursor: auto; position: static; } table.static td { font-variant-numeric: tabular-nums; }
#label-free { margin-top: 2rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid var(--line); background: #fff; }
figcaption { color: var(--mute); }
"""

_JS = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("leaderboard-data").textContent);
  const cols = data.columns;
  const state = { key: null, dir: 1, filter: "", setting: "all", open: new Set() };
  const body = document.getElementById("lb-body");
  const count = document.getElementById("count");

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function rowText(r) {
    return cols.map(c => (r.cells[c.key] ? r.cells[c.key].text : "")).join(" ").toLowerCase();
  }
  function visible(r) {
    if (state.setting !== "all" && r.setting !== state.setting) return false;
    return !state.filter || rowText(r).includes(state.filter);
  }
  function compare(a, b) {
    const col = cols.find(c => c.key === state.key);
    const ca = a.r.cells[state.key] || {}, cb = b.r.cells[state.key] || {};
    if (col.numeric) {
      const va = ca.value, vb = cb.value;
      // missing values stay at the bottom in both directions
      if (va == null || vb == null) return (va == null) - (vb == null) || a.i - b.i;
      return state.dir * (va - vb) || a.i - b.i;
    }
    const ta = String(ca.text || ""), tb = String(cb.text || "");
    return state.dir * ta.localeCompare(tb, undefined, { numeric: true }) || a.i - b.i;
  }
  function provRow(r) {
    const p = r.provenance;
    const tr = el("tr", { class: "prov", id: "prov-" + r.id, "data-prov-for": r.id });
    const td = el("td", { colspan: String(cols.length) });
    const dl = el("dl");
    const items = [
      ["checkpoints", p.checkpoints.map(c => c.id + "  sha256 " + c.sha256).join("\n")],
      ["suite", p.suites.map(s => s.name + "  sha256 " + s.sha256).join("\n")],
      ["recipe id", p.recipe_id],
      ["protocol id", p.protocol_id],
      ["training seeds", p.train_seeds.join(", ")],
      ["evaluation seeds", p.eval_seeds.join(", ")],
      ["n examples", p.n_examples.join(", ")],
      ["versions", Object.entries(p.versions).map(([k, v]) => k + " " + v.join("/")).join(", ")],
      ["devices", p.devices.join("; ")],
      ["result rows", p.n_rows + (p.created.length ? "  (created " + p.created.join(" … ") + ")" : "")],
      ["sanity", p.sanity_failed.length ? p.sanity_failed.map(f => f.checkpoint_id + " seed " + f.seed +
        ", " + f.attack + " " + f.norm + " eps " + f.eps + ": failed " + f.failed.join(", ")).join("\n")
        : "all checks passed"],
    ];
    for (const [k, v] of items) {
      dl.appendChild(el("dt", {}, k));
      const dd = el("dd", { "data-field": k.replace(/ /g, "-") }, v);
      dd.style.whiteSpace = "pre-line";
      dl.appendChild(dd);
    }
    td.appendChild(dl);
    tr.appendChild(td);
    return tr;
  }
  function render() {
    let items = data.rows.map((r, i) => ({ r, i })).filter(x => visible(x.r));
    if (state.key) items.sort(compare);
    body.replaceChildren();
    for (const { r } of items) {
      const cls = ["entry"];
      if (r.control) cls.push("control");
      if (r.cells.sanity.text !== "ok") cls.push("flagged");
      const attrs = { class: cls.join(" "), "data-id": r.id, "data-setting": r.setting, id: "row-" + r.id };
      const tr = el("tr", attrs);
      cols.forEach((c, j) => {
        const cell = r.cells[c.key] || { text: "" };
        const td = el("td", { "data-col": c.key, class: c.numeric ? "num" : "" });
        if (cell.value != null) td.dataset.value = String(cell.value);
        if (cell.title) td.title = cell.title;
        if (j === 0) {
          const open = state.open.has(r.id);
          const btn = el("button", { class: "prov-toggle", "aria-expanded": String(open), "data-id": r.id,
            title: "provenance" }, open ? "▾" : "▸");
          btn.addEventListener("click", () => {
            if (open) state.open.delete(r.id); else state.open.add(r.id);
            render();
          });
          td.appendChild(btn);
          td.appendChild(document.createTextNode(cell.text));
        } else {
          td.textContent = cell.text;
        }
        if (cell.sub) td.appendChild(el("span", { class: "ci" }, cell.sub));
        tr.appendChild(td);
      });
      body.appendChild(tr);
      if (state.open.has(r.id)) body.appendChild(provRow(r));
    }
    count.textContent = items.length + " of " + data.rows.length + " entries";
    document.querySelectorAll("#lb thead th").forEach(th => {
      const dir = state.dir > 0 ? "ascending" : "descending";
      th.setAttribute("aria-sort", th.dataset.key === state.key ? dir : "none");
    });
  }
  const headRow = document.getElementById("lb-head");
  for (const c of cols) {
    const th = el("th", { "data-key": c.key, "data-numeric": String(c.numeric), scope: "col" }, c.label);
    th.addEventListener("click", () => {
      state.dir = state.key === c.key ? -state.dir : 1;
      state.key = c.key;
      render();
    });
    headRow.appendChild(th);
  }
  const select = document.getElementById("setting");
  for (const s of new Set(data.rows.map(r => r.setting))) select.appendChild(el("option", { value: s }, s));
  select.addEventListener("change", () => { state.setting = select.value; render(); });
  document.getElementById("filter").addEventListener("input", e => {
    state.filter = e.target.value.trim().toLowerCase();
    render();
  });
  render();

  // images: count the plots that finished loading (the browser test waits on this)
  let loaded = 0;
  const imgs = Array.from(document.querySelectorAll("img.plot"));
  document.body.dataset.imagesTotal = String(imgs.length);
  document.body.dataset.imagesLoaded = "0";
  const done = () => { loaded += 1; document.body.dataset.imagesLoaded = String(loaded); };
  for (const img of imgs) {
    if (img.complete && img.naturalWidth > 0) done();
    else img.addEventListener("load", done, { once: true });
  }
})();
"""


def embed_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no '</script>', '<!--' or entity can appear in it."""
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline_md(text: str) -> str:
    # the legend is written for Markdown; only `code` spans need translating
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))


def static_section(md: list[str]) -> str:
    """Static HTML of a generated Markdown section made of headings, pipe tables and paragraphs (the
    label-free section: no sorting needed, so no script; the text is LEADERBOARD.md's, escaped)."""
    out: list[str] = []
    table: list[list[str]] = []

    def cells(line: str) -> list[str]:
        return [_inline_md(c.strip()) for c in line.strip().strip("|").split("|")]

    def flush() -> None:
        if table:
            head = "".join(f'<th scope="col">{c}</th>' for c in table[0])
            body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in table[1:])
            out.append(f'<table class="static"><thead><tr>{head}</tr></thead>')
            out.append(f"<tbody>\n{body}\n</tbody></table>")
            table.clear()

    for line in md:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):  # the separator line carries nothing
                table.append(cells(line))
            continue
        flush()
        if line.startswith("### "):
            out.append(f"<h3>{_inline_md(line[4:])}</h3>")
        elif line.startswith("## "):
            out.append(f"<h2>{_inline_md(line[3:])}</h2>")
        elif line.strip():
            out.append(f"<p>{_inline_md(line)}</p>")
    flush()
    return "\n".join(out)


def render_page(
    *,
    title: str,
    lead: str,
    legend: list[tuple[str, str]],
    columns: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    images: list[tuple[str, str]],
    extra: str = "",
) -> str:
    """The whole page; ``images``: (relative path, caption); ``columns`` and ``rows``: :func:`html_table`;
    ``extra``: static HTML after the table (:func:`static_section`)."""
    items = "\n".join(f"<li><b>{html.escape(k)}</b>: {_inline_md(v)}</li>" for k, v in legend)
    figures = "\n".join(
        f'<figure><img class="plot" src="{html.escape(src)}" alt="{html.escape(cap)}">'
        f"<figcaption>{html.escape(cap)}</figcaption></figure>"
        for src, cap in images
    )
    data = embed_json({"columns": columns, "rows": rows})
    section = f'<section id="label-free">\n{extra}\n</section>' if extra else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="lead">{_inline_md(lead)}</p>
<section id="figures">
{figures}
</section>
<ul class="legend">
{items}
</ul>
<noscript><p>This page needs JavaScript for its table; LEADERBOARD.md and results.csv beside it hold the same
numbers.</p></noscript>
<div class="controls">
<label>filter <input id="filter" type="search" placeholder="loss, parameters, dataset…"
  autocomplete="off"></label>
<label>setting <select id="setting"><option value="all">all</option></select></label>
<span id="count"></span>
</div>
<table id="lb">
<thead><tr id="lb-head"></tr></thead>
<tbody id="lb-body"></tbody>
</table>
<p class="lead">Click a column header to sort (again to reverse); click ▸ for a row's provenance.</p>
{section}
<script type="application/json" id="leaderboard-data">{data}</script>
<script>{_JS}</script>
</body>
</html>
"""


# ============ the table's data ============


def html_columns(ctx: Context) -> list[dict[str, Any]]:
    """The page's columns; "differs", "protocol" and the Δ column only when some entry needs them."""
    ranked = distinct(t.rank_label for t in ctx.tables)
    metrics = {
        "clean": "clean",
        "rank_metric": "ranked by: " + (ranked[0] if len(ranked) == 1 else "the table's metric"),
        **({"delta": f"Δ vs {ctx.baseline_family} (p)"} if ctx.baselines else {}),
        "fgsm": f"FGSM@{ctx.eps_text}",
        "pgd": f"PGD@{ctx.eps_text}",
    }
    optional = [
        ("differs", "differs", any(e.recipe.differs for e in ctx.entries)),
        ("protocol", "protocol", any(t.note for t in ctx.tables)),
    ]
    return [
        {"key": "rank", "label": "rank", "numeric": True},
        {"key": "setting", "label": "setting", "numeric": False},
        {"key": "dataset", "label": "dataset", "numeric": False},
        {"key": "family", "label": "loss family", "numeric": False},
        {"key": "key_params", "label": "key parameters", "numeric": False},
        *({"key": k, "label": label, "numeric": False} for k, label, on in optional if on),
        {"key": "encoder", "label": "encoder", "numeric": False},
        {"key": "pretrain", "label": "pretrained on", "numeric": False},
        {"key": "n", "label": "n", "numeric": True},
        *({"key": k, "label": v, "numeric": True} for k, v in metrics.items()),
        {"key": "sanity", "label": "sanity", "numeric": False},
    ]


def html_table(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Columns and rows for the HTML page: every cell has display text and, if numeric, a sort value."""
    note = {id(e): t.note for t in ctx.tables for e in t.entries}
    rows = []
    for e in display_order(ctx):
        n = len(e.runs)
        table = ctx.table_of(e)
        metric = table.rank_metric
        stats = {"clean": e.stat("clean"), "rank_metric": e.stat(metric), "fgsm": e.stat(ctx.fgsm)}
        stats["pgd"] = e.stat(ctx.pgd)
        fails = distinct(c for _, checks in e.failures() for c in checks)
        cells = {
            "rank": {"text": str(e.rank), "value": e.rank},
            "setting": {"text": e.setting},
            "dataset": {"text": e.dataset},
            "family": {"text": e.recipe.family},
            "key_params": {"text": e.recipe.key_params or MISSING},
            "differs": {"text": e.recipe.differs or MISSING},
            "protocol": {"text": note[id(e)] or MISSING},
            "encoder": {"text": e.recipe.encoder},
            "pretrain": {"text": e.recipe.pretrain_dataset},
            "n": {"text": str(n), "value": n},
            **{k: _stat_cell(s, n) for k, s in stats.items()},
            "delta": _delta_cell(ctx, e),
            "sanity": {"text": "⚠ " + ", ".join(fails) if fails else "ok"},
        }
        cells["rank_metric"]["title"] = table.rank_label
        entry = {"id": e.uid, "setting": e.setting, "control": e.recipe.control, "cells": cells}
        rows.append(entry | {"provenance": _entry_provenance(e)})
    return html_columns(ctx), rows


def _stat_cell(s: Stat, n_runs: int) -> dict[str, Any]:
    """The mean (and ``(n=k)``), its interval on a line below, the mean as the sort value."""
    text = pct(s.mean) + (f" (n={s.n})" if s.mean is not None and s.n != n_runs else "")
    cell: dict[str, Any] = {"text": text, "value": round6(s.mean)}
    if s.lo is not None:
        cell["sub"] = fmt_interval(s)
        cell["title"] = (
            f"95 % interval: {'t over seeds' if s.interval == 't' else 'Wilson over test examples'}"
        )
    return cell


def _delta_cell(ctx: Context, e: Entry) -> dict[str, Any]:
    """The ranking metric minus the baseline's (points), the Holm-adjusted p below it."""
    c = table_delta(ctx, ctx.table_of(e), e)
    if c is None or isinstance(c, str):
        return {"text": MISSING if c is None else c}
    cell: dict[str, Any] = {"text": fmt_points(c.diff), "value": round6(c.diff), "sub": p_label(c.p_holm)}
    note = f"; {c.note}" if c.note else ""
    cell["title"] = f"{fmt_diff(c.diff, c.lo, c.hi)} points, paired {c.pairing}{note}"
    return cell


def _entry_provenance(e: Entry) -> dict[str, Any]:
    p = provenance(e.rows)
    created = distinct(r.get("created_at") for r in e.rows)
    return {
        "checkpoints": [{"id": c, "sha256": s} for c, s in p["checkpoints"]],
        "suites": [{"name": n, "sha256": s} for n, s in p["suites"]],
        "recipe_id": e.recipe.recipe_id,
        "protocol_id": e.protocol_id,
        "train_seeds": p["train_seeds"],
        "eval_seeds": p["eval_seeds"],
        "n_examples": p["n_examples"],
        "versions": p["versions"],
        "devices": p["devices"],
        "n_rows": len(e.rows),
        "created": [created[0], created[-1]] if created else [],
        "sanity_failed": [
            {
                "checkpoint_id": r["checkpoint_id"],
                "seed": r.get("seed"),
                "attack": r["attack"],
                "norm": r["norm"],
                "eps": r["eps"],
                "failed": checks,
            }
            for r, checks in e.failures()
        ],
    }
