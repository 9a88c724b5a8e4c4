"""What each explorer page shows, gathered from a run, its mix and certificates as plain,
JSON-able dicts (rendered by ``render.py``).

``Explorer.open(run, mix, certs, trusted=, expect=)`` reads the log once, checks the chain
(``open1b_train.chain``; a cut-off last line is a finding too), refuses a log that does not
end in ``expect`` (the published run hash), opens the stream plan with the run's seed and
refuses a mix whose fingerprint is not the genesis's. It says no more than the CLI:
coverage is ``open1b-audit coverage``'s with the same ``trusted`` keys, every certificate
is read as coverage reads it (a link, a FIFO, a malformed one is a listed conflict, never
a failure), and ``trust()`` tells the pages what was not given (no run hash: a truncated
log also shows "chain OK"; no trusted keys: any key counts). Every per-step value comes
from the hashed ``scalars`` of a line (float32 bits as hex, the LR as a hex float), never
from the decimal fields beside them, which the chain does not cover; tokens/s is unhashed
and is labelled owner-reported wherever it appears. A step's windows, documents and decoded text are the
stream's answer (``inspect.stream_at`` over the run's virtual ranks: mesh order, the order
of ``scalars.window_loss``), its statistics those of ``stream-at --stats``, a document's
steps the plan's reverse provenance, coverage ``open1b_audit.coverage.coverage``.

Sizes stay bounded at Open-1B scale (80,957 steps): the run page carries a min/max
downsampled overview of each curve (``OVERVIEW_BUCKETS``), the full curves come in chunks
of ``CHUNK_STEPS`` steps. A step of Open-1B's size (2,304 windows of 4,097 tokens, 9.4M
tokens) is split: its page lists the windows (loss, rank, micro-batch, documents; plan
only), ``PAGE_WINDOWS`` windows a page show documents and decoded text (reading and decoding
only those windows), the batch statistics have a page of their own; a step of at most
``PAGE_WINDOWS`` windows is one page. Every page's decoded text stops at ``TEXT_BUDGET``
characters (then the document pages hold it), a document page at ``DOC_TEXT_CHARS``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from open1b_audit.errors import SiteError
from open1b_audit.site.scalars import scalars_of
from open1b_train.recipe import Announcement

CHUNK_STEPS = 4096          # steps per curve chunk (a few hundred KB of JS each)
OVERVIEW_BUCKETS = 1000     # the overview keeps each bucket's min and max: <= 2,000 points
PAGE_WINDOWS = 32           # windows on one page: 32 x 4,096 tokens, ~0.5 MB (benchmarks/HISTORY.md)
TEXT_BUDGET = 1_000_000     # decoded characters on one page of windows
DOC_TEXT_CHARS = 1_000_000  # a document page shows at most this much of one document
SERIES = ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss")



def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


@dataclass
class Explorer:
    run: str
    mix: str
    lines: list[dict[str, Any]]
    mesh: tuple[int, int]
    plan: Any                       # StreamPlan with the run's seed
    sched: Any                      # Schedule of the mix
    finding: Any                    # chain.Finding | None
    certs: list[tuple[str, Any]]    # (path, certificate dict or the CertificateError)
    build_index: bool = False
    trusted: set[str] | None = None    # --trusted-keys: the only keys coverage counts
    expect: str | None = None          # --expect-run-hash: the log ends in it (checked)
    announce: Any = None               # recipe.Announcement: the announced preset and mix
    recipe: dict[str, Any] | None = None   # recipe.summary of the run (preset, mix, departures)
    page_windows: int = PAGE_WINDOWS   # windows a page of a large step shows in full
    _columns: dict | None = None

    @classmethod
    def open(cls, run: str, mix: str | None = None, certs: str | None = None,
             build_index: bool = False, trusted: set[str] | None = None,
             expect: str | None = None, announce=None) -> "Explorer":
        from open1b_audit.coverage import read_all
        from open1b_train import chain, recipe
        from open1b_data import StreamPlan
        from open1b_data.stream.schedule import Schedule
        from open1b_train import runlog
        from open1b_train.run import read_run

        if not os.path.lexists(runlog.path_of(run)):
            raise SiteError(f"{run}: no steps.jsonl (not a run directory?)")
        log = runlog.read_log(run, error=SiteError)
        lines = log.lines
        if not lines or not isinstance(lines[0].get("genesis"), dict):
            raise SiteError(f"{run}: no steps.jsonl with a genesis line (not a run directory?)")
        if expect is not None:
            pinned = chain.pin(lines, expect, log.partial_bytes)
            if pinned is not None:
                raise SiteError(f"{run} is not the published run: {pinned}")
        cfg, mix = read_run(run, mix)
        gen = lines[0]["genesis"]
        plan = StreamPlan.open(mix, seed=gen.get("seed"), build_index=build_index)
        if plan.fingerprint != gen.get("mix_fingerprint"):
            raise SiteError(f"{mix}: fingerprint {plan.fingerprint[:16]}... is not the run's "
                            f"mix ({str(gen.get('mix_fingerprint'))[:16]}...); pass --mix "
                            f"with the mix the run trained on")
        paths = []
        if certs is not None:
            if not os.path.isdir(certs):
                raise SiteError(f"--certs {certs}: not a directory of certificates")
            paths = sorted(os.path.join(certs, n) for n in os.listdir(certs)
                           if n.endswith(".json"))
        finding = chain.check(lines) or chain.cut_tail(lines, log.partial_bytes)
        announce = announce or Announcement(run_hash=expect)
        rc = recipe.summary(cfg, plan.view.definition, plan.fingerprint, plan.view.seed)
        why = announce.refusal(gen, cfg.preset)
        if why is None and announce.preset is not None and rc["departures"]:
            why = recipe.on_recipe(rc)
        if why is not None:
            raise SiteError(f"{run} is not the announced recipe: {why}")
        return cls(run, mix, lines, tuple(cfg.mesh), plan,
                   Schedule.from_definition(plan.view.definition), finding,
                   read_all(paths), build_index, trusted=trusted, expect=expect,
                   announce=announce, recipe=rc)

    def trust(self) -> dict[str, Any]:
        """What the pages' counts and chain status rest on: the published run hash the log
        was pinned to and the number of trusted keys (None: not given - the pages say so)."""
        a = self.announce or Announcement(run_hash=self.expect)
        return {"expected_run_hash": self.expect,
                "trusted_keys": None if self.trusted is None else len(self.trusted),
                "expected_preset": a.preset, "expected_mix": a.mix, "recipe": self.recipe}

    # ------------------------------------------------------------------ the run

    @property
    def last(self) -> int:
        return len(self.lines) - 1

    @property
    def world(self) -> int:
        return self.mesh[0] * self.mesh[1]

    def has_step(self, s: int) -> bool:
        return 1 <= s <= self.last

    def columns(self) -> dict[str, list]:
        """Every logged step's curves, decoded once: step, cumulative tokens (the hashed
        per-step tokens summed), each series, and the skipped / spike flags."""
        if getattr(self, "_columns", None) is None:
            cols: dict[str, list] = {k: [] for k in ("step", "tokens", *SERIES, "skipped",
                                                     "spike")}
            total = 0
            for s, line in enumerate(self.lines[1:], start=1):
                sc = scalars_of(line)
                total += sc["tokens"] or 0
                cols["step"].append(s)
                cols["tokens"].append(total)
                for k in ("loss", "lr", "grad_norm", "val_loss"):
                    cols[k].append(_num(sc[k]))
                cols["tokens_per_s"].append(_num(line.get("tokens_per_s")))
                cols["skipped"].append(1 if sc["skipped"] else 0)
                cols["spike"].append(1 if sc["spike"] else 0)
            if not any(v is not None for v in cols["val_loss"]):
                del cols["val_loss"]
            self._columns = cols
        return self._columns

    def series(self, a: int, b: int) -> dict[str, list]:
        """The columns of steps a..b (inclusive)."""
        return {k: v[a - 1:b] for k, v in self.columns().items()}

    def _tokens_before(self, a: int) -> int:
        return self.columns()["tokens"][a - 2] if a > 1 else 0

    def chunks(self) -> int:
        return max(1, -(-self.last // CHUNK_STEPS))

    def chunk(self, i: int) -> dict[str, Any]:
        """Curve chunk i: steps ``i*CHUNK_STEPS+1 ..`` (full resolution)."""
        if not 0 <= i < self.chunks():
            raise SiteError(f"curve chunk {i} does not exist (0..{self.chunks() - 1})")
        a = i * CHUNK_STEPS + 1
        return {"chunk": i, **self.series(a, min(self.last, a + CHUNK_STEPS - 1))}

    def overview(self) -> dict[str, Any]:
        """Each curve downsampled to its min and max per bucket of steps (spikes survive)."""
        if self.last < 1:
            return {"series": {}}
        cols = self.series(1, self.last)
        n = len(cols["step"])
        size = max(1, -(-n // OVERVIEW_BUCKETS))
        out = {}
        for k in SERIES:
            if k not in cols:
                continue
            ys = cols[k]
            keep: list[int] = []
            for lo in range(0, n, size):
                idx = [i for i in range(lo, min(n, lo + size)) if ys[i] is not None]
                if idx:
                    keep.extend(sorted({min(idx, key=ys.__getitem__),
                                        max(idx, key=ys.__getitem__)}))
            out[k] = {"step": [cols["step"][i] for i in keep],
                      "tokens": [cols["tokens"][i] for i in keep], "y": [ys[i] for i in keep]}
        return {"series": out, "bucket_steps": size}

    def phases(self) -> list[dict[str, Any]]:
        """The batch-ramp phases the logged steps span (from the mix's schedule)."""
        out: list[dict[str, Any]] = []
        for r in self.sched.runs:
            first = r.first_step
            if first > self.last:
                break
            info = self.sched.step(first)
            last = min(self.last, first + r.steps - 1)
            if out and out[-1]["phase"] == info.phase and out[-1]["batch"] == r.batch:
                out[-1]["last_step"] = last
                continue
            out.append({"phase": info.phase, "batch": r.batch, "first_step": first,
                        "last_step": last, "tokens_before": info.tokens_before})
        return out

    def run_page(self) -> dict[str, Any]:
        gen = self.lines[0]["genesis"]
        cols = self.columns()
        cov = self.coverage()
        return {"run": self.run, "mix": self.mix, "mix_name": self.plan.view.name,
                "steps": self.last, "run_hash": self.lines[-1].get("hash"),
                "genesis_hash": self.lines[0].get("hash"), "genesis": gen,
                "mesh": list(self.mesh), "schedule_last_step": self.sched.last_step,
                "chain": {"ok": self.finding is None,
                          "finding": None if self.finding is None else self.finding.to_dict()},
                "phases": self.phases(),
                "skipped": [s for s, f in zip(cols["step"], cols["skipped"]) if f],
                "skipped_tokens": [t for t, f in zip(cols["tokens"], cols["skipped"]) if f],
                "spikes": [s for s, f in zip(cols["step"], cols["spike"]) if f],
                "chunks": self.chunks(), "chunk_steps": CHUNK_STEPS,
                "coverage": {"covered": cov["covered"], "conflicts": len(cov["conflicts"]),
                             "certificates": len(self.certs),
                             "keys_counted": cov["keys_counted"]},
                "trust": self.trust()}

    # ------------------------------------------------------------------ a step

    def _line(self, s: int) -> dict[str, Any]:
        if not 0 <= s <= self.last:
            raise SiteError(f"{self.run} logs steps 0..{self.last}; step {s} is not in it")
        return self.lines[s]

    def step_page(self, s: int) -> dict[str, Any]:
        """Step s: its hashed values, certificates and windows. A step of at most
        ``page_windows`` windows carries them in full (documents, text) and its batch
        statistics; a larger one an index of its windows (plan only, no shard read) whose
        detail is on ``window_page(s, k)`` and statistics on ``stats_page(s)``."""
        from open1b_data.explore import inspect

        line = self._line(s)
        out: dict[str, Any] = {"step": s, "hash": line.get("hash"), "prev": line.get("prev"),
                               "last_step": self.last,
                               "previous_step": s - 1 if s > 0 else None,
                               "next_step": s + 1 if s < self.last else None,
                               "trust": self.trust()}
        if s == 0:
            out["genesis"] = line.get("genesis")
            return out
        sc = scalars_of(line)
        info = self.sched.step(s)
        n = info.batch_sequences
        out.update(components=line.get("components"), scalars=sc,
                   raw_scalars=line.get("scalars"), phase=info.phase,
                   batch=n, tokens_before=info.tokens_before,
                   tokens_after=info.tokens_after, windows_range=[info.first_window,
                                                                   info.first_window + n],
                   owner_reported={"seconds": _num(line.get("seconds")),
                                   "tokens_per_s": _num(line.get("tokens_per_s"))},
                   certificates=self.step_certificates(s), world=self.world,
                   pages=self.pages(s), page_windows=self.page_windows)
        losses = sc["window_loss"]
        if len(losses) != n:
            out["loss_mismatch"] = (f"the log has {len(losses)} window losses, the stream "
                                    f"{n} windows for this step")
        if out["pages"] == 1:
            out.update(self._windows(s, 0, n), stats=self._stats(s), index=None)
            return out
        rep = inspect.stream_at(self.mix, step=s, world=self.world, plan_only=True,
                                build_index=self.build_index, seed=self.plan.seed)
        out.update(windows=None, stats=None, index=[
            {"window": w["window"], "rank": w["rank"], "micro_batch": w["micro_batch"],
             "loss": losses[i] if i < len(losses) else None, "documents": len(w["segments"]),
             "page": i // self.page_windows} for i, w in enumerate(rep["windows"])])
        return out

    def pages(self, s: int) -> int:
        """How many window pages step s's windows fill (``page_windows`` each)."""
        return -(-self.sched.step(s).batch_sequences // self.page_windows)

    def window_page(self, s: int, k: int) -> dict[str, Any]:
        """Page k of step s's windows: ``page_windows`` of them in mesh order (virtual rank,
        micro-batch), each with its documents and their decoded text."""
        line = self._line(s)
        if s == 0 or not 0 <= k < self.pages(s):
            raise SiteError(f"step {s} has no window page {k}"
                            + ("" if s == 0 else f" (0..{self.pages(s) - 1})"))
        n = self.sched.step(s).batch_sequences
        a, b = k * self.page_windows, min(n, (k + 1) * self.page_windows)
        return {"step": s, "hash": line.get("hash"), "page": k, "pages": self.pages(s),
                "mesh_range": [a, b], "batch": n, **self._windows(s, a, b)}

    def stats_page(self, s: int) -> dict[str, Any]:
        """The batch statistics of step s (``stream-at --stats``: every token of the step)."""
        line = self._line(s)
        if s == 0:
            raise SiteError("step 0 (genesis) trains on no data: it has no statistics")
        info = self.sched.step(s)
        return {"step": s, "hash": line.get("hash"), "batch": info.batch_sequences,
                "tokens": info.tokens_after - info.tokens_before, "stats": self._stats(s)}

    def doc_keys(self, s: int) -> list[str]:
        """The document keys of step s's windows in page order (plan only)."""
        from open1b_data.explore import inspect

        rep = inspect.stream_at(self.mix, step=s, world=self.world, plan_only=True,
                                build_index=self.build_index, seed=self.plan.seed)
        return [doc_key(self.plan, g["source"], g["shard"], g["doc"])
                for w in rep["windows"] for g in w["segments"]]

    def _stats(self, s: int) -> dict[str, Any]:
        from open1b_data.explore import inspect

        return inspect.stream_at(self.mix, step=s, world=self.world, stats=True,
                                 build_index=self.build_index, seed=self.plan.seed)["stats"]

    def _windows(self, s: int, a: int, b: int, text_budget: int = TEXT_BUDGET
                 ) -> dict[str, Any]:
        """Windows a..b-1 of step s in mesh order: documents, decoded text (up to
        ``text_budget`` characters, then the document pages hold it), losses."""
        from open1b_data.explore import inspect

        losses = scalars_of(self._line(s))["window_loss"]
        rep = inspect.stream_at(self.mix, step=s, world=self.world, decode=True,
                                build_index=self.build_index, seed=self.plan.seed,
                                mesh_range=(a, b))
        used = 0
        windows = []
        for i, w in enumerate(rep["windows"], start=a):
            segs = []
            for g in w["segments"]:
                text = g.get("text")
                if text is not None and used + len(text) > text_budget:
                    text = None
                used += len(text or "")
                key = doc_key(self.plan, g["source"], g["shard"], g["doc"])
                segs.append({"source": g["source"], "shard": g["shard"],
                             "shard_path": g["shard_path"], "row": g["doc"],
                             "doc_id": g["doc_id"], "doc_key": key, "epoch": g["epoch"],
                             "tokens": [g["doc_start"], g["doc_end"]],
                             "doc_length": g["doc_length"], "separator": g["separator"],
                             "window_offset": g["window_offset"], "text": text,
                             "text_omitted": g.get("text") is not None and text is None})
            windows.append({"window": w["window"], "rank": w["rank"],
                            "micro_batch": w["micro_batch"], "sha256": w["sha256"],
                            "loss": losses[i] if i < len(losses) else None,
                            "documents": segs})
        return {"windows": windows, "text_chars": used}

    def step_certificates(self, s: int) -> list[dict[str, Any]]:
        from open1b_audit import certificate
        from open1b_audit.coverage import not_counted

        skipped = not_counted(self.coverage())
        out = []
        for path, c in self.certs:
            if not isinstance(c, dict) or c.get("step") != s:
                continue
            try:
                key = certificate.verify(c)
                sig = "unsigned" if key is None else "verified"
            except certificate.CertificateError:
                key, sig = None, "BAD SIGNATURE"
            counted = skipped.get(path, "yes: any key counts (no --trusted-keys)"
                                  if self.trusted is None else "yes: a trusted key")
            out.append({"file": os.path.basename(path), "auditor": c.get("auditor"),
                        "public_key": key, "signature": sig, "counted": counted,
                        "verdict": c.get("verdict"),
                        "backend": c.get("backend"), "finding": c.get("finding"),
                        "replayed_from": c.get("replayed_from"),
                        "output_hash": (c.get("output_state") or {}).get("hash"),
                        "software": c.get("software")})
        return out

    # ------------------------------------------------------------------ a document

    def _windows_span(self) -> tuple[int, int]:
        last = self.sched.step(self.last)
        return self.sched.step(1).first_window, last.first_window + last.batch_sequences

    def document_page(self, key: str) -> dict[str, Any]:
        from open1b_data.explore import provenance
        from open1b_data.stream.windows import WindowReader, load_mix_tokenizer

        s, h, d = parse_key(self.plan, key)
        reader = WindowReader(self.plan, whole_shards=False)
        lo, hi = self._windows_span()
        doc = provenance.document(self.plan, reader, self.sched, self.world, s, h, d, lo, hi)
        toks = reader.documents(s, h, [d])[0]
        text = load_mix_tokenizer(self.plan.view.mix_url).decode(
            toks.tolist(), skip_special_tokens=False)
        rows = reader.shards
        doc.update(key=key, text=text[:DOC_TEXT_CHARS], text_chars=len(text),
                   input=rows.column(s, h, "input", [d])[0],
                   input_row=int(rows.column(s, h, "row", [d])[0]), last_step=self.last)
        return doc

    # ------------------------------------------------------------------ coverage, mix

    def coverage(self) -> dict[str, Any]:
        from open1b_audit.coverage import coverage

        if not hasattr(self, "_coverage"):
            self._coverage = coverage(self.lines, self.certs, 1, self.trusted,
                                      self.announce or Announcement(run_hash=self.expect))
        return self._coverage

    def coverage_page(self) -> dict[str, Any]:
        cov = self.coverage()
        counts = {int(s): len(a) for s, a in cov["certified"].items()}
        name = lambda xs: [{**x, "certificate": os.path.basename(x["certificate"])}  # noqa: E731
                           for x in xs]
        return {"steps": self.last, "covered": cov["covered"], "counts": counts,
                "auditors": sorted({a for v in cov["certified"].values() for a in v}),
                "conflicts": name(cov["conflicts"]), "unsigned": name(cov["unsigned"]),
                "untrusted": name(cov["untrusted"]), "off_recipe": name(cov["off_recipe"]),
                "certificates": len(self.certs),
                "run_hash": cov["run_hash"], "trust": self.trust()}

    def mix_page(self) -> dict[str, Any]:
        from open1b_data.formats.manifest import load_manifest

        m = load_manifest(self.plan.view.mix_url)
        return {"name": m.name, "fingerprint": m.fingerprint, "builder": m.builder_version,
                "seed": m.seed, "window": m.window, "run_seed": self.plan.seed,
                "schedule": (m.definition or {}).get("schedule"),
                "vocab_size": m.tokenizer.get("vocab_size"),
                "totals": getattr(m, "totals", None),
                "sources": [{"name": e.name, "format": e.format, "documents": e.documents,
                             "tokens": e.tokens, "mean_tokens": e.mean_tokens_per_doc,
                             "target_share": e.target_share, "token_share": e.token_share,
                             "shards": len(e.shards), "read": e.counts.get("read"),
                             "kept": e.counts.get("kept"),
                             "dropped": dict(e.counts.get("dropped") or {})}
                            for e in m.sources]}


def doc_key(plan, source: str, shard: int, row: int) -> str:
    return f"{plan.sources.index(source)}-{shard}-{row}"


def parse_key(plan, key: str) -> tuple[int, int, int]:
    try:
        s, h, d = (int(x) for x in key.split("-"))
    except ValueError:
        raise SiteError(f"document {key!r}: expected SOURCE-SHARD-ROW numbers") from None
    view = plan.view
    if not (0 <= s < len(view.sources) and 0 <= h < view.sources[s].shards
            and 0 <= d < view.sources[s].shard_documents[h]):
        raise SiteError(f"document {key!r} is not in mix {view.name!r}")
    return s, h, d
