"""The audit collective's rules, each on its own (open1b_audit/crowd/): conditional creates,
one winner per claim, one slot per key, leases that expire, hand-offs checked against the
chain (a forged one refused by name, its sender's work not counted), a forged certificate
refused, resume after ``kill -9`` without losing or rewriting a certificate, every outcome
with its exit code, and flipped bits caught in every file a leg spills or caches.

The run is the suite's micro reference run (8 steps, checkpoints every 2) published to a
local directory; the store is a local directory here (the S3 store is tested in
test_crowd_s3.py and test_crowd_race.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import threading
import time

import pytest
import torch

from open1b_audit.crowd import claim as cl
from open1b_audit.crowd.cache import RunCache
from open1b_audit.crowd.join import JoinOptions, join
from open1b_audit.crowd.leg import EXIT, Auditor, leg_name, run_leg
from open1b_audit.crowd.ledger import cert_path, scan
from open1b_audit.crowd.plan import PlanError, open_plan
from open1b_audit.crowd.publish import publish
from open1b_audit.crowd.report import crowd_report
from open1b_audit.crowd.source import RunSource
from open1b_audit.crowd.store import Store, Taken
from open1b_audit.crowd.windows import ProvedWindows
from open1b_train import runlog
from open1b_train.train import train
from testkit import crowd as cf
from testkit.runs import micro_cfg


@pytest.fixture(scope="module")
def pub(ref_run, mix4, tmp_path_factory) -> str:
    """The reference run and its mix, published to a local directory."""
    root = tmp_path_factory.mktemp("published")
    publish(ref_run, str(root / "run"), "../mix", mix4)
    return str(root / "run")


@pytest.fixture(scope="module")
def long_pub(mix4, tmp_path_factory) -> str:
    """A 16-step micro run with one checkpoint at its end: one unit of 16 steps."""
    root = tmp_path_factory.mktemp("long")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(dataclasses.replace(micro_cfg(steps=16), checkpoint_every=16), mix4,
              str(root / "src"), progress=False)
    finally:
        torch.set_num_threads(n)
    publish(str(root / "src"), str(root / "run"), "../mix", mix4)
    return str(root / "run")


@pytest.fixture(scope="module")
def ks(tmp_path_factory):
    return cf.keys(str(tmp_path_factory.mktemp("keys")), ("alice", "bob", "carol", "liar"))


def _auditor(run: str, store: Store, work, who, ks, leg_steps=1, redundancy=2, lease=600.0,
             heartbeat=30.0) -> Auditor:
    path, key = ks[who]
    cache = RunCache(RunSource(run), str(work / f"cache-{who}"))
    cache.config()
    plan, _ = open_plan(store, cache.run_hash, len(cache.lines) - 1, cache.published_steps(),
                        leg_steps, redundancy, lease, heartbeat)
    return Auditor(store, cache, plan, path, key, who, ProvedWindows(cache),
                   out=open(os.devnull, "w"))


def _claim(aud: Auditor, leg: int, slot: int = 0, gen: int = 0):
    c = cl.try_claim(aud.store, aud.plan, aud.key_path, aud.key, leg, slot, gen)
    assert c is not None
    return c


# ------------------------------------------------------------------------------ the store

def test_a_local_store_creates_each_object_once(tmp_path):
    st = Store(str(tmp_path / "store"))
    assert st.create("a/x.json", b"1") is True
    assert st.create("a/x.json", b"1") is False           # a retry of the same bytes
    with pytest.raises(Taken):
        st.create("a/x.json", b"2")
    assert st.read("a/x.json") == b"1" and set(st.listing("a")) == {"a/x.json"}
    assert st.stats.created == 1
    with pytest.raises(Exception, match="read-only"):
        Store("http://127.0.0.1:1/x")


# ------------------------------------------------------------------------------ claims

def test_one_winner_per_claim_and_one_slot_per_key(pub, tmp_path, ks):
    st = Store(str(tmp_path / "store"))
    a, b = _auditor(pub, st, tmp_path, "alice", ks), _auditor(pub, st, tmp_path, "bob", ks)
    won = []
    gate = threading.Barrier(2)

    def race(aud):
        gate.wait()
        won.append(cl.try_claim(st, aud.plan, aud.key_path, aud.key, 0, 0, 0))
    threads = [threading.Thread(target=race, args=(x,)) for x in (a, b)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(x is None for x in won) == [False, True]          # exactly one winner
    winner = next(x for x in won if x is not None)
    holders = cl.Holders(st)
    views = scan(st, a.plan)
    assert holders.key(views[0].top(0)) == winner.key
    # the winner's key may not take the leg's other slot; the loser may
    me = a if winner.key == a.key else b
    other = b if me is a else a
    now = time.time()
    assert 0 not in [leg for leg, _, _ in cl.choose(views, me.plan, holders, me.key, now,
                                                    random.Random(0))]
    assert (0, 1, 0) in cl.choose(views, other.plan, holders, other.key, now,
                                  random.Random(0), spread=0)
    # two processes of one key racing for two slots: the higher slot gives way
    twin = _claim(me, 0, 1)
    assert cl.duplicate(scan(st, me.plan), me.plan, holders, twin, time.time())


def test_a_silent_claim_expires_and_its_slot_opens_again(pub, tmp_path, ks):
    st = Store(str(tmp_path / "store"))
    a = _auditor(pub, st, tmp_path, "alice", ks, heartbeat=0.3, lease=60)
    b = _auditor(pub, st, tmp_path, "bob", ks)
    c = _claim(a, 2)
    holders = cl.Holders(st)
    assert scan(st, a.plan)[2].slot_status(a.plan, 0, time.time()) == "live"
    c.start_heartbeat()                 # renewals keep it alive past three heartbeats
    time.sleep(1.6)
    assert scan(st, a.plan)[2].slot_status(a.plan, 0, time.time()) == "live"
    c.stop_heartbeat()                  # the auditor dies: no renewal, no final event
    time.sleep(1.6)
    views = scan(st, a.plan)
    assert views[2].slot_status(a.plan, 0, time.time()) == "expired"
    assert (2, 0, 1) in cl.choose(views, b.plan, holders, b.key, time.time(),
                                  random.Random(0), spread=0)
    assert cl.try_claim(st, b.plan, b.key_path, b.key, 2, 0, 1) is not None   # generation 1
    assert cl.try_claim(st, a.plan, a.key_path, a.key, 2, 0, 1) is None


def test_a_plan_is_the_runs_or_refused(pub, ref_run, tmp_path, ks):
    st = Store(str(tmp_path / "store"))
    a = _auditor(pub, st, tmp_path, "alice", ks, leg_steps=1)
    b = _auditor(pub, st, tmp_path, "bob", ks, leg_steps=3)      # the first plan holds
    assert b.plan == a.plan and len(a.plan.legs) == 8
    bad = Store(str(tmp_path / "bad"))
    plan = json.loads(a.plan.encode())
    plan["legs"][0] = [0, 2]
    bad.create("plan.json", json.dumps(plan).encode())
    with pytest.raises(PlanError, match="edited"):
        _auditor(pub, bad, tmp_path, "alice", ks)
    other = Store(str(tmp_path / "other"))
    other.create("plan.json", a.plan.encode().replace(a.plan.run_hash.encode(), b"ab" * 32))
    with pytest.raises(PlanError, match="another store prefix"):
        _auditor(pub, other, tmp_path, "alice", ks)


# ------------------------------------------------------------------------------ hand-offs

def test_a_forged_handoff_is_refused_and_the_liars_work_not_counted(pub, tmp_path, ks):
    lines = runlog.read(pub)
    # an honest state after step 1, from a leg alice ran in a scratch store
    scratch = _auditor(pub, Store(str(tmp_path / "scratch")), tmp_path, "alice", ks)
    assert run_leg(scratch, _claim(scratch, 0)).outcome == "match"
    honest = os.path.join(scratch.cache.root, "legs", leg_name(scratch.store.url, 0, 1),
                          "checkpoints", "step-00000001")
    st = Store(str(tmp_path / "store"))
    liar = _auditor(pub, st, tmp_path, "liar", ks)
    cf.forge_handoff(st, liar.plan, *ks["liar"], 0, honest, lines[1]["hash"])
    liar_cert = cf.forge_certificate(st, lines, 2, *ks["liar"])
    bob = _auditor(pub, st, tmp_path, "bob", ks)
    res = run_leg(bob, _claim(bob, 1))
    assert res.outcome == "inconclusive" and res.exit_code == EXIT["inconclusive"] == 6
    assert "no valid hand-off of step 1" in res.detail["why"]
    views = scan(st, bob.plan)
    forged = views[0].top(0)
    assert forged.status(bob.plan, time.time()) == "void" and len(forged.refusals) == 1
    refusal = json.loads(st.read(forged.refusals[0]))
    assert refusal["key"] == bob.key and "params" in refusal["detail"]["why"]
    # the liar's leg is open again, to another key; alice audits it and hands off honestly
    alice = _auditor(pub, st, tmp_path, "alice", ks)
    assert 0 in [leg for leg, _, _ in cl.choose(views, alice.plan, cl.Holders(st), alice.key,
                                                time.time(), random.Random(0))]
    assert run_leg(alice, _claim(alice, 0, 1)).outcome == "match"
    res = run_leg(bob, _claim(bob, 1, 0, 1))
    assert res.outcome == "match" and "by key " + alice.key[:16] in res.start
    rep = crowd_report(st, bob.cache, 1, None, _announce(), None, str(tmp_path / "w"))
    c = rep["crowd"]
    assert list(c["distrusted"]) == [liar.key]
    assert any("hand-off of step 1" in w for w in c["distrusted"][liar.key])
    assert any("match certificate of step 2" in w for w in c["distrusted"][liar.key])
    assert [r["confirmed"] for r in c["refusals"]] == [True]
    assert any(x["certificate"].endswith(liar_cert) for x in rep["conflicts"])
    assert all(liar.key not in keys for keys in rep["certified"].values())
    assert rep["certified"][1] == [alice.key] and rep["certified"][2] == [bob.key]


def _announce():
    from open1b_train.recipe import Announcement

    return Announcement()


# ------------------------------------------------------------------------------ outcomes

def test_timeout_and_cancel_release_the_leg_and_a_restart_resumes(long_pub, tmp_path, ks):
    st = Store(str(tmp_path / "store"))
    a = _auditor(long_pub, st, tmp_path, "alice", ks, leg_steps=16, redundancy=1)
    a.deadline = time.time() - 1                  # --hours already spent: after one step
    res = run_leg(a, _claim(a, 0))
    assert (res.outcome, res.exit_code, res.certified) == ("timeout", 4, [1])
    views = scan(st, a.plan)
    assert views[0].top(0).final == "timeout" and views[0].slot_status(a.plan, 0,
                                                                       time.time()) == "released"
    a.deadline = None
    a.stop_requested = threading.Event()
    a.stop_requested.set()                        # a stop asked for: after the next step
    res = run_leg(a, _claim(a, 0, 0, 1))
    assert ((res.outcome, res.exit_code, res.resumed_from, res.certified) ==
        ("cancelled", 5, 1, [2]))
    first = st.read(cert_path(1, a.key))
    a.stop_requested = None
    res = run_leg(a, _claim(a, 0, 0, 2))
    assert res.outcome == "match" and res.resumed_from == 2 and res.certified == list(
        range(3, 17))
    assert st.read(cert_path(1, a.key)) == first            # never written twice
    assert sorted(st.listing("certs")) == [cert_path(s, a.key) for s in range(1, 17)]
    assert EXIT == {"match": 0, "mismatch": 1, "timeout": 4, "cancelled": 5,
                    "inconclusive": 6}


def test_kill_9_mid_leg_resumes_from_the_last_verified_state(long_pub, tmp_path, ks):
    store, cache = str(tmp_path / "store"), str(tmp_path / "cache")
    args = cf.join_cmd(long_pub, ks["carol"][0], store, cache, "--leg-steps", "16",
                       "--redundancy", "1", "--heartbeat", "30", "--max-legs", "1")
    p = cf.start_join(args)
    st = Store(store)
    deadline = time.time() + 120
    while not st.exists(cert_path(3, ks["carol"][1])):
        assert p.poll() is None and time.time() < deadline, p.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = {rel: st.read(rel) for rel in st.listing("certs")}
    assert 3 <= len(before) < 16
    views = scan(st, _plan(st))
    assert views[0].top(0).final is None                     # no outcome: it was killed
    p = cf.start_join(args)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err.decode()[-3000:]
    rep = json.loads(out)
    leg = rep["legs"][0]
    # the certificate of a step goes up before its state is spilled: the newest spill is
    # that step's or the one before it
    assert leg["outcome"] == "match" and leg["resumed_from"] >= len(before) - 1 >= 2
    assert "own spilled state" in leg["start"]
    after = {rel: st.read(rel) for rel in st.listing("certs")}
    assert len(after) == 16 and all(after[k] == v for k, v in before.items())
    assert scan(st, _plan(st))[0].top(0).final == "certified"


def test_sigterm_mid_leg_ends_it_cancelled_with_exit_code_5(long_pub, tmp_path, ks):
    store, cache = str(tmp_path / "store"), str(tmp_path / "cache")
    p = cf.start_join(cf.join_cmd(long_pub, ks["alice"][0], store, cache, "--leg-steps", "16",
                                  "--redundancy", "1", "--heartbeat", "30"))
    st = Store(store)
    deadline = time.time() + 120
    while not st.exists(cert_path(2, ks["alice"][1])):
        assert p.poll() is None and time.time() < deadline, p.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 5, err.decode()[-2000:]
    rep = json.loads(out)
    assert rep["outcome"] == "cancelled" and rep["legs"][0]["outcome"] == "cancelled"
    top = scan(st, _plan(st))[0].top(0)
    assert top.final == "cancelled" and top.status(_plan(st), time.time()) == "released"


def _plan(st):
    from open1b_audit.crowd.plan import parse

    return parse(st.read("plan.json"), "plan.json")


def test_a_run_that_differs_ends_mismatch_with_bisect_ready_evidence(mix4, tmp_path, ks):
    import open1b_train.step as S
    from open1b_audit.bisect import trace_step
    from open1b_audit.trace import first_difference, read
    from testkit.tamper import Patch, lr_changed

    run, step = lr_changed(mix4, str(tmp_path / "forged"))    # step 5 trained at 2x the LR
    publish(run, str(tmp_path / "pub" / "run"), "../mix", mix4)
    st = Store(str(tmp_path / "store"))
    opts = JoinOptions(run=str(tmp_path / "pub" / "run"), key_path=ks["bob"][0],
                       store=st.url, cache=str(tmp_path / "cache"), leg_steps=2,
                       redundancy=1, selftest=False, idle_s=0)
    rep = join(opts, open(os.devnull, "w")).to_dict()
    assert rep["outcome"] == "mismatch" and rep["exit_code"] == 1
    bad = [x for x in rep["legs"] if x["outcome"] == "mismatch"]
    assert [x["detail"]["finding"]["step"] for x in bad] == [step]
    # every other leg matched; step 6 follows the differing step 5 in its leg
    assert rep["steps_certified"] == [1, 2, 3, 4, 7, 8]
    ev = bad[0]["detail"]["evidence"]
    cert = json.loads(st.read(ev["certificate"]))
    assert cert["verdict"] == "mismatch" and cert["step"] == step
    assert json.loads(st.read(ev["finding"]))["component"] == "scalars"      # the LR
    mine = str(tmp_path / "auditor.jsonl")
    with open(mine, "wb") as f:
        f.write(st.read(ev["trace"]))
    # the run owner traces the step on their machine; the two traces name the operator
    real = S.apply_update

    def doubled(cfg, specs, params, layout, grad, loss, opt, s, lr, **kw):
        return real(cfg, specs, params, layout, grad, loss, opt, s, lr * 2 if s == 5 else lr,
                    **kw)
    with Patch(S, "apply_update", doubled):
        owner = trace_step(run, step)
    assert owner.replay.ok                                 # their machine reproduces their log
    at, ops = read(mine)
    d = first_difference(ops, owner.ops)
    assert at == step and d is not None and d["stage"] == "optim" and d["op"] == "adamw"


def test_a_machine_the_doctor_refuses_claims_nothing(long_pub, tmp_path, ks):
    from click.testing import CliRunner

    from open1b_audit.cli import main

    store = str(tmp_path / "store")
    res = CliRunner().invoke(main, ["join", long_pub, "--key", ks["alice"][0], "--store", store,
                                    "--cache", str(tmp_path / "c"), "--no-selftest",
                                    "--leg-steps", "16", "--lease", "1"])
    assert res.exit_code == 6, res.output
    assert "cannot take a leg" in res.output and "lease" in res.output
    assert not Store(store).listing("ledger")


# ------------------------------------------------------------------------------ flipped bits

def test_flipped_bits_are_caught_in_every_cached_and_spilled_file(pub, tmp_path, ks):
    from open1b_audit.crowd.source import SourceError
    from open1b_train.errors import SpillError
    from open1b_train.reduction.treefold import file_spill

    # a published checkpoint file that is not its record's
    bad = str(tmp_path / "bad")
    shutil.copytree(os.path.dirname(pub), bad)
    p = os.path.join(bad, "run", "checkpoints", "step-00000004", "params.safetensors")
    data = bytearray(open(p, "rb").read())
    data[-3] ^= 1
    open(p, "wb").write(bytes(data))
    rc = RunCache(RunSource(os.path.join(bad, "run")), str(tmp_path / "c1"))
    with pytest.raises(SourceError, match="params.safetensors: sha256"):
        rc.checkpoint(4)
    # a FIFO in place of a published file is refused, never waited on
    q = os.path.join(bad, "run", "checkpoints", "step-00000006", "params.safetensors")
    os.unlink(q)
    os.mkfifo(q)
    with pytest.raises(SourceError, match="not a regular file"):
        rc.checkpoint(6)
    # a cached step's windows: fetched again
    a = _auditor(pub, Store(str(tmp_path / "store")), tmp_path, "alice", ks)
    toks = a.windows.tokens(3)
    f = os.path.join(a.cache.root, "data", "step-00000003.npy")
    raw = bytearray(open(f, "rb").read())
    raw[-1] ^= 1
    open(f, "wb").write(bytes(raw))
    fetched = a.windows.bytes_total
    assert (a.windows.tokens(3) == toks).all() and a.windows.bytes_total > fetched
    # a spilled state of a leg: the resume falls back to the state before it
    b = _auditor(pub, Store(str(tmp_path / "store2")), tmp_path, "bob", ks, leg_steps=2)
    b.deadline = time.time() - 1
    assert run_leg(b, _claim(b, 0)).outcome == "timeout"          # spilled step 1
    spill = os.path.join(b.cache.root, "legs", leg_name(b.store.url, 0, 2), "checkpoints",
                         "step-00000001", "optim-00000-of-00001.safetensors")
    raw = bytearray(open(spill, "rb").read())
    raw[-5] ^= 1
    open(spill, "wb").write(bytes(raw))
    b.deadline = None
    first = b.store.read(cert_path(1, b.key))
    res = run_leg(b, _claim(b, 0, 0, 1))
    assert res.outcome == "match" and res.resumed_from is None and res.certified == [1, 2]
    assert b.store.read(cert_path(1, b.key)) == first
    assert "initial state" in res.start
    # the lean plan's moments, kept in files while a step runs
    from open1b_train.memory.diskflat import DiskFlat

    flat = DiskFlat(str(tmp_path), "m", 64)
    flat.write(0, torch.arange(64, dtype=torch.float32))
    assert torch.equal(flat.read(0, 64), torch.arange(64, dtype=torch.float32))
    with open(flat.path, "r+b") as fh:
        fh.seek(17)
        b = fh.read(1)
        fh.seek(17)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(SpillError, match="changed on disk"):
        flat.read(0, 64)
    flat.close()
    # a TreeFold partial spilled to disk
    sp = file_spill(str(tmp_path / "fold"))
    load = sp(torch.arange(8, dtype=torch.float32))
    name = os.listdir(str(tmp_path / "fold"))[0]
    q = os.path.join(str(tmp_path / "fold"), name)
    raw = bytearray(open(q, "rb").read())
    raw[-1] ^= 1
    open(q, "wb").write(bytes(raw))
    with pytest.raises(SpillError, match="changed on disk"):
        load()


def test_a_leg_under_the_lean_plan_spills_and_hands_off_the_same_state(pub, tmp_path, ks):
    """The lean plan streams the moments from files and spills with save_streamed: the
    state it hands off is the chain's (checked on receipt)."""
    st = Store(str(tmp_path / "store"))
    a = _auditor(pub, st, tmp_path, "alice", ks, redundancy=1)
    a.memory_plan = "lean"
    res = run_leg(a, _claim(a, 0))
    assert res.outcome == "match"
    b = _auditor(pub, st, tmp_path, "bob", ks, redundancy=1)
    res = run_leg(b, _claim(b, 1))
    assert res.outcome == "match" and "by key " + a.key[:16] in res.start


def test_a_run_that_logs_validation_losses_replays_from_its_url(tmp_path):
    """A validation step's hashed scalars hold the held-out losses: the replay reads the
    held-out windows from the mix itself (the cache's mirror holds no shards)."""
    from click.testing import CliRunner

    from open1b_audit.cli import main
    from testkit.trainmix import train_mix

    mix = train_mix(tmp_path / "mix", steps=8, batch=4, heldout="0.2")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(micro_cfg(steps=4, eval_every=2), mix, str(tmp_path / "src"), progress=False)
    finally:
        torch.set_num_threads(n)
    lines = runlog.read(str(tmp_path / "src"))
    assert "val_loss" in lines[4]["scalars"]
    publish(str(tmp_path / "src"), str(tmp_path / "pub" / "run"), "../mix", mix)
    res = CliRunner().invoke(main, ["replay", f"file://{tmp_path}/pub/run", "--step", "4",
                                    "--expect-run-hash", lines[-1]["hash"], "--json"],
                             env={"OPEN1B_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verdict"] == "match"
