"""Ways to tamper with a published run (each used by tests/audit/test_tamper.py and by
benchmarks/audit/audit_tamper.py, which reports how many are caught).

``CASES`` maps each way to the (component, step) the audit must name (step None: the
first step that reads the tampered shard); ``make`` builds the tampered copy."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from open1b_audit.chain import Finding
from open1b_data import StreamPlan
from open1b_train import checkpoint, runlog, statehash
from open1b_train.train import train
from tests.train.conftest import micro_cfg

STEPS = 8          # the honest run: micro preset, 4 windows per step, checkpoints every 2


def _rewrite_file_in_record(ck_dir: str, name: str, data: bytes) -> None:
    """Replace a checkpoint file and fix its sha256 in the record, as a forger would."""
    with open(os.path.join(ck_dir, name), "wb") as f:
        f.write(data)
    rpath = os.path.join(ck_dir, "record.json")
    rec = json.load(open(rpath))
    rec["files"][name] = hashlib.sha256(data).hexdigest()
    json.dump(rec, open(rpath, "w"), sort_keys=True, indent=1)


def rehash_chain(lines: list[dict], start: int) -> None:
    """Recompute every hash from line ``start`` on, so the edited log is a valid chain."""
    for s in range(start, len(lines)):
        ln = lines[s]
        if s == 0:
            ln["hash"] = statehash.genesis_hash(ln["genesis"])
            continue
        ln["prev"] = lines[s - 1]["hash"]
        ln["components"]["scalars"] = statehash.sha(ln["scalars"])
        ln["hash"] = statehash.step_hash(s, ln["prev"], ln["components"])


def token_in_shard(run: str, mix: str, work: str) -> tuple[str, str, int]:
    """A copy of the mix with one token of a window of step 7 changed in its shard (still
    valid Parquet; the manifest untouched). Returns (run, mix copy, the first step that
    reads that shard - shards are checked whole, so that is where it is caught)."""
    mix2 = os.path.join(work, "mix")
    shutil.copytree(mix, mix2)
    plan = StreamPlan.open(mix2)
    from open1b_data.stream.schedule import Schedule

    first = Schedule.from_definition(plan.view.definition).step(7).first_window
    seg = plan.segments(first)[0]
    src = plan.sources.index(seg.source)
    path = os.path.join(mix2, plan.view.sources[src].shard_paths[seg.shard])
    table = pq.read_table(path)
    meta = pq.read_metadata(path)
    toks = table.column("tokens").to_pylist()
    toks[seg.doc][seg.doc_start] = (toks[seg.doc][seg.doc_start] + 1) % 400
    table = table.set_column(table.schema.get_field_index("tokens"), "tokens",
                             pa.array(toks, type=table.schema.field("tokens").type))
    table = table.replace_schema_metadata(table.schema.metadata)
    pq.write_table(table, path, compression="zstd",
                   row_group_size=meta.row_group(0).num_rows)
    sched = Schedule.from_definition(plan.view.definition)
    first_use = next(sched.step_of_window(m) for m in range(sched.total_windows)
                     if any((x.source, x.shard) == (seg.source, seg.shard)
                            for x in plan.segments(m)))
    return run, mix2, first_use


def _dishonest(run_dir: str, mix: str, patch, cfg=None) -> None:
    """Train the honest config, but with ``patch`` active (a dishonest trainer)."""
    with patch():
        train(cfg or micro_cfg(steps=STEPS), mix, run_dir, progress=False)


def ulp_weight(run: str, work: str) -> tuple[str, int]:
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    ck = checkpoint.step_dir(r, 6)
    t = st_load(open(os.path.join(ck, "params.safetensors"), "rb").read())
    w = t["layers.1.mlp.down.weight"]
    w.view(torch.int16).view(-1)[17] += 1          # one bf16 ULP
    _rewrite_file_in_record(ck, "params.safetensors", st_save(t))
    return r, 6


def moments(run: str, work: str) -> tuple[str, int]:
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    ck = checkpoint.step_dir(r, 6)
    name = next(n for n in sorted(os.listdir(ck)) if n.startswith("optim-"))
    t = st_load(open(os.path.join(ck, name), "rb").read())
    key = next(k for k in sorted(t) if k.startswith("m."))
    t[key].view(-1)[3] += 1e-3
    _rewrite_file_in_record(ck, name, st_save(t))
    return r, 6


def other_checkpoint(run: str, other: str, work: str) -> tuple[str, int]:
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    shutil.rmtree(checkpoint.step_dir(r, 6))
    shutil.copytree(checkpoint.step_dir(other, 6), checkpoint.step_dir(r, 6))
    return r, 6


def skipped_step(run: str, work: str) -> tuple[str, int]:
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    lines = runlog.read(r)
    del lines[5]
    runlog.rewrite(r, lines)
    return r, 5


def edited_line(run: str, work: str, rehash: bool) -> tuple[str, int]:
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    lines = runlog.read(r)
    if rehash:                                   # a forger who rebuilds the whole chain
        lines[7]["components"]["params"] = lines[6]["components"]["params"]
        rehash_chain(lines, 7)
    else:
        lines[7]["scalars"]["loss"] = "40000000"
    runlog.rewrite(r, lines)
    return r, 7


def other_seed(mix: str, work: str) -> tuple[str, int]:
    """Trained with seed 7, published as seed 42 (config, genesis and the chain rewritten)."""
    r = os.path.join(work, "run")
    train(micro_cfg(steps=STEPS, seed=7), mix, r, progress=False)
    cfgp = os.path.join(r, "config.json")
    cfg = json.load(open(cfgp))
    cfg["seed"] = 42
    json.dump(cfg, open(cfgp, "w"))
    from open1b_train.config import from_dict

    ident = from_dict(cfg).identity_sha256()
    lines = runlog.read(r)
    lines[0]["genesis"]["seed"] = 42
    lines[0]["genesis"]["config_identity"] = ident
    rehash_chain(lines, 0)
    runlog.rewrite(r, lines)
    for s in checkpoint.list_steps(r):
        rp = os.path.join(checkpoint.step_dir(r, s), "record.json")
        rec = json.load(open(rp))
        rec.update(seed=42, config_identity=ident, run_hash=lines[s]["hash"], config=cfg)
        json.dump(rec, open(rp, "w"), sort_keys=True, indent=1)
    return r, 7


@dataclasses.dataclass
class Patch:
    """A context manager over monkeypatching (no pytest needed: also used by benchmarks)."""

    target: object
    name: str
    value: object

    def __enter__(self):
        self.old = getattr(self.target, self.name)
        setattr(self.target, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.target, self.name, self.old)


def swapped_windows(mix: str, work: str) -> tuple[str, int]:
    """A trainer that swapped two windows' contents in step 5."""
    import open1b_train.loop as L

    real = L.micro_batches

    def swapping(items, V, device):
        b = real(items, V, device)
        if b[0][0].windows[0] == 5 * 4 - 4:        # step 5's first window (4 per step)
            a, c = b[0][0], b[0][1]
            b[0][0] = dataclasses.replace(a, tokens=c.tokens)
            b[0][1] = dataclasses.replace(c, tokens=a.tokens)
        return b
    r = os.path.join(work, "run")
    _dishonest(r, mix, lambda: Patch(L, "micro_batches", swapping))
    return r, 5


