"""HTML of the explorer's pages from ``data.py``'s dicts.

Every string that reaches a page goes through ``e`` (``html.escape`` with quotes) - document
text, doc ids, file names, auditor names alike - and JSON handed to a script goes through
``script_json``, which escapes ``<``, ``>`` and ``&`` as ``\\u003c``-style escapes and
writes only ASCII (so U+2028/2029 too), so no ``</script>`` or ``<!--`` can end or open
anything. Links are relative: the same pages work from disk (file://), from any static
host and from ``serve``. ``has_step(n)`` tells whether step n has a page (a static site
writes some steps; the server renders any logged step).
"""
from __future__ import annotations

import html
import json
from typing import Any, Callable

from open1b_audit.site.data import SERIES

LABELS = {"loss": "training loss", "lr": "learning rate", "grad_norm": "gradient norm (pre-clip)",
          "tokens_per_s": "tokens/s (owner-reported, not hashed)",
          "val_loss": "validation loss"}


def e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def script_json(obj: Any) -> str:
    """JSON safe inside ``<script>``: ASCII only, and no ``<``, ``>``, ``&`` characters."""
    return (json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def data_script(var: str, obj: Any, key: Any = None) -> str:
    """A .js file that stores ``obj`` in ``window[var]`` (or ``window[var][key]``): what a
    page loads with ``<script src>``, which file:// allows where fetch() does not."""
    if key is None:
        return f"window.{var}={script_json(obj)};\n"
    return f"(window.{var}=window.{var}||{{}})[{script_json(key)}]={script_json(obj)};\n"


def trust_banner(t: dict[str, Any] | None) -> str:
    """What a page's chain status and counts rest on (``data.Explorer.trust``): a warning
    for each of the run hash and the trusted keys the explorer was not given."""
    if t is None:
        return ""
    h, k = t.get("expected_run_hash"), t.get("trusted_keys")
    pin = (f'<p class="ok" id="pinned">Pinned: the log ends in the published run hash '
           f'<code>{e(h)}</code> (<code>--expect-run-hash</code>).</p>' if h else
           '<p class="bad" id="unpinned">NOT PINNED: no <code>--expect-run-hash</code> was '
           'given, so this log was not compared with the run hash its owner published; a '
           'truncated or re-chained log also shows "chain OK". Compare the run hash with the '
           'published one, or rebuild this explorer with <code>--expect-run-hash</code>.</p>')
    keys = (f'<p class="ok" id="trusted">Counted: only certificates signed by the {int(k)} '
            f'key(s) of <code>--trusted-keys</code>.</p>' if k is not None else
            '<p class="bad" id="anykey">ANY KEY COUNTS: no <code>--trusted-keys</code> was '
            'given, and anyone can make a key; "distinct auditors" counts keys, not auditors '
            'you trust (three throwaway keys make three).</p>')
    return f'<div class="trust">{pin}{keys}{recipe_banner(t)}</div>'


def recipe_banner(t: dict[str, Any]) -> str:
    """The recipe the run was checked against (``open1b_train.recipe.summary``) and whether
    the announced preset and mix were given (the explorer refuses a run that contradicts
    them, so when given they hold)."""
    rc = t.get("recipe")
    if not rc:
        return ""
    deps = rc.get("departures") or []
    said = (f'<p class="ok" id="recipe">Recipe: preset <code>{e(rc["preset"])}</code> '
            f'(schedule {e(rc["schedule"])}), mix <code>{e(rc["mix_fingerprint"])}</code>, no '
            f'departure from the preset.</p>' if not deps else
            f'<p class="bad" id="recipe">OFF RECIPE: the run departs from the published '
            f'<code>{e(rc["preset"])}</code> preset in '
            + ", ".join(f'<code>{e(d["field"])}</code> ({e(d["preset"])} &rarr; {e(d["run"])})'
                        for d in deps) + '; certificates of it are not counted.</p>')
    missing = [f for f, v in (("--expect-preset", t.get("expected_preset")),
                              ("--expect-mix", t.get("expected_mix"))) if v is None]
    pinned = ('<p class="ok" id="announced">Announced recipe: preset and mix given and held.'
              '</p>' if not missing else
              f'<p class="bad" id="unannounced">NOT CHECKED AGAINST THE ANNOUNCEMENT: no '
              f'{" or ".join(f"<code>{m}</code>" for m in missing)} was given, so this run '
              f'was compared with its own claims only; a planted document in its own mix, or a '
              f'schedule of another preset, would not show here.</p>')
    return said + pinned


def page(title: str, body: str, scripts: tuple[str, ...] = (), query: str = "") -> str:
    tags = "".join(f'<script src="{e(s)}"></script>' for s in scripts)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} - open1b explorer</title>
