"""Provenance: where in training a document - or any document containing a phrase - was
seen (the auditor's question about a suspected trigger phrase or a leaked record; the
forward direction, what a window or step trained on, is ``inspect.py``).

``report(mix, doc_id=..., steps=(A, B), world=R)`` finds the document(s) whose
source-native ``doc_id`` matches (scanning only the shards' ``doc_id`` column), then asks the
plan for every draw of each within the windows of steps A..B (``StreamPlan.occurrences``:
the document's position in each epoch's permutation is inverted, never replayed), and lists
each window with tokens of it: window, step, rank (``window mod R``), epoch, and the token
range of the document in it. ``report(mix, phrase=..., steps=...)`` plans the windows of
those steps chunk by chunk, decodes each distinct drawn document once (tokenizer of the
mix) and keeps the ones whose text contains the phrase (exact, case-sensitive substring),
with the same per-window listing. Steps default to the whole schedule. Results are plain
JSON-able dicts (the ``--json`` schema of ``provenance`` in docs/CLI.md).
"""
from __future__ import annotations

import numpy as np

from open1b_data.errors import StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule

CHUNK_WINDOWS = 4096


def _window_span(sched: Schedule, steps: tuple[int, int] | None) -> tuple[int, int, int, int]:
    a, b = steps if steps is not None else (1, sched.last_step)
    if b > sched.last_step:
        raise StreamError(f"--steps {a}:{b} ends past the last step {sched.last_step} of the "
                          f"schedule; use B <= {sched.last_step}")
    first = sched.step(a).first_window
    last = sched.step(b)
    return a, b, first, last.first_window + last.batch_sequences


def find_doc_id(plan: StreamPlan, reader, doc_id: str) -> list[tuple[int, int, int]]:
    """(source, shard, doc) of every document whose doc_id equals ``doc_id``."""
    hits = []
    for s, sv in enumerate(plan.view.sources):
        for h in range(sv.shards):
            ids = reader.column(s, h, "doc_id")
            hits.extend((s, h, d) for d, x in enumerate(ids) if x == doc_id)
    return hits


def _occurrence(sched: Schedule, world: int, m: int, epoch: int, draw: int, doc_start: int,
                length: int, doc_length: int) -> dict:
    end = min(doc_start + length, doc_length)
    return {"window": m, "step": sched.step_of_window(m), "rank": m % world, "epoch": epoch,
            "draw": draw, "doc_start": doc_start, "doc_end": end,
            "separator": doc_start + length > doc_length}


def occurrences(plan: StreamPlan, sched: Schedule, world: int, s: int, h: int, d: int,
                lo: int, hi: int) -> list[dict]:
    """Every window of ``[lo, hi)`` with tokens of document (source s, shard h, row d):
    the plan inverts the document's position in each epoch's order, nothing is replayed."""
    occ = []
    w = plan.window
    for info in plan.occurrences(s, h, d, lo, hi):
        for m in range(max(info.first_window, lo), min(info.last_window, hi - 1) + 1):
            start = max(0, m * w - info.start)
            stop = min(info.length + 1, (m + 1) * w - info.start)
            occ.append(_occurrence(sched, world, m, info.epoch, info.draw, start,
                                   stop - start, info.length))
    return occ


def document(plan: StreamPlan, reader, sched: Schedule, world: int, s: int, h: int, d: int,
             lo: int, hi: int) -> dict:
    """One document's entry of the report (its ``occurrences`` in windows ``[lo, hi)``)."""
    return _doc_entry(plan, reader, s, h, d, occurrences(plan, sched, world, s, h, d, lo, hi))


def _doc_entry(plan, reader, s, h, d, occ) -> dict:
    return {"source": plan.sources[s], "shard": h,
            "shard_path": plan.view.sources[s].shard_paths[h], "doc": d,
            "doc_id": reader.doc_ids(s, h, [d])[0],
            "length": int(plan.view.lengths(s, h)[d]),
            "steps": sorted({o["step"] for o in occ}), "occurrences": occ}


