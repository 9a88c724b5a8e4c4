"""``open1b-audit site``: write the explorer as a static site (HTML + JS data files + one
script and style sheet), to host anywhere or open from disk.

Which step pages: ``steps`` (default: the first ``DEFAULT_STEPS`` logged steps and every step
with a certificate) plus the genesis; which document pages: every document of those steps,
at most ``max_docs`` (past that a document is listed without a page). A step of more than
``ex.page_windows`` windows also gets its window pages (``step-N-windows-K.html``) and its
statistics page (``step-N-stats.html``). Curves are written whole, in chunks of
``data.CHUNK_STEPS`` steps; the static search covers the written steps' documents, their
text in ``data/search-text-I.js`` files of at most ``search_chunk_bytes`` (a longer
document has a file of its own), which the search page loads. Returns what it wrote:
pages, bytes, the largest file, seconds.

The site holds only what the explorer parsed: a certificate is written as the JSON of the
object read from it (``cert_json``), never copied as a file - a certificate that was a
link to a file of the auditor's machine, or anything else that did not parse as a
certificate object, is a conflict on the coverage page and never published. Every file is
written through an exclusively created temporary file and renamed into place
(``safeio.write_atomic``), so a name planted in OUT is replaced, never written through.
"""
from __future__ import annotations

import json
import os
import time
from importlib import resources
from typing import Any

from open1b.safeio import write_atomic
from open1b_audit.site import render
from open1b_audit.site.data import Explorer, SiteError
from open1b_audit.site.search import search_index

DEFAULT_STEPS = 64
MAX_DOCS = 5000
SEARCH_CHUNK_BYTES = 1 << 20    # the static search's document text: files of at most 1 MiB
ASSETS = ("explorer.js", "explorer.css")


def default_steps(ex: Explorer) -> list[int]:
    certified = {c.get("step") for _, c in ex.certs if isinstance(c, dict)}
    first = set(range(1, min(ex.last, DEFAULT_STEPS) + 1))
    return sorted(s for s in first | certified if isinstance(s, int) and ex.has_step(s))


def run_script(ex: Explorer) -> str:
    d = ex.run_page()
    keep = ("steps", "phases", "skipped", "skipped_tokens", "chunks", "chunk_steps")
    return render.data_script("OPEN1B_RUN", {**{k: d[k] for k in keep},
                                             "overview": ex.overview()})


def search_chunks(texts: list[str], limit: int = SEARCH_CHUNK_BYTES
                  ) -> list[tuple[int, list[str]]]:
    """The documents' texts in consecutive runs of at most ``limit`` bytes of script each
    (a longer document alone): (index of the run's first document, its texts)."""
    out: list[tuple[int, list[str]]] = []
    size = limit
    for i, t in enumerate(texts):
        n = len(render.script_json(t)) + 1
        if size + n > limit and (not out or out[-1][1]):
            out.append((i, []))
            size = 0
        out[-1][1].append(t)
        size += n
    return out


def cert_json(cert: dict[str, Any]) -> bytes:
    """A parsed certificate as the site publishes it (its signature covers the parsed
    object, so it still verifies)."""
    return json.dumps(cert, sort_keys=True, indent=1, ensure_ascii=True).encode()


def published_certs(ex: Explorer) -> dict[str, dict[str, Any]]:
    """File name -> parsed certificate, for every certificate that parsed as an object."""
    return {os.path.basename(p): c for p, c in ex.certs if isinstance(c, dict)}


def asset(name: str) -> bytes:
    return resources.files("open1b_audit.site").joinpath("assets", name).read_bytes()


class _Writer:
    def __init__(self, out: str) -> None:
        self.out, self.files, self.bytes, self.largest = out, 0, 0, ("", 0)

    def __call__(self, rel: str, content: str | bytes) -> None:
        data = content.encode("utf-8") if isinstance(content, str) else content
        path = os.path.join(self.out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data, fsync=False)     # pages: rewritten by the next run
        self.files += 1
        self.bytes += len(data)
        if len(data) > self.largest[1]:
            self.largest = (rel, len(data))


def write_site(ex: Explorer, out: str, steps: list[int] | None = None, progress=None,
               search_chunk_bytes: int = SEARCH_CHUNK_BYTES, max_docs: int = MAX_DOCS
               ) -> dict[str, Any]:
    t0 = time.perf_counter()
    steps = default_steps(ex) if steps is None else steps
    bad = [s for s in steps if not ex.has_step(s)]
    if bad:
        raise SiteError(f"{ex.run} logs steps 1..{ex.last}; cannot write step {bad[0]}")
    os.makedirs(out, exist_ok=True)
    w = _Writer(out)
    for name in ASSETS:
        w(f"assets/{name}", asset(name))
    for name, cert in published_certs(ex).items():
        w(f"certs/{name}", cert_json(cert))
    w("index.html", render.run_page(ex.run_page()))
    w("data/run.js", run_script(ex))
    for i in range(ex.chunks()):
        w(f"data/curves-{i}.js", render.data_script("OPEN1B_CHUNKS", ex.chunk(i), i))
    w("mix.html", render.mix_page(ex.mix_page()))
    written = set(steps) | {0}
    has_step = written.__contains__
    w("coverage.html", render.coverage_page(ex.coverage_page(), has_step))
    # document pages first (the steps' documents in page order, plan only), so that the
    # step and window pages, rendered one at a time, know which documents have a page
    keys: list[str] = []
    for s in steps:
        keys.extend(ex.doc_keys(s))
    keys = list(dict.fromkeys(keys))[:max_docs]
    docs = []
    for k in keys:
        doc = ex.document_page(k)
        docs.append(doc)
        w(f"doc-{k}.html", render.document_page(doc, has_step))
    has_doc = set(keys).__contains__
    w("step-0.html", render.step_page(ex.step_page(0), has_step, has_doc))
    timings = []
    for s in steps:
        t = time.perf_counter()
        d = ex.step_page(s)
        w(f"step-{s}.html", render.step_page(d, has_step, has_doc))
        if d["windows"] is None:                # a large step: its window and statistics pages
            for k in range(d["pages"]):
                w(render.window_page_name(s, k),
                  render.window_page(ex.window_page(s, k), has_doc))
            w(render.stats_page_name(s), render.stats_page(ex.stats_page(s)))
        timings.append(time.perf_counter() - t)
        if progress:
            progress(f"step {s}")
    w("search.html", render.search_page(None, has_step, has_doc))
    meta, texts = search_index(ex, docs, steps)
    chunks = search_chunks(texts, search_chunk_bytes)
    meta["text_chunks"] = [first for first, _ in chunks]
    w("data/search.js", render.data_script("OPEN1B_SEARCH", meta))
    for i, (_, part) in enumerate(chunks):
        w(f"data/search-text-{i}.js", render.data_script("OPEN1B_SEARCH_TEXT", part, i))
    return {"out": out, "steps": steps, "documents": len(docs), "files": w.files,
            "bytes": w.bytes, "largest": {"file": w.largest[0], "bytes": w.largest[1]},
            "step_seconds_max": max(timings, default=0.0),
            "seconds": time.perf_counter() - t0}