<link rel="stylesheet" href="assets/explorer.css"></head>
<body><nav><a href="index.html">Run</a> <a href="mix.html">Mix</a>
<a href="coverage.html">Coverage</a>
<form action="search.html" method="get"><input name="q" value="{e(query)}"
 placeholder="step, window, doc id or phrase" aria-label="search"><button>Search</button></form>
</nav><main>
<h1>{e(title)}</h1>
{body}
</main>{tags}</body></html>
"""


def table(rows: list[tuple[Any, ...]], head: tuple[str, ...] | None = None,
          cls: str = "") -> str:
    """Cells are escaped unless wrapped in ``Raw``."""
    def cell(x):
        return x.html if isinstance(x, Raw) else e(x)
    h = "" if head is None else "<tr>" + "".join(f"<th>{e(x)}</th>" for x in head) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{cell(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f'<table class="{e(cls)}">{h}{body}</table>'


class Raw:
    """Already-escaped HTML for ``table``."""

    def __init__(self, html_: str) -> None:
        self.html = html_


def step_link(n: int | None, has_step: Callable[[int], bool], label: str | None = None) -> str:
    if n is None:
        return ""
    text = e(label if label is not None else f"step {n}")
    return f'<a href="step-{int(n)}.html">{text}</a>' if has_step(n) else text


def doc_link(key: str, label: Any, has_doc: Callable[[str], bool]) -> str:
    return f'<a href="doc-{e(key)}.html">{e(label)}</a>' if has_doc(key) else e(label)


def _fmt(x: Any, spec: str = ".6g") -> str:
    return "-" if x is None else format(x, spec)


# ---------------------------------------------------------------------- run

def run_page(d: dict[str, Any]) -> str:
    ch = d["chain"]
    pinned = (d.get("trust") or {}).get("expected_run_hash")
    ok = ("chain OK, ends in the published run hash" if pinned else
          "chain OK (not pinned to a published run hash)")
    status = (f'<span class="ok">{ok}</span>' if ch["ok"] else
              f'<span class="bad">BROKEN at step {e(ch["finding"]["step"])}: '
              f'{e(ch["finding"]["component"])} - {e(ch["finding"]["detail"])}</span>')
    g = d["genesis"]
    rows = [("run", d["run"]), ("run hash", Raw(f'<code>{e(d["run_hash"])}</code>')),
            ("steps logged", f'{d["steps"]:,} of {d["schedule_last_step"]:,} in the schedule'),
            ("chain", Raw(status)), ("mesh (virtual ranks)", f'{d["mesh"][0]}x{d["mesh"][1]}'),
            ("genesis hash", Raw(f'<code>{e(d["genesis_hash"])}</code>'))]
    rows += [(f"genesis {k}", Raw(f"<code>{e(v)}</code>")) for k, v in g.items()]
    rows += [("mix", Raw(f'<a href="mix.html">{e(d["mix_name"])}</a>')),
             ("certificates", Raw(f'{d["coverage"]["certificates"]} read, '
                                  f'{d["coverage"]["covered"]} steps certified by '
                                  f'{d["coverage"]["keys_counted"]} counted key(s), '
                                  f'{d["coverage"]["conflicts"]} conflicts - '
                                  f'<a href="coverage.html">coverage map</a>'))]
    phases = table([(p["phase"], p["batch"], Raw(f'{p["first_step"]}..{p["last_step"]}'),
                     f'{p["tokens_before"]:,}') for p in d["phases"]],
                   ("phase", "batch (windows)", "steps", "tokens before"))
    skipped = ", ".join(str(s) for s in d["skipped"][:200]) or "none"
    charts = "".join(f'<figure class="chart" data-series="{k}"><figcaption>{e(LABELS[k])}'
                     f'</figcaption></figure>' for k in SERIES)
    body = f"""{trust_banner(d.get("trust"))}{table(rows, cls="kv")}