def report(mix: str, doc_id: str | None = None, phrase: str | None = None,
           steps: tuple[int, int] | None = None, world: int | None = None,
           seed: int | None = None) -> dict:
    """Provenance of a doc_id or a phrase within steps A..B (see module docstring);
    ``seed`` None is the mix's own (a run's genesis names the seed it trained with)."""
    from open1b_data.stream.windows import WindowReader

    if (doc_id is None) == (phrase is None):
        raise StreamError("provenance needs exactly one of doc_id or phrase")
    if phrase is not None and not phrase:
        raise StreamError("the phrase is empty; give the text to look for")
    plan = StreamPlan.open(mix, seed=seed)
    sched = Schedule.from_definition(plan.view.definition)
    R = sched.spec.reference_world if world is None else int(world)
    if R < 1:
        raise StreamError(f"world size must be >= 1, got {R}")
    a, b, lo, hi = _window_span(sched, steps)
    reader = WindowReader(plan, whole_shards=phrase is not None, cache_shards=2)
    out = {"mix": plan.view.name, "fingerprint": plan.fingerprint, "seed": plan.seed,
           "steps": [a, b], "windows": [lo, hi], "world": R,
           "query": {"doc_id": doc_id} if doc_id is not None else {"text": phrase}}
    docs = []
    if doc_id is not None:
        locs = find_doc_id(plan, reader, doc_id)
        if not locs:
            raise StreamError(f"no document with doc_id {doc_id!r} in mix {plan.view.name!r}; "
                              f"doc ids are source-native (e.g. a WARC-Record-ID)")
        docs = [document(plan, reader, sched, R, s, h, d, lo, hi) for s, h, d in locs]
    else:
        docs = _phrase(plan, reader, sched, R, phrase, lo, hi)
    out["documents"] = docs
    return out


def _phrase(plan, reader, sched, R, phrase, lo, hi) -> list[dict]:
    from open1b_data.stream.windows import load_mix_tokenizer

    tok = load_mix_tokenizer(plan.view.mix_url)
    verdict: dict[tuple[int, int, int], bool] = {}
    found: dict[tuple[int, int, int], list[dict]] = {}
    for a in range(lo, hi, CHUNK_WINDOWS):
        segs = plan.segments_range(a, min(hi, a + CHUNK_WINDOWS))
        key = np.stack([segs.source, segs.shard, segs.doc], axis=1)
        uniq = {tuple(int(x) for x in k) for k in np.unique(key, axis=0)}
        new = sorted(k for k in uniq if k not in verdict)
        by_shard: dict[tuple[int, int], list[int]] = {}
        for s, h, d in new:
            by_shard.setdefault((s, h), []).append(d)
        for (s, h), ds in by_shard.items():
            toks = reader.documents(s, h, ds)
            texts = tok.decode_batch([t.tolist() for t in toks], skip_special_tokens=False)
            for d, text in zip(ds, texts):
                verdict[(s, h, d)] = phrase in text
        for i in np.flatnonzero([verdict[tuple(int(x) for x in k)] for k in key]):
            k = tuple(int(x) for x in key[i])
            found.setdefault(k, []).append(_occurrence(
                sched, R, int(segs.window[i]), int(segs.epoch[i]), int(segs.draw[i]),
                int(segs.doc_start[i]), int(segs.length[i]), int(segs.doc_length[i])))
    return [_doc_entry(plan, reader, s, h, d, occ) for (s, h, d), occ in sorted(found.items())]


def print_report(rep: dict, echo) -> None:
    q = rep["query"]
    what = f"doc_id {q['doc_id']!r}" if "doc_id" in q else f"text {q['text']!r}"
    echo(f"mix {rep['mix']}  fingerprint {rep['fingerprint'][:16]}...  {what}")
    echo(f"steps {rep['steps'][0]}..{rep['steps'][1]} = windows {rep['windows'][0]}.."
         f"{rep['windows'][1] - 1}, ranks of a {rep['world']}-way job")
    if not rep["documents"]:
        echo("no document matches in these steps")
    for d in rep["documents"]:
        echo(f"\n{d['shard_path']} row {d['doc']}  doc_id {d['doc_id']}  "
             f"({d['length']} tokens)")
        if not d["occurrences"]:
            echo("  not trained on in these steps")
            continue
        echo(f"  steps: {', '.join(map(str, d['steps']))}")
        echo(f"  {'step':>7} {'window':>8} {'rank':>5} {'epoch':>5}  doc tokens")
        for o in d["occurrences"]:
            span = f"[{o['doc_start']},{o['doc_end']})" + ("+sep" if o["separator"] else "")
            echo(f"  {o['step']:>7} {o['window']:>8} {o['rank']:>5} {o['epoch']:>5}  {span}")
