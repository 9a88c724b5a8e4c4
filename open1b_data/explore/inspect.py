"""``stream-at``: what the stream holds at a window or step - each window's rank,
micro-batch, sha256, token ids and document segments - or, with ``stats``, the batch's data
statistics (``stats.py``), for one step or one line per step over a range.

Answers are fast or refused, never slow: planning window m replays the stream from the
nearest known cursor before it (the start of the stream or a seek-index entry), and
``check_reach`` refuses a request whose replay is estimated above ``REPLAY_BUDGET``
draw-equivalents (about a second) before anything is replayed. The estimate: windows to
replay x ``cost_per_window`` = their expected draws (window tokens / expected tokens per
draw: mean document length plus the separator, weighted by the draw probabilities) times
``1 + SHARD_VISIT_DRAWS x`` the expected shard visits per draw (sum over sources of
``p_s * shards_s / documents_s``). With the seek index a build writes, every
window of the schedule is at most K windows from an entry; without one, or far past the
schedule, the refusal says which windows are answered and how to reach more.

``--rank r`` with ``--window m`` is honoured: a window belongs to rank ``m mod R`` only,
and asking another rank for it is an error naming the owner. Results are plain JSON-able
dicts (the ``--json`` schemas of ``stream-at`` in docs/CLI.md).
"""
from __future__ import annotations

import numpy as np

from open1b_data.errors import StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule

REPLAY_BUDGET = 1 << 20      # draw-equivalents stream-at may replay: ~0.2 s (benchmarks/HISTORY.md)
SHARD_VISIT_DRAWS = 4096     # one (source, epoch, shard) visit costs ~4,000 draws of work
SECONDS_PER_DRAW = 0.2e-6    # CPU per draw on the 2-core reference machine (benchmarks/HISTORY.md)
MAX_STATS_STEPS = 64         # --steps A:B --stats: one call compares a step with neighbours


def tokens_per_draw(plan: StreamPlan) -> float:
    """Expected tokens one draw adds to the stream (document + separator)."""
    view = plan.view
    w = np.array(view.weights, dtype=np.float64)
    mean = np.array([s.tokens / max(s.documents, 1) for s in view.sources])
    return float((w * (mean + 1)).sum() / w.sum())


def cost_per_window(plan: StreamPlan) -> float:
    """Expected replay work per window in draw-equivalents: its draws, plus the shard
    visits they cause (each new (source, epoch, shard) computes a permutation key and
    permutes in a separate vectorized call; a small source rolls over epochs often)."""
    view = plan.view
    p = np.array(view.weights, dtype=np.float64) / view.total_weight
    visits = sum(float(q) * s.shards / max(s.documents, 1) for q, s in zip(p, view.sources))
    return plan.window / tokens_per_draw(plan) * (1 + SHARD_VISIT_DRAWS * visits)


def known_before(plan: StreamPlan, m: int) -> int:
    """The window of the nearest cursor the plan can start from for window m."""
    idx = plan.index
    if idx is None:
        return 0
    return min(m // idx.every, len(idx.draw) - 1) * idx.every


def check_reach(plan: StreamPlan, sched: Schedule, first: int, last: int) -> None:
    """Refuse windows ``first..last`` if planning them would replay more than
    ``REPLAY_BUDGET`` draw-equivalents (see module docstring); costs no replay."""
    start = known_before(plan, first)
    per_window = cost_per_window(plan)
    work = (last + 1 - start) * per_window
    if work <= REPLAY_BUDGET:
        return
    far = known_before(plan, 1 << 62)
    reach = far + int(REPLAY_BUDGET / per_window) - 1
    where = (f"the last seek-index entry (window {far:,})" if plan.index is not None
             else "the start of the stream (this mix has no seek index)")
    head = (f"window {last:,} needs ~{_duration(work * SECONDS_PER_DRAW)} of replay from "
            f"{where}; stream-at replays at most ~{_duration(REPLAY_BUDGET * SECONDS_PER_DRAW)}"
            f", so it answers windows 0..{reach:,}")
    if last < sched.total_windows:
        raise StreamError(f"{head}; rerun with --build-index to build the mix's seek index "
                          f"once (one pass over the schedule's {sched.total_windows:,} "
                          f"windows)")
    raise StreamError(f"{head}; window {last:,} is never trained on (the schedule ends "
                      f"with window {sched.total_windows - 1:,}, step {sched.last_step}); "
                      f"to plan past that, extend the seek index (docs/CLI.md, stream-at)")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:.0f} s" if seconds >= 1.5 else f"{seconds:.1f} s"