<h2>Curves</h2>
<p class="note">Every value is decoded from the step's hashed <code>scalars</code> (float32
bits, hex-float LR), except tokens/s, which the owner reports unhashed. Grey lines: batch-ramp
phase changes; red marks: skipped updates. The overview keeps each bucket's min and max.</p>
<div class="controls">x axis: <label><input type="radio" name="x" value="step" checked> step</label>
<label><input type="radio" name="x" value="tokens"> tokens</label>
<form id="zoom">steps <input name="a" size="7"> to <input name="b" size="7">
<button>zoom (full resolution)</button> <button type="reset">overview</button></form></div>
<div id="charts">{charts}</div>
<h2>Batch-ramp phases</h2>{phases}
<h2>Skipped updates</h2><p>{e(skipped)}</p>
<h2>Steps</h2><form action="search.html" method="get">step <input name="q" size="8">
<button>open</button></form>"""
    return page(f"run {d['run_hash'][:16]}...", body,
                ("data/run.js", "assets/explorer.js"))


# ---------------------------------------------------------------------- step

def step_page(d: dict[str, Any], has_step, has_doc) -> str:
    s = d["step"]
    back, forth = "\u2190 previous", "next \u2192"
    nav = (f'<p class="pager">{step_link(d["previous_step"], has_step, back)}'
           f' | {step_link(d["next_step"], has_step, forth)}</p>')
    head = [("hash", Raw(f'<code>{e(d["hash"])}</code>')),
            ("prev", Raw(f'<code>{e(d["prev"])}</code>'))]
    if s == 0:
        head += [(f"genesis {k}", Raw(f"<code>{e(v)}</code>")) for k, v in d["genesis"].items()]
        return page("step 0 (genesis)", trust_banner(d.get("trust")) + nav
                    + table(head, cls="kv"))
    sc = d["scalars"]
    head += [("loss", _fmt(sc["loss"])), ("learning rate", _fmt(sc["lr"], ".8g")),
             ("gradient norm", _fmt(sc["grad_norm"])),
             ("update", "SKIPPED" if sc["skipped"] else "applied"),
             ("loss spike", "yes" if sc["spike"] else "no"),
             ("tokens", f'{sc["tokens"]:,}' if sc["tokens"] is not None else "-"),
             ("phase / batch", f'{d["phase"]} / {d["batch"]} windows'),
             ("windows", f'{d["windows_range"][0]:,} .. {d["windows_range"][1] - 1:,}'),
             ("tokens before / after", f'{d["tokens_before"]:,} / {d["tokens_after"]:,}'),
             ("owner-reported (not hashed)",
              f'{_fmt(d["owner_reported"]["seconds"], ".2f")} s, '
              f'{_fmt(d["owner_reported"]["tokens_per_s"], ",.1f")} tokens/s')]
    if sc.get("val_loss") is not None:
        head.insert(3, ("validation loss", _fmt(sc["val_loss"])))
    comps = table([(k, Raw(f"<code>{e(v)}</code>")) for k, v in (d["components"] or {}).items()],
                  ("component", "digest"), "kv")
    certs = (table([(c["auditor"], Raw(f'<code>{e((c["public_key"] or "")[:16])}</code>'),
                    c["signature"], c.get("counted"), c["verdict"], c["backend"],
                    c["replayed_from"],
                    Raw(f'<a href="certs/{e(c["file"])}">{e(c["file"])}</a>'))
                   for c in d["certificates"]],
                  ("auditor", "public key", "signature", "counted", "verdict", "backend",
                   "replayed from", "certificate")) if d["certificates"] else
        "<p>No certificate of this step was given.</p>")
    warn = f'<p class="bad">{e(d["loss_mismatch"])}</p>' if d.get("loss_mismatch") else ""
    title = f"<h2>Windows ({d['batch']:,}, mesh order: virtual rank, micro-batch)</h2>"
    if d["windows"] is not None:                 # one page holds the whole step
        rest = ("<h2>Batch statistics</h2>" + stats_html(d["stats"]) + title + warn
                + "".join(window_section(w, has_doc) for w in d["windows"]))
    else:
        pages = " ".join(f'<a href="{window_page_name(s, k)}">{k + 1}</a>'
                         for k in range(d["pages"]))
        rows = [(Raw(f'<a href="{window_page_name(s, x["page"])}#w{x["window"]}">'
                     f'{x["window"]}</a>'), x["rank"], x["micro_batch"],
                 _fmt(x["loss"], ".4f"), x["documents"]) for x in d["index"]]
        rest = (f'<h2>Batch statistics</h2><p>On <a href="{stats_page_name(s)}">their own '
                f'page</a> (<code>stream-at --stats</code> reads all '
                f'{d["tokens_after"] - d["tokens_before"]:,} tokens of the step).</p>'
                + title + warn + f'<p class="pager">documents and decoded text, '
                f'{d["page_windows"]} windows a page: {pages}</p>'
                + table(rows, ("window", "virtual rank", "micro-batch", "loss", "documents"),
                        "index"))
    body = (trust_banner(d.get("trust")) + nav + table(head, cls="kv")
            + "<h2>Component digests</h2>" + comps
            + "<h2>Certificates</h2>" + certs + rest + nav)
    return page(f"step {s}", body)


def window_page_name(s: int, k: int) -> str:
    return f"step-{int(s)}-windows-{int(k)}.html"


def stats_page_name(s: int) -> str:
    return f"step-{int(s)}-stats.html"


def window_section(w: dict[str, Any], has_doc) -> str:
    """One window: rank, micro-batch, loss, sha256, and its documents with their text."""
    docs = []
    for g in w["documents"]:
        span = f'[{g["tokens"][0]},{g["tokens"][1]})' + ("+sep" if g["separator"] else "")
        text = ""
        if g["text"] is not None:
            text = f'<details><summary>text</summary><pre class="doc">{e(g["text"])}</pre></details>'
        elif g["text_omitted"]:
            text = '<span class="note">text on the document page (page budget)</span>'
        docs.append((g["source"], g["shard_path"], g["row"],
                     Raw(doc_link(g["doc_key"], g["doc_id"], has_doc)), span, Raw(text)))
    return (f'<section class="window" id="w{w["window"]}" data-window="{w["window"]}">'
            f'<h3>window {w["window"]} - rank {w["rank"]}, micro-batch '
            f'{e(w["micro_batch"])} - loss {_fmt(w["loss"], ".4f")}</h3>'
            f'<p class="note">sha256 <code>{e(w["sha256"])}</code></p>'
            + table(docs, ("source", "shard", "row", "provenance id", "tokens", ""), "docs")
            + "</section>")


def window_page(d: dict[str, Any], has_doc) -> str:
    """Page k of a large step's windows (``data.Explorer.window_page``)."""
    s, k, n = d["step"], d["page"], d["pages"]
    links = [f'<a href="step-{int(s)}.html">step {int(s)}</a>']
    if k > 0:
        links.append(f'<a href="{window_page_name(s, k - 1)}">\u2190 windows page {k}</a>')
    if k + 1 < n:
        links.append(f'<a href="{window_page_name(s, k + 1)}">windows page {k + 2} '
                     f'\u2192</a>')
    nav = f'<p class="pager">{" | ".join(links)}</p>'
    a, b = d["mesh_range"]
    first, last = d["windows"][0], d["windows"][-1]
    body = (nav + f'<p>Windows {a + 1:,} to {b:,} of the step\'s {d["batch"]:,} in mesh order: '
            f'rank {first["rank"]} micro-batch {e(first["micro_batch"])} to rank '
            f'{last["rank"]} micro-batch {e(last["micro_batch"])}; step hash '
            f'<code>{e(d["hash"])}</code>.</p>'
            + "".join(window_section(w, has_doc) for w in d["windows"]) + nav)
    return page(f"step {s}, windows page {k + 1} of {n}", body)


