"""The schedule (SPEC 3 exact rule): closed-form lookups against a step-by-step reference,
the Open-1B numbers of the SPEC table, learning rate, and rank assignment."""
import math
import random

import pytest

from open1b_data.errors import StreamError
from open1b_data.formats.definition import Phase, ScheduleSpec, default_mix_path, load_mix
from open1b_data.stream.schedule import Schedule, open1b_spec, rank_of


def reference(spec: ScheduleSpec) -> list[tuple[int, int, int, int]]:
    """(step, batch, tokens_before, first_window) by literally walking the rule."""
    out, step, tokens, window = [], 1, 0, 0
    while True:
        batch = [p.batch_sequences for p in spec.phases if p.start_tokens <= tokens][-1]
        out.append((step, batch, tokens, window))
        tokens += batch * spec.seq_tokens
        window += batch
        if tokens >= spec.stop_tokens:
            return out
        step += 1


ODD = ScheduleSpec(seq_tokens=10, micro_batch=2, reference_world=1,
                   phases=(Phase(0, 4), Phase(95, 6), Phase(100, 2), Phase(1000, 8)),
                   stop_tokens=1234, lr_peak=1.0, lr_final_ratio=0.25, warmup_tokens=77)


@pytest.mark.parametrize("spec", [open1b_spec(), load_mix(default_mix_path()).schedule, ODD],
                         ids=["open1b", "demo", "odd"])
def test_closed_form_matches_walk(spec):
    sched = Schedule(spec)
    ref = reference(spec)
    assert sched.last_step == len(ref)
    rng = random.Random(0)
    picks = sorted(set(range(1, min(len(ref), 300) + 1)) | {len(ref)} |
                   {rng.randint(1, len(ref)) for _ in range(500)})
    for s in picks:
        step, batch, before, first = ref[s - 1]
        info = sched.step(s)
        assert ((info.batch_sequences, info.tokens_before, info.first_window) ==
               (batch, before, first))
        assert info.tokens_after == before + batch * spec.seq_tokens
        assert sched.step_of_token(before) == s
        assert sched.step_of_token(info.tokens_after - 1) == s
        assert sched.step_of_window(first) == s
        assert sched.step_of_window(first + batch - 1) == s
    assert sched.total_tokens == ref[-1][2] + ref[-1][1] * spec.seq_tokens
    assert sched.total_tokens >= spec.stop_tokens > ref[-1][2]


def test_open1b_table():
    sched = Schedule(open1b_spec())
    assert sched.last_step == 80957           # the step the README's audit example inspects
    assert [(r.batch, r.first_step) for r in sched.runs] == [(768, 1), (1152, 1273),
                                                             (2304, 76719)]
    assert sched.step(1272).tokens_before == 1271 * 3_145_728 < 4_000_000_000
    assert sched.step(1273).tokens_before >= 4_000_000_000
    assert [sched.accumulation(s, 48) for s in (1, 1273, 80957)] == [4, 6, 12]
    assert sched.step(1273).batch_sequences * 4096 == 4_718_592
    assert sched.total_windows == sched.total_tokens // 4096 == 97_657_344


def test_learning_rate():
    spec = open1b_spec()
    sched = Schedule(spec)
    # warmup: linear in tokens_after, peak reached exactly after 667 warmup-batch steps
    assert sched.step(1).lr == pytest.approx(4.5e-4 / 667, rel=1e-12)
    assert sched.step(667).lr == 4.5e-4
    assert sched.step(80957).lr == pytest.approx(4.5e-5, rel=1e-12)
    lrs = [sched.step(s).lr for s in range(667, 80958, 997)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))       # cosine decays monotonically
    t = sched.step(40000).tokens_after
    p = (t - spec.warmup_tokens) / (spec.stop_tokens - spec.warmup_tokens)
    want = 4.5e-5 + (4.5e-4 - 4.5e-5) * 0.5 * (1 + math.cos(math.pi * p))
    assert sched.step(40000).lr == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8, 12, 16, 48])
def test_rank_plan_partitions_step(world):
    sched = Schedule(open1b_spec())
    for step in (1, 2, 1273, 80957):
        info = sched.step(step)
        seen = []
        for r in range(world):
            rp = sched.rank_plan(step, world, r)
            assert rp.accumulation == info.batch_sequences // (world * 4)
            flat = [m for mb in rp.micro_batches for m in mb]
            assert all(len(mb) == 4 for mb in rp.micro_batches)
            assert flat == sorted(flat) and all(rank_of(m, world) == r for m in flat)
            seen += flat
        assert sorted(seen) == list(info.windows)


def test_bad_requests_fail_clearly():
    sched = Schedule(open1b_spec())
    with pytest.raises(StreamError, match="world size 5 does not fit step 1"):
        sched.rank_plan(1, 5, 0)
    with pytest.raises(StreamError, match="world size 7"):
        sched.accumulation(1, 7)
    with pytest.raises(StreamError, match="past the end"):
        sched.step(80958)
    with pytest.raises(StreamError, match="numbered from 1"):
        sched.step(0)
    with pytest.raises(StreamError, match="rank must be"):
        sched.rank_plan(1, 4, 4)
    with pytest.raises(StreamError, match="never consumed"):
        sched.step_of_token(sched.total_tokens)