def open_plan(mix: str, build_index: bool = False, seed: int | None = None
              ) -> tuple[StreamPlan, Schedule]:
    """The mix's plan (seek index attached when one exists; built first with
    ``build_index``) and its schedule; ``seed`` None is the mix's own (a run may train the
    mix with another: its genesis names it)."""
    plan = StreamPlan.open(mix, seed=seed)
    if build_index:
        from open1b_data.stream import seekindex

        seekindex.ensure(plan)
    return plan, Schedule.from_definition(plan.view.definition)


def _shard_paths(plan: StreamPlan) -> tuple[tuple[str, ...], ...]:
    """``[source][shard]`` -> the shard's file, relative to the mix root: what a user can
    find (the manifest index alone is not)."""
    return tuple(sv.shard_paths for sv in plan.view.sources)


def _entries(sched: Schedule, R: int, window: int | None, step: int | None,
             rank: int | None) -> tuple[list[tuple[int, int, int | None]], object]:
    """(window, rank, micro_batch) of the request, and the StepInfo (None past the end)."""
    if R < 1:
        raise StreamError(f"world size must be an integer >= 1, got {R}; give --world R "
                          f"with R data-parallel ranks")
    if rank is not None and not 0 <= rank < R:
        raise StreamError(f"--rank must be in [0, {R}) for --world {R}, got {rank}")
    if step is not None:
        info = sched.step(step)
        sched.accumulation(step, R)
        entries = []
        for r in ([rank] if rank is not None else range(R)):
            for j, mb in enumerate(sched.rank_plan(step, R, r).micro_batches):
                entries.extend((m, r, j) for m in mb)
        return entries, info
    if window < 0:
        raise StreamError(f"window index must be an integer >= 0, got {window}")
    owner = window % R
    if rank is not None and rank != owner:
        raise StreamError(f"window {window:,} belongs to rank {owner} of a {R}-way job "
                          f"(rank = window mod {R}), not rank {rank}; use --rank {owner} or "
                          f"drop --rank")
    info = None
    mbi = None
    if window < sched.total_windows:
        info = sched.step(sched.step_of_window(window))
        if info.batch_sequences % (R * sched.spec.micro_batch) == 0:
            rp = sched.rank_plan(info.step, R, owner)
            mbi = next(j for j, mb in enumerate(rp.micro_batches) if window in mb)
    return [(window, owner, mbi)], info


def _header(plan: StreamPlan, sched: Schedule, R: int, rank: int | None, info) -> dict:
    out = {"mix": plan.view.name, "fingerprint": plan.fingerprint, "seed": plan.seed,
           "window_tokens": plan.window, "world": R, "rank": rank,
           "step": None if info is None else info.step}
    if info is not None:
        group = R * sched.spec.micro_batch
        out.update(batch_sequences=info.batch_sequences,
                   accumulation=info.batch_sequences // group
                   if info.batch_sequences % group == 0 else None,
                   micro_batch_windows=sched.spec.micro_batch,
                   tokens_before=info.tokens_before, tokens_after=info.tokens_after,
                   lr=info.lr, window_range=[info.first_window,
                                             info.first_window + info.batch_sequences])
    return out


def _content(plan: StreamPlan, reader, ms: list[int]):
    """(sorted unique windows, their tokens, their segments)."""
    uniq = sorted(set(ms))
    segs = plan.segments_range(uniq[0], uniq[-1] + 1)
    segs = segs.select(np.isin(segs.window, uniq))
    return uniq, reader.fill_windows(segs, uniq), segs


