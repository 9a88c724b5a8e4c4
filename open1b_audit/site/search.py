"""The explorer's search: a step or window number, a document id or a phrase, served
(``search``); and what the static site's search page searches in the browser
(``search_index``). Both over an ``Explorer`` (``data.py``)."""
from __future__ import annotations

from typing import Any

from open1b_audit.errors import SiteError
from open1b_audit.site.data import Explorer, doc_key

PHRASE_STEPS = 256          # a served phrase search decodes at most this many steps' documents


def search(ex: Explorer, q: str, steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """A step or window number, a document id, or a phrase (served search)."""
    from open1b_data.errors import StreamError
    from open1b_data.explore import provenance

    q = q.strip()
    out: dict[str, Any] = {"query": q, "step": None, "window": None, "documents": [],
                           "steps": None}
    if not q:
        return out
    if q.isdigit():
        n = int(q)
        out["step"] = n if ex.has_step(n) else None
        if n < ex.sched.total_windows:
            out["window"] = {"window": n, "step": ex.sched.step_of_window(n)}
        return out
    a, b = steps or (1, ex.last)
    try:
        rep = provenance.report(ex.mix, doc_id=q, steps=(a, b), world=ex.world,
                                seed=ex.plan.seed)
        out["steps"] = [a, b]
    except StreamError:
        if steps is None:
            a, b = max(1, ex.last - PHRASE_STEPS + 1), ex.last
        if b - a + 1 > PHRASE_STEPS:
            raise SiteError(f"a phrase search decodes every document of its steps; "
                            f"give at most {PHRASE_STEPS} steps, got {a}:{b}") from None
        rep = provenance.report(ex.mix, phrase=q, steps=(a, b), world=ex.world,
                                seed=ex.plan.seed)
        out["steps"] = [a, b]
    out["documents"] = [{**d, "doc_key": doc_key(ex.plan, d["source"], d["shard"], d["doc"])}
                        for d in rep["documents"]]
    return out


def search_index(ex: Explorer, docs: list[dict[str, Any]], written: list[int]
                 ) -> tuple[dict[str, Any], list[str]]:
    """What the static search page searches: the written steps, the schedule's runs
    (window -> step) and the documents of the written steps; and, apart (the static
    site writes them in chunks), those documents' texts in the same order."""
    return ({"last_step": ex.last, "written": written,
             "seq_tokens": ex.sched.spec.seq_tokens,
             "total_windows": ex.sched.total_windows,
             "runs": [[r.first_step, r.steps, r.batch, r.tokens_before]
                      for r in ex.sched.runs],
             "docs": [{"key": d["key"], "id": d["doc_id"], "source": d["source"],
                       "steps": d["steps"]} for d in docs]},
            [d["text"] for d in docs])