def stats_page(d: dict[str, Any]) -> str:
    """A large step's batch statistics (``data.Explorer.stats_page``)."""
    s = d["step"]
    nav = f'<p class="pager"><a href="step-{int(s)}.html">step {int(s)}</a></p>'
    body = (nav + f'<p>{d["batch"]:,} windows, {d["tokens"]:,} tokens; step hash '
            f'<code>{e(d["hash"])}</code>.</p>' + stats_html(d["stats"]) + nav)
    return page(f"step {s}: batch statistics", body)


def stats_html(st: dict[str, Any]) -> str:
    """What ``stream-at --stats`` prints, as tables (definitions in docs/CLI.md)."""
    rows = [("windows", len(st["windows"])), ("tokens (separators included)", f'{st["tokens"]:,}'),
            ("unique-token ratio", f'{st["unique_ratio"]:.3f} ({st["distinct"]:,} distinct ids)'),
            ("separators", st["separators"]),
            ("redrawn documents", len(st["redrawn"])),
            ("spanning draws", f'{st["spanning_draws"]} (the widest covers {st["longest_span"]})')]
    run = st["longest_run"]
    if run["token"] is not None:
        rows.append(("longest run", f'{run["length"]} x id {run["token"]} (window '
                                    f'{run["window"]}, offset {run["offset"]})'))
    rep = st["longest_repeat"]
    where = "" if rep["window"] is None else (f' (window {rep["window"]}, offsets '
                                             f'{rep["offsets"][0]} and {rep["offsets"][1]})')
    rows.append(("longest repeat", f'{rep["length"]} tokens{where}'))
    src = table([(x["source"], f'{x["tokens"]:,}', f'{x["share"]:.1%}', x["documents"])
                 for x in st["sources"]], ("source", "tokens", "share", "documents"))
    return table(rows, cls="kv") + src