def lr_changed(mix: str, work: str) -> tuple[str, int]:
    import open1b_train.step as S

    real = S.apply_update

    def doubled(cfg, specs, params, layout, grad, loss, opt, step, lr, **kw):
        return real(cfg, specs, params, layout, grad, loss, opt, step,
                    lr * 2 if step == 5 else lr, **kw)
    r = os.path.join(work, "run")
    import open1b_train.train as T
    _dishonest(r, mix, lambda: Patch(T, "apply_update", doubled))
    return r, 5


def rank_gradient(mix: str, work: str) -> tuple[str, int]:
    """Mesh 2x1: virtual rank 1's gradient scaled by 1.001 in step 5."""
    import open1b_train.step as S

    real = S._into
    calls = {"n": 0}

    def altered(flat, layout, grads, r, add):
        calls["n"] += 1
        # mesh 2x1, 2 micro-batches per rank: calls 4k+1..4k+4 are step k+1's, the last
        # two rank 1's
        if 4 * 4 < calls["n"] <= 4 * 5 and calls["n"] > 4 * 4 + 2:
            grads = {k: g * 1.001 for k, g in grads.items()}
        return real(flat, layout, grads, r, add)
    r = os.path.join(work, "run")
    _dishonest(r, mix, lambda: Patch(S, "_into", altered), micro_cfg(steps=STEPS, mesh=(2, 1)))
    return r, 5