def stream_at(mix: str, window: int | None = None, step: int | None = None,
              world: int | None = None, rank: int | None = None, decode: bool = False,
              plan_only: bool = False, stats: bool = False, build_index: bool = False,
              seed: int | None = None, mesh_range: tuple[int, int] | None = None) -> dict:
    """What the stream holds at ``window`` or ``step`` (module docstring). ``plan_only``:
    segments only, no shard read; ``stats``: the batch statistics instead of the windows;
    ``seed``: the stream's seed when not the mix's (``open_plan``); ``mesh_range=(a, b)``
    (with ``step``): only the step's windows a..b-1 in mesh order (rank, then micro-batch),
    so one page of a large step reads and decodes only its own windows."""
    from open1b_data.stream.windows import WindowReader, load_mix_tokenizer, window_sha256

    if (window is None) == (step is None):
        raise StreamError("give exactly one of window or step")
    if plan_only and (decode or stats):
        raise StreamError(f"--{'decode' if decode else 'stats'} needs token content; "
                          f"drop --plan-only")
    if decode and stats:
        raise StreamError("--stats replaces the segment listing that --decode annotates; "
                          "give one of them")
    plan, sched = open_plan(mix, build_index, seed)
    R = sched.spec.reference_world if world is None else world
    entries, info = _entries(sched, R, window, step, rank)
    if mesh_range is not None:
        a, b = mesh_range
        if step is None or not 0 <= a < b <= len(entries):
            raise StreamError(f"mesh_range {a}:{b} must lie within a step's "
                              f"{len(entries)} windows (0 <= a < b <= {len(entries)})")
        entries = entries[a:b]
    ms = [m for m, _, _ in entries]
    check_reach(plan, sched, min(ms), max(ms))
    out = _header(plan, sched, R, rank, info)
    if stats:
        from open1b_data.explore.stats import batch_stats

        uniq, toks, segs = _content(plan, WindowReader(plan, whole_shards=False), ms)
        out["stats"] = batch_stats(uniq, toks, segs, plan.sources,
                                   _shard_paths(plan)).to_dict()
        return out
    segs = plan.segments_range(min(ms), max(ms) + 1)
    reader = None if plan_only else WindowReader(plan, whole_shards=False)
    tok = load_mix_tokenizer(plan.view.mix_url) if decode else None
    toks_of: dict[int, np.ndarray] = {}
    ids_of: dict[tuple[int, int, int], str] = {}
    if reader is not None:
        uniq = sorted(set(ms))
        toks_of = dict(zip(uniq, reader.fill_windows(segs, uniq)))
        wanted = segs.select(np.isin(segs.window, uniq))
        by_shard: dict[tuple[int, int], set[int]] = {}
        for s_, h, d in zip(wanted.source.tolist(), wanted.shard.tolist(), wanted.doc.tolist()):
            by_shard.setdefault((s_, h), set()).add(d)
        for (s_, h), docs in by_shard.items():
            docs = sorted(docs)
            ids_of.update(((s_, h, d), x) for d, x in zip(docs, reader.doc_ids(s_, h, docs)))
    windows = []
    for m, r, j in entries:
        sel = segs.select(slice(int(np.searchsorted(segs.window, m, side="left")),
                                int(np.searchsorted(segs.window, m, side="right"))))
        w = {"window": m, "rank": r, "micro_batch": j, "sha256": None, "tokens": None}
        if reader is not None:
            w["sha256"] = window_sha256(toks_of[m])
            w["tokens"] = toks_of[m].tolist()
        w["segments"] = []
        for seg in sel.to_list(plan.sources):
            s = plan.sources.index(seg.source)
            d = {"source": seg.source, "shard": seg.shard,
                 "shard_path": plan.view.sources[s].shard_paths[seg.shard], "doc": seg.doc,
                 "doc_id": ids_of.get((s, seg.shard, seg.doc)),
                 "epoch": seg.epoch, "draw": seg.draw, "doc_length": seg.doc_length,
                 "doc_start": seg.doc_start,
                 "doc_end": min(seg.doc_start + seg.length, seg.doc_length),
                 "separator": seg.has_separator, "window_offset": seg.window_offset,
                 "length": seg.length}
            if tok is not None:
                ids = w["tokens"][seg.window_offset:seg.window_offset + d["doc_end"]
                                  - seg.doc_start]
                d["text"] = tok.decode(ids, skip_special_tokens=False)
            w["segments"].append(d)
        windows.append(w)
    out["windows"] = windows
    return out