# ---------------------------------------------------------------------- document

def document_page(d: dict[str, Any], has_step) -> str:
    rows = [("source", d["source"]), ("shard", d["shard_path"]), ("row", d["doc"]),
            ("provenance id (doc_id)", d["doc_id"]), ("upstream input", d["input"]),
            ("row in the input", d["input_row"]), ("tokens", f'{d["length"]:,}')]
    occ = table([(Raw(step_link(o["step"], has_step)), o["window"], o["rank"], o["epoch"],
                  f'[{o["doc_start"]},{o["doc_end"]})' + ("+sep" if o["separator"] else ""))
                 for o in d["occurrences"]],
                ("step", "window", "virtual rank", "epoch", "document tokens"), "occ")
    clip = ("" if d["text_chars"] <= len(d["text"]) else
            f'<p class="note">first {len(d["text"]):,} of {d["text_chars"]:,} characters</p>')
    body = (table(rows, cls="kv")
            + f'<h2>Trained on in {len(d["steps"])} step(s) of steps 1..{d["last_step"]}</h2>'
            + occ + "<h2>Text</h2>" + clip + f'<pre class="doc" id="text">{e(d["text"])}</pre>')
    return page(f"document {d['doc_id']}", body)


# ---------------------------------------------------------------------- coverage