def stream_position(run: str, work: str) -> tuple[str, int]:
    """The packing buffer's offset edited in checkpoint 4's record (no hash covers it): a
    run resumed from it would train steps 5.. on windows that are not the stream's."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    for s in (4, 6, 8):
        rpath = os.path.join(checkpoint.step_dir(r, s), "record.json")
        rec = json.load(open(rpath))
        buf = rec["loader"]["stream"]["buffer"]
        if buf is not None:
            buf["offset"] = buf["offset"] - 1 if buf["offset"] > 1 else buf["offset"] + 1
        else:
            rec["loader"]["stream"]["window"] += 1
        json.dump(rec, open(rpath, "w"), sort_keys=True, indent=1)
    return r, 4


def one_interval(mix: str, run: str, work: str) -> tuple[str, int]:
    """Forged at one checkpoint only: checkpoint 6's first moment changed, the log's optim
    digest of step 6 rewritten to it and the chain re-hashed, then steps 7-8 trained
    honestly from it (a sound bisect must not say "all reproduce")."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    ck = checkpoint.step_dir(r, 6)
    name = next(n for n in sorted(os.listdir(ck)) if n.startswith("optim-"))
    t = st_load(open(os.path.join(ck, name), "rb").read())
    key = next(k for k in sorted(t) if k.startswith("m."))
    t[key].view(-1)[5] += 1e-3
    _rewrite_file_in_record(ck, name, st_save(t))
    loaded = checkpoint.load(ck)
    rec = loaded.record
    lines = runlog.read(r)[:7]
    lines[6]["components"]["optim"] = statehash.optim_digest(
        loaded.m, loaded.v, rec["adam_step"], rec["skip_left"])
    rehash_chain(lines, 6)
    runlog.rewrite(r, lines)
    rpath = os.path.join(ck, "record.json")
    rec = json.load(open(rpath))
    rec["run_hash"] = lines[6]["hash"]
    json.dump(rec, open(rpath, "w"), sort_keys=True, indent=1)
    shutil.rmtree(checkpoint.step_dir(r, 8))
    train(micro_cfg(steps=STEPS), mix, r, progress=False)
    return r, 6