def steps_stats(mix: str, steps: tuple[int, int], world: int | None = None,
                rank: int | None = None, build_index: bool = False, on_step=None) -> dict:
    """The batch statistics of every step A..B (at most ``MAX_STATS_STEPS``), one entry per
    step; ``on_step(header, entry)`` is called as each is done (so a long range prints as it
    goes; ``header`` is the result without ``per_step``)."""
    from open1b_data.explore.stats import batch_stats
    from open1b_data.stream.windows import WindowReader

    a, b = steps
    if b - a + 1 > MAX_STATS_STEPS:
        raise StreamError(f"--steps {a}:{b} spans {b - a + 1} steps; --stats compares at "
                          f"most {MAX_STATS_STEPS} per call - split the range")
    plan, sched = open_plan(mix, build_index)
    R = sched.spec.reference_world if world is None else world
    for s in (a, b):
        sched.step(s)                      # past the end: the schedule's own message
    first = _entries(sched, R, None, a, rank)[0]
    last = _entries(sched, R, None, b, rank)[0]
    check_reach(plan, sched, min(m for m, _, _ in first), max(m for m, _, _ in last))
    out = _header(plan, sched, R, rank, None)
    del out["step"]
    out["steps"] = [a, b]
    reader = WindowReader(plan, whole_shards=False)
    per_step = []
    for s in range(a, b + 1):
        entries, info = _entries(sched, R, None, s, rank)
        uniq, toks, segs = _content(plan, reader, [m for m, _, _ in entries])
        entry = {"step": s, "window_range": [info.first_window,
                                             info.first_window + info.batch_sequences],
                 "lr": info.lr, "stats": batch_stats(uniq, toks, segs, plan.sources,
                                                     _shard_paths(plan)).to_dict()}
        per_step.append(entry)
        if on_step is not None:
            on_step(out, entry)
    out["per_step"] = per_step
    return out


# ------------------------------------------------------------------------- human output

def _short(text: str, width: int = 150) -> str:
    flat = text.replace("\n", "\u23ce ").replace("\t", " ")
    return flat if len(flat) <= width else flat[:width - 1] + "\u2026"


def _print_head(rep: dict, echo) -> None:
    echo(f"mix {rep['mix']}  fingerprint {rep['fingerprint'][:16]}...  seed {rep['seed']}  "
         f"window {rep['window_tokens']} tokens")
    if rep["step"] is None:
        echo("(this window lies past the end of the training schedule)")
        return
    a, b = rep["window_range"]
    echo(f"step {rep['step']}: windows {a}..{b - 1} ({rep['batch_sequences']} windows), "
         f"tokens {rep['tokens_before']:,} -> {rep['tokens_after']:,}, lr {rep['lr']:.4g}")


def print_stream_at(rep: dict, echo) -> None:
    _print_head(rep, echo)
    if "stats" in rep:
        for line in stats_table(rep["stats"]):
            echo(line)
        return
    if rep["step"] is not None:
        acc = rep["accumulation"]
        if acc is not None:
            echo(f"world {rep['world']}: each rank loads {acc} micro-batch(es) of "
                 f"{rep['micro_batch_windows']} windows; rank r owns window m iff "
                 f"m mod {rep['world']} == r")
        else:
            echo(f"world {rep['world']}: does not divide this step's batch into "
                 f"micro-batches; window m goes to rank m mod {rep['world']}")
    echo("segments: offset/len in the window; doc tokens [a,b) of the document, "
         "+sep = then the <|endoftext|> separator")
    # One column width for the whole listing, so windows line up with each other.
    width = max([len(s["shard_path"]) for w in rep["windows"] for s in w["segments"]]
                + [len("shard file")])
    last = None
    for w in rep["windows"]:
        if (w["rank"], w["micro_batch"]) != last:
            last = (w["rank"], w["micro_batch"])
            mb = "" if w["micro_batch"] is None else f", micro-batch {w['micro_batch']}"
            echo(f"\nrank {w['rank']}{mb}")
        sha = "(plan only)" if w["sha256"] is None else f"sha256 {w['sha256'][:16]}..."
        echo(f"  window {w['window']}  {sha}")
        if w["tokens"] is not None:
            t = w["tokens"]
            echo(f"    tokens {' '.join(map(str, t[:10]))} ... {' '.join(map(str, t[-3:]))}"
                 f"  ({len(t)} ids)")
        echo(f"    {'offset':>6} {'len':>5}  {'shard file':<{width}} {'row':>7}  "
             f"{'doc tokens':<17} doc_id")
        for s in w["segments"]:
            span = f"[{s['doc_start']},{s['doc_end']})" + ("+sep" if s["separator"] else "")
            did = s["doc_id"] if s["doc_id"] is not None else "-"
            echo(f"    {s['window_offset']:>6} {s['length']:>5}  {s['shard_path']:<{width}} "
                 f"{s['doc']:>7}  {span:<17} {did}")
            if "text" in s:
                echo(f"           \u201c{_short(s['text'])}\u201d")


