"""The audit collective end to end, on a real S3-compatible server on loopback: a run
published to the store, four auditor processes racing with redundancy 2 until it is
covered, one of them killed with ``kill -9`` mid-leg and started again, a lying auditor
whose forged hand-off and forged certificate are refused and whose key's work is not
counted, and the server restarted mid-run.

What the restart shows: the server stops (connections refused) for a few seconds and comes
back on the same port with what it stored - moto keeps its objects in this test's process,
as a real server keeps them on its disk. The auditors' requests during the outage are
retried; afterwards every object written before, during and after it is there and
verifies, no claim or certificate was written twice, and the run is covered. (What a real
server loses in a crash - writes it acknowledged but did not persist - is not simulated.)"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest
import torch

from open1b_audit.crowd.cache import RunCache
from open1b_audit.crowd.claim import Holders
from open1b_audit.crowd.leg import Auditor, leg_name, run_leg
from open1b_audit.crowd.ledger import scan
from open1b_audit.crowd.plan import open_plan
from open1b_audit.crowd.publish import publish
from open1b_audit.crowd.report import crowd_report
from open1b_audit.crowd.source import RunSource
from open1b_audit.crowd.store import Store
from open1b_audit.crowd.windows import ProvedWindows
from open1b_train import runlog
from open1b_train.recipe import Announcement
from open1b_train.train import train
from testkit import crowd as cf
from testkit.runs import micro_cfg

pytestmark = [pytest.mark.slow, pytest.mark.s3]
pytest.importorskip("moto.server")

STEPS, EVERY, LEG = 16, 4, 2             # 4 units of 4 steps, 8 legs of 2 steps
HEARTBEAT = 5.0                          # a claim silent for 3 x 5 s + 5 s has expired
DOWN = 12.0                              # longer than s3fs's own retries (~10 s)


def _train(mix: str, out: str) -> str:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(dataclasses.replace(micro_cfg(steps=STEPS), checkpoint_every=EVERY), mix, out,
              progress=False)
    finally:
        torch.set_num_threads(n)
    return out


def test_four_auditors_race_a_liar_a_kill_and_a_restart(monkeypatch, mix4, tmp_path):
    moto = cf.Moto()
    try:
        cf.use_moto(monkeypatch, moto)
        _race(moto, mix4, tmp_path)
    finally:
        moto.stop()


def _race(moto, mix4, tmp_path) -> None:
    src = _train(mix4, str(tmp_path / "src"))
    run, store_url = f"s3://{cf.BUCKET}/race/run", f"s3://{cf.BUCKET}/race/audit"
    publish(src, run, "../mix", mix4)
    lines = runlog.read(src)
    ks = cf.keys(str(tmp_path / "keys"), ("a1", "a2", "a3", "a4", "liar"))
    st = Store(store_url)
    cache = RunCache(RunSource(run), str(tmp_path / "liar-cache"))
    cache.config()
    plan, created = open_plan(st, cache.run_hash, STEPS, cache.published_steps(), LEG, 2,
                              600.0, HEARTBEAT)
    assert created and len(plan.legs) == 8
    # the liar: a true state after step 2 (from a scratch store), one ULP off, handed off in
    # leg 0; and a match certificate of step 3 it never replayed
    scratch = Store(str(tmp_path / "scratch"))
    sp, _ = open_plan(scratch, cache.run_hash, STEPS, cache.published_steps(), LEG, 1, 600, 30)
    aud = Auditor(scratch, cache, sp, *ks["liar"], "liar", ProvedWindows(cache),
                  out=open(os.devnull, "w"))
    from open1b_audit.crowd.claim import try_claim

    assert run_leg(aud, try_claim(scratch, sp, *ks["liar"], 0, 0, 0)).outcome == "match"
    honest = os.path.join(cache.root, "legs", leg_name(scratch.url, 0, 2), "checkpoints",
                          "step-00000002")
    cf.forge_handoff(st, plan, *ks["liar"], 0, honest, lines[2]["hash"])
    cf.forge_certificate(st, lines, 3, *ks["liar"])

    caches = str(tmp_path / "caches")
    env = moto.env()
    logs = {k: str(tmp_path / f"{k}.log") for k in ("a1", "a2", "a3", "a4", "a4-again")}

    def start(who: str, log: str):
        return cf.start_join(cf.join_cmd(run, ks[who][0], store_url, caches, "--poll", "0.3",
                                         "--idle", "60", "--auditor", who), env, log)
    procs = {k: start(k, logs[k]) for k in ("a1", "a2", "a3", "a4")}
    t0 = time.time()
    # kill a4 in the middle of a leg: it holds a live claim and certified its first step
    killed = None
    while killed is None:
        assert time.time() - t0 < 240, "a4 never got mid-leg"
        assert procs["a4"].poll() is None, open(logs["a4"]).read()[-3000:]
        views = scan(st, plan)
        holders = Holders(st)
        for lv in views.values():
            for cv in lv.claims.values():
                a, b = plan.legs[cv.leg]
                if cv.status(plan, time.time()) != "live" or holders.key(cv) != ks["a4"][1]:
                    continue
                if (st.exists(f"certs/step-{a + 1:08d}/{ks['a4'][1][:16]}.json") and
                        not st.exists(f"certs/step-{b:08d}/{ks['a4'][1][:16]}.json")):
                    os.kill(procs["a4"].pid, signal.SIGKILL)
                    killed = cv
                    break
            if killed:
                break
        time.sleep(0.05)
    procs["a4"].wait()
    before = {rel: st.read(rel) for rel in st.listing("")}
    moto.restart(down_s=DOWN)                     # the server goes away and comes back
    procs["a4-again"] = start("a4", logs["a4-again"])
    outs = {}
    for k in ("a1", "a2", "a3", "a4-again"):
        out, _ = procs[k].communicate(timeout=600)
        outs[k] = json.loads(out) if out.strip() else {}
        assert procs[k].returncode in (0, 6), open(logs[k]).read()[-3000:]
    # nothing written before the restart is lost or changed
    after = {rel: st.read(rel) for rel in st.listing("")}
    assert all(after.get(rel) == data for rel, data in before.items())
    assert sum(o["store"]["retries"] for o in outs.values() if o) > 0
    # the killed auditor's leg was finished: by itself, resumed, or by another after expiry
    lv = scan(st, plan)[killed.leg]
    assert lv.slot_status(plan, killed.slot, time.time()) == "done"
    # the whole run, at redundancy 2, by the four honest keys; the liar's work not counted
    rep = crowd_report(st, cache, 2, {ks[k][1] for k in ks}, Announcement(
        lines[-1]["hash"]), None, str(tmp_path / "work"))
    c = rep["crowd"]
    assert rep["covered"] == STEPS and rep["gaps"] == [], rep["gaps"]
    assert c["legs_covered"] == 8 and not c["in_flight"] and not c["forged_events"]
    assert list(c["distrusted"]) == [ks["liar"][1]]
    assert all(ks["liar"][1] not in keys for keys in rep["certified"].values())
    assert any(r["confirmed"] and r["sender"] == ks["liar"][1] for r in c["refusals"])
    assert [x["step"] for x in rep["conflicts"]] == [3]
    certs = [rel for rel in after if rel.startswith("certs/")]
    assert len(certs) == len(set(certs)) >= 2 * STEPS + 1
    # the killed auditor, started again, went on with its own claim (from its spilled state
    # if it had written one) - or another key took the slot over once the claim expired
    again = lv.claims[(killed.slot, killed.gen)]
    resumed = again.final == "certified" and any(
        json.loads(st.read(rel))["detail"].get("why") == "resumed after a restart"
        for rel in again.has("renewed"))
    took_over = [cv for cv in lv.claims.values()
                 if cv.slot == killed.slot and cv.gen > killed.gen]
    assert resumed or took_over