def data_and_manifest(run: str, mix: str, work: str) -> tuple[str, str, int]:
    """A token changed in a shard and the manifest rewritten to match it (the shard's sha256
    and size, the fingerprint recomputed): a consistent mix, but not the one the run's
    genesis names."""
    from open1b_data.build.manifest import fingerprint

    run, mix2, _ = token_in_shard(run, mix, work)
    mpath = os.path.join(mix2, "manifest.json")
    man = json.load(open(mpath))
    for src in man["sources"]:
        for sh in src["shards"]:
            data = open(os.path.join(mix2, sh["path"]), "rb").read()
            sh["sha256"], sh["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    man["fingerprint"] = fingerprint(man)
    json.dump(man, open(mpath, "w"), indent=1, sort_keys=True)
    return run, mix2, 0


def record_counter(run: str, work: str) -> tuple[str, int]:
    """The Adam step counter edited in checkpoint 6's record (the file hashes untouched)."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    rpath = os.path.join(checkpoint.step_dir(r, 6), "record.json")
    rec = json.load(open(rpath))
    rec["adam_step"] += 1
    json.dump(rec, open(rpath, "w"), sort_keys=True, indent=1)
    return r, 6


def shown_window_range(run: str, work: str) -> tuple[str, int]:
    """The unhashed ``windows`` a reader sees for step 3 edited (the chain still holds)."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    lines = runlog.read(r)
    lines[3]["windows"] = [w + 4 for w in lines[3]["windows"]]
    runlog.rewrite(r, lines)
    return r, 3


def recipe_departure(mix: str, work: str) -> tuple[str, int]:
    """Trained with an injected spike at step 3 (a recipe change declared in config.json):
    every step reproduces, so the audit must flag the departure itself."""
    r = os.path.join(work, "run")
    train(micro_cfg(steps=STEPS, inject_spike=(3,)), mix, r, progress=False)
    return r, 0


def truncated_log(run: str, work: str) -> tuple[str, int]:
    """The last two lines removed: a valid, shorter chain with another run hash."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    runlog.rewrite(r, runlog.read(r)[:STEPS - 1])
    return r, STEPS - 1


def cut_last_line(run: str, work: str) -> tuple[str, int]:
    """The last line cut off mid-way (no newline): the complete lines still chain."""
    r = os.path.join(work, "run")
    shutil.copytree(run, r)
    p = runlog.path_of(r)
    raw = open(p, "rb").read()
    open(p, "wb").write(raw[:-40])
    return r, STEPS


def rechained_suffix(run: str, work: str) -> tuple[str, int]:
    """Step 7's loss edited and the chain re-hashed from there: same length, valid chain,
    another run hash (the replay would name step 7; the pin refuses before any work)."""
    r, _ = edited_line(run, work, rehash=True)
    return r, STEPS


CASES = {
    "a token of one window changed in a shard": ("data", None),   # the shard's first use
    "two windows of a step swapped": ("data", 5),
    "one weight changed by 1 ULP in a checkpoint": ("params", 6),
    "a step skipped (its line removed)": ("log", 5),
    "the LR of one step changed": ("scalars", 5),
    "one virtual rank's gradient altered": ("grad", 5),
    "a different seed": ("params", 0),          # the init re-derived from the claimed seed
    "optimizer moments altered": ("optim", 6),
    "a checkpoint of another run substituted": ("checkpoint", 6),
    "a steps.jsonl line edited": ("scalars", 7),
    "a steps.jsonl line edited, the chain rehashed": ("params", 7),
    "the stream position edited in a checkpoint record": ("checkpoint", 4),
    "one checkpoint forged, the chain re-hashed, trained on honestly": ("optim", 6),
    "a shard and its manifest rewritten together": ("data", 0),
    "the Adam step counter edited in a checkpoint record": ("optim", 6),
    "a step's shown window range edited (unhashed field)": ("log", 3),
    "a spike injected by the config (a recipe departure)": ("config", 0),
    "the log truncated (pinned to the published run hash)": ("log", STEPS - 1),
    "the last line cut off (pinned)": ("log", STEPS),
    "a re-chained suffix (pinned)": ("log", STEPS + 1),   # no step has the hash
}
PINNED = ("(pinned", "pinned to the published")   # cases audited with --expect-run-hash


def make(case: str, ref_run: str, mix4: str, other_run: str, work: str):
    """The tampered copy for ``case``: (run, mix to audit with or None for the run's own,
    the step a shard change is first read at or None)."""
    at = None
    mix = None
    if case.startswith("the log truncated"):
        run, _ = truncated_log(ref_run, work)
    elif case.startswith("the last line cut off"):
        run, _ = cut_last_line(ref_run, work)
    elif case.startswith("a re-chained suffix"):
        run, _ = rechained_suffix(ref_run, work)
    elif case.startswith("the stream position"):
        run, _ = stream_position(ref_run, work)
    elif case.startswith("one checkpoint forged"):
        run, _ = one_interval(mix4, ref_run, work)
    elif case.startswith("a shard and its manifest"):
        run, mix, at = data_and_manifest(ref_run, mix4, work)
    elif case.startswith("the Adam step counter"):
        run, _ = record_counter(ref_run, work)
    elif case.startswith("a step's shown window"):
        run, _ = shown_window_range(ref_run, work)
    elif case.startswith("a spike injected"):
        run, _ = recipe_departure(mix4, work)
    elif case.startswith("a token"):
        run, mix, at = token_in_shard(ref_run, mix4, work)
    elif case.startswith("two windows"):
        run, _ = swapped_windows(mix4, work)
    elif case.startswith("one weight"):
        run, _ = ulp_weight(ref_run, work)
    elif case.startswith("a step skipped"):
        run, _ = skipped_step(ref_run, work)
    elif case.startswith("the LR"):
        run, _ = lr_changed(mix4, work)
    elif case.startswith("one virtual rank"):
        run = other_run
    elif case.startswith("a different seed"):
        run, _ = other_seed(mix4, work)
    elif case.startswith("optimizer"):
        run, _ = moments(ref_run, work)
    elif case.startswith("a checkpoint of another"):
        run, _ = other_checkpoint(ref_run, other_run, work)
    else:
        run, _ = edited_line(ref_run, work, rehash="rehashed" in case)
    return run, mix, at


def audit_all(run: str, mix: str | None = None, expect: str | None = None):
    """The first finding of pinning the log to the published run hash ``expect`` (when
    given), then of replaying every interval between checkpoints, in order."""
    from open1b_audit import chain
    from open1b_audit.replay import replay

    if expect is not None:
        log = runlog.read_log(run)
        found = chain.pin(log.lines, expect, log.partial_bytes)
        if found is not None:
            return found

    marks = [0] + [c for c in checkpoint.list_steps(run) if c > 0]
    last = max(marks)
    for a, b in zip(marks, marks[1:] + ([last] if last == marks[-1] else [])):
        if b <= a:
            continue
        res = replay(run, b, mix=mix, from_step=a if a in checkpoint.list_steps(run) else 0)
        if res.finding is not None:
            return res.finding
        if res.recipe and res.recipe["departures"]:     # an auditor of the published recipe
            return Finding(0, "config", f"departs from the {res.recipe['preset']} preset in "
                           + ", ".join(d["field"] for d in res.recipe["departures"]))
    return None