def stats_table(st: dict) -> list[str]:
    """The compact human table of one batch's statistics (``BatchStats.to_dict``)."""
    wins = st["windows"]
    lines = [f"statistics of {len(wins)} window(s), {st['tokens']:,} tokens "
             f"(separators included)",
             f"  unique-token ratio  {st['unique_ratio']:.3f} ({st['distinct']:,} distinct ids)"]
    by_ratio = sorted(wins, key=lambda w: (w["unique_ratio"], w["window"]))
    shown = by_ratio if len(wins) <= 8 else by_ratio[:5]
    label = "per window" if len(wins) <= 8 else "lowest windows"
    lines.append(f"  {label:<19} " + "  ".join(f"{w['window']}: {w['unique_ratio']:.3f}"
                                               for w in shown))
    if len(wins) > 8:
        r = [w["unique_ratio"] for w in wins]
        lines.append(f"  {'':<19} median {float(np.median(r)):.3f}, max {max(r):.3f}")
    lines.append(f"  {'source':<19} {'tokens':>10} {'share':>7} {'documents':>10}")
    for s in st["sources"]:
        lines.append(f"  {s['source']:<19} {s['tokens']:>10,} {s['share']:>7.1%} "
                     f"{s['documents']:>10,}")
    lines.append(f"  {'separators':<19} {st['separators']:,}")
    lines.append(f"  {'redrawn documents':<19} {len(st['redrawn'])} (one document from 2+ "
                 f"draws)")
    for r in st["redrawn"][:5]:
        lines.append(f"  {'':<19} {r['shard_path']} row {r['doc']}: draws "
                     f"{', '.join(map(str, r['draws']))}, epochs "
                     f"{', '.join(map(str, r['epochs']))}")
    lines.append(f"  {'spanning draws':<19} {st['spanning_draws']} (one draw over 2+ "
                 f"windows; the widest covers {st['longest_span']})")
    run = st["longest_run"]
    if run["token"] is not None:
        lines.append(f"  {'longest run':<19} {run['length']} x id {run['token']} (window "
                     f"{run['window']}, offset {run['offset']})")
    rep = st["longest_repeat"]
    where = "" if rep["window"] is None else (f" (window {rep['window']}, offsets "
                                             f"{rep['offsets'][0]} and {rep['offsets'][1]})")
    lines.append(f"  {'longest repeat':<19} {rep['length']} tokens{where}")
    return lines


class StepLines:
    """``--steps A:B --stats`` as one line per step, printed as each step is done."""

    def __init__(self, echo) -> None:
        self.echo = echo
        self.started = False

    def _head(self, rep: dict) -> None:
        r = "all ranks" if rep["rank"] is None else f"rank {rep['rank']}"
        self.echo(f"mix {rep['mix']}  fingerprint {rep['fingerprint'][:16]}...  seed "
                  f"{rep['seed']}  window {rep['window_tokens']} tokens")
        self.echo(f"steps {rep['steps'][0]}..{rep['steps'][1]}, {r} of a {rep['world']}-way "
                  f"job; uniq = distinct ids / tokens of the step, min = its lowest window; "
                  f"run, repeat in tokens; source columns = token shares")

    def __call__(self, header: dict, entry: dict) -> None:
        st = entry["stats"]
        if not self.started:
            self.started = True
            self._head(header)
            self.echo(f"{'step':>7} {'windows':>15} {'uniq':>6} {'min':>6} {'run':>5} "
                      f"{'repeat':>6} {'docs':>5} {'redrawn':>7} {'spanning':>8} "
                      f"{'seps':>5}  " + "  ".join(f"{s['source']:>9}" for s in st["sources"]))
        a, b = entry["window_range"]
        low = min(w["unique_ratio"] for w in st["windows"])
        self.echo(f"{entry['step']:>7} {f'{a}..{b - 1}':>15} {st['unique_ratio']:>6.3f} "
                  f"{low:>6.3f} {st['longest_run']['length']:>5} "
                  f"{st['longest_repeat']['length']:>6} "
                  f"{sum(s['documents'] for s in st['sources']):>5} {len(st['redrawn']):>7} "
                  f"{st['spanning_draws']:>8} {st['separators']:>5}  "
                  + "  ".join(f"{s['share']:>{max(9, len(s['source']))}.1%}"
                              for s in st["sources"]))