def coverage_svg(steps: int, counts: dict[int, int], conflict_steps: set[int],
                 cols: int | None = None, cell: int = 6) -> str:
    """Steps as a grid, one run-length rect per row and colour: class c0 (uncertified),
    c1, c2, c3 (3+ distinct auditors), conflict."""
    cols = cols or (50 if steps <= 2_000 else 200 if steps <= 20_000 else 400)
    cell = cell if steps <= 2_000 else 4 if steps <= 20_000 else 2
    rows = -(-steps // cols) if steps else 0

    def cls(s):
        if s in conflict_steps:
            return "conflict"
        return f"c{min(3, counts.get(s, 0))}"
    rects = []
    for r in range(rows):
        a = r * cols + 1
        b = min(steps, a + cols - 1)
        s = a
        while s <= b:
            c, t = cls(s), s
            while t + 1 <= b and cls(t + 1) == c:
                t += 1
            n = counts.get(s, 0)
            title = f"step {s}" if s == t else f"steps {s}..{t}"
            rects.append(f'<rect class="{c}" data-first="{s}" data-last="{t}" '
                         f'x="{(s - a) * cell}" y="{r * cell}" width="{(t - s + 1) * cell}" '
                         f'height="{cell}"><title>{title}: {n if c != "conflict" else "conflict"}'
                         f'{"" if c == "conflict" else " auditor(s)"}</title></rect>')
            s = t + 1
    return (f'<svg class="coverage" width="{cols * cell}" height="{rows * cell}" '
            f'viewBox="0 0 {cols * cell} {rows * cell}" role="img">{"".join(rects)}</svg>')


def coverage_page(d: dict[str, Any], has_step) -> str:
    conflict_steps = {c["step"] for c in d["conflicts"] if isinstance(c.get("step"), int)}
    legend = ('<p class="legend"><span class="c0"></span> not certified <span class="c1"></span>'
              ' 1 counted key <span class="c2"></span> 2 <span class="c3"></span> 3+ '
              '<span class="conflict"></span> conflict</p>')
    certified = table([(Raw(step_link(s, has_step)), n) for s, n in sorted(d["counts"].items())][:2000],
                      ("step", "distinct counted keys"))
    conflicts = table([(Raw(step_link(c["step"], has_step) if isinstance(c.get("step"), int)
                            else e(c.get("step"))), c.get("auditor"), c["certificate"], c["why"])
                       for c in d["conflicts"]], ("step", "auditor", "certificate", "why"))
    t = d.get("trust") or {}
    whose = ("of any key (no --trusted-keys)" if t.get("trusted_keys") is None
             else f'of the {t["trusted_keys"]} trusted key(s)')
    listed = table([(Raw(step_link(c["step"], has_step)), kind, c["certificate"])
                    for kind in ("unsigned", "untrusted") for c in d.get(kind, [])]
                   + [(Raw(step_link(c["step"], has_step)), f"off recipe: {c['why']}",
                       c["certificate"]) for c in d.get("off_recipe", [])],
                   ("step", "not counted", "certificate"))
    body = (trust_banner(d.get("trust"))
            + f'<p>{d["covered"]:,} of {d["steps"]:,} steps certified by at least one signing '
            f'key {e(whose)} ({d["certificates"]} certificates, {len(d["auditors"])} distinct '
            f'key(s) counted, {len(d.get("unsigned", []))} unsigned and '
            f'{len(d.get("untrusted", []))} untrusted not counted, {len(d["conflicts"])} '
            f'conflicts), counted by <code>open1b-audit coverage</code>.'
            f'</p>' + legend + coverage_svg(d["steps"], d["counts"], conflict_steps)
            + "<h2>Conflicts</h2>" + (conflicts if d["conflicts"] else "<p>none</p>")
            + "<h2>Not counted</h2>"
            + (listed if d.get("unsigned") or d.get("untrusted") or d.get("off_recipe")
               else "<p>none</p>")
            + "<h2>Certified steps</h2>" + certified
            + "<h2>Auditors (public keys)</h2><ul>"
            + "".join(f"<li><code>{e(a)}</code></li>" for a in d["auditors"]) + "</ul>")
    return page("coverage", body)


# ---------------------------------------------------------------------- mix

def mix_page(d: dict[str, Any]) -> str:
    rows = [("name", d["name"]), ("fingerprint", Raw(f'<code>{e(d["fingerprint"])}</code>')),
            ("builder", d["builder"]), ("seed (mix / run)", f'{d["seed"]} / {d["run_seed"]}'),
            ("window tokens", d["window"]), ("vocabulary", d["vocab_size"])]
    if d.get("totals"):
        rows += [(f"total {k}", v) for k, v in d["totals"].items()]
    src = table([(x["name"], x["format"], f'{x["documents"]:,}', f'{x["tokens"]:,}',
                  _fmt(x["target_share"], ".1%"), _fmt(x["token_share"], ".1%"), x["shards"],
                  x["read"], x["kept"],
                  ", ".join(f"{k}={v}" for k, v in sorted(x["dropped"].items())) or "-")
                 for x in d["sources"]],
                ("source", "format", "documents", "tokens", "target share", "token share",
                 "shards", "read", "kept", "dropped by reason"))
    sched = d.get("schedule") or {}
    phases = table([(p.get("start_tokens"), p.get("batch_sequences"))
                    for p in sched.get("phases", [])], ("from token", "batch (windows)"))
    rest = table([(k, v) for k, v in sched.items() if k != "phases"], cls="kv")
    body = (table(rows, cls="kv") + "<h2>Sources</h2>" + src + "<h2>Schedule</h2>" + rest
            + phases)
    return page(f"mix {d['name']}", body)


# ---------------------------------------------------------------------- search

def search_page(result: dict[str, Any] | None, has_step, has_doc, query: str = "") -> str:
    """With ``result`` (served) the answer is on the page; without, the bundled script
    answers from ``data/search.js`` (static)."""
    if result is None:
        body = ('<p class="note">Searches the steps and documents this site was written '
                'with: a step or window number, a document id, or a phrase (exact, '
                'case-sensitive, as <code>open1b-data provenance --text</code>).</p>'
                '<div id="results"></div>')
        return page("search", body, ("data/search.js", "assets/explorer.js"), query)
    parts = []
    if result["step"] is not None:
        parts.append(f'<p class="hit">{step_link(result["step"], has_step)}</p>')
    if result["window"] is not None:
        w = result["window"]
        parts.append(f'<p class="hit">window {w["window"]} is in '
                     f'{step_link(w["step"], has_step)}</p>')
    for d in result["documents"]:
        parts.append(f'<p class="hit doc">{doc_link(d["doc_key"], d["doc_id"], has_doc)} '
                     f'({e(d["source"])}): steps '
                     + ", ".join(step_link(s, has_step, str(s)) for s in d["steps"]) + "</p>")
    if result["steps"] and not result["documents"]:
        parts.append(f'<p>no document matches in steps {result["steps"][0]}..'
                     f'{result["steps"][1]}</p>')
    if result["steps"]:
        parts.append(f'<p class="note">searched steps {result["steps"][0]}..'
                     f'{result["steps"][1]}</p>')
    body = '<div id="results">' + ("".join(parts) or "<p>nothing found</p>") + "</div>"
    return page("search", body, query=query)


def error_page(msg: str) -> str:
    return page("not available", f'<p class="bad">{e(msg)}</p>')
