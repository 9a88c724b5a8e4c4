"""plan.py: the stream's plan against an independent, sequential reference implementation
written from STREAM.md, plus coverage, random access, epochs and reverse lookups."""
import numpy as np
import pytest

from open1b_data.stream import rng
from open1b_data.errors import StreamError
from open1b_data.stream.plan import StreamPlan
from testkit.synthetic import SyntheticSource, write_synthetic_mix

WINDOW = 257
SCHEDULE = {"seq_tokens": WINDOW - 1, "micro_batch": 2, "reference_world": 2,
            "phases": [{"start_tokens": 0, "batch_sequences": 8}],
            "stop_tokens": (WINDOW - 1) * 2000, "lr_peak": 1e-3, "lr_final_ratio": 0.1,
            "warmup_tokens": (WINDOW - 1) * 10}
SOURCES = [SyntheticSource("web", 400, 300, 1.0, 128),
           SyntheticSource("code", 60, 900, 1.2, 25),
           SyntheticSource("math", 7, 2000, 0.5, 3)]


def small_mix(path, sources=SOURCES, seed=42, **kw) -> str:
    write_synthetic_mix(str(path), sources, seed=seed, window=WINDOW, schedule=SCHEDULE, **kw)
    return str(path)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return small_mix(tmp_path_factory.mktemp("mix"))


def reference_tokens(mix_url, n_tokens, seed=None):
    """A deliberately naive re-implementation: one draw at a time, pure-Python RNG."""
    from open1b_data.stream.mixview import MixView

    view = MixView.open(mix_url)
    seed = view.seed if seed is None else seed
    W = view.weights
    kmix = rng.derive_key("mix", seed)
    consumed = [0] * len(W)
    out = []   # (draw, source, shard, doc, epoch, token position inside doc) per token
    i = 0
    while len(out) < n_tokens:
        x = rng.bounded_ref(kmix, i, sum(W))
        s = 0
        while x >= W[s]:
            x -= W[s]
            s += 1
        sv = view.sources[s]
        e, p = divmod(consumed[s], sv.documents)
        consumed[s] += 1
        kso = rng.derive_key("shard-order", seed, sv.name, e)
        for j in range(sv.shards):
            h = rng.feistel_permute_ref(kso, j, sv.shards)
            if p < sv.shard_documents[h]:
                break
            p -= sv.shard_documents[h]
        d = rng.feistel_permute_ref(rng.derive_key("doc-order", seed, sv.name, e, h), p,
                                    sv.shard_documents[h])
        length = int(view.lengths(s, h)[d])
        out.extend((i, s, h, d, e, t) for t in range(length + 1))
        i += 1
    return out[:n_tokens]


def flatten(segs, a, b):
    out = []
    for k in range(len(segs)):
        for t in range(int(segs.doc_start[k]), int(segs.doc_start[k] + segs.length[k])):
            out.append((int(segs.draw[k]), int(segs.source[k]), int(segs.shard[k]),
                        int(segs.doc[k]), int(segs.epoch[k]), t))
    return out


def test_plan_equals_reference(mix):
    plan = StreamPlan.open(mix, use_index=False)
    n = 120
    segs = plan.segments_range(0, n)
    assert flatten(segs, 0, n) == reference_tokens(mix, n * WINDOW)


def test_other_seed_equals_reference_and_differs(mix):
    plan = StreamPlan.open(mix, seed=7, use_index=False)
    segs = plan.segments_range(0, 20)
    assert flatten(segs, 0, 20) == reference_tokens(mix, 20 * WINDOW, seed=7)
    base = StreamPlan.open(mix, use_index=False).segments_range(0, 20)
    assert not np.array_equal(segs.doc, base.doc[: len(segs)]) or len(segs) != len(base)


def test_windows_are_exactly_covered(mix):
    plan = StreamPlan.open(mix, use_index=False)
    segs = plan.segments_range(0, 500)
    assert np.array_equal(np.bincount(segs.window, weights=segs.length).astype(int),
                          np.full(500, WINDOW))
    for m in (0, 1, 250, 499):
        sel = segs.window == m
        assert np.array_equal(segs.window_offset[sel],
                              np.r_[0, np.cumsum(segs.length[sel])[:-1]])
    assert (segs.doc_start + segs.length <= segs.doc_length + 1).all()
    assert (segs.length > 0).all()
    # a document cut by a window boundary continues at the start of the next window
    cont = np.flatnonzero(segs.draw[1:] == segs.draw[:-1])
    assert (segs.window[cont + 1] == segs.window[cont] + 1).all()
    assert (segs.doc_start[cont + 1] == segs.doc_start[cont] + segs.length[cont]).all()


def test_random_access_equals_sequential(mix):
    full = StreamPlan.open(mix, use_index=False).segments_range(0, 600)
    for m in (599, 3, 311, 312, 0):
        fresh = StreamPlan.open(mix, use_index=False)
        got = fresh.segments(m)
        sel = full.select(full.window == m).to_list(fresh.sources)
        assert got == sel
    # sequential requests continue from the remembered cursor and agree too
    plan = StreamPlan.open(mix, use_index=False)
    parts = [plan.segments_range(a, a + 37) for a in range(0, 592, 37)]
    assert np.array_equal(np.concatenate([p.draw for p in parts]),
                          full.draw[full.window < 592])


def test_each_epoch_is_a_permutation(mix):
    plan = StreamPlan.open(mix, use_index=False)
    segs = plan.segments_range(0, 1500)
    first = segs.doc_start == 0
    for s, sv in enumerate(plan.view.sources):
        sel = first & (segs.source == s)
        epochs = segs.epoch[sel]
        for e in range(int(epochs.max())):   # complete epochs only
            docs = list(zip(segs.shard[sel][epochs == e].tolist(),
                            segs.doc[sel][epochs == e].tolist()))
            assert len(docs) == sv.documents and len(set(docs)) == sv.documents, (s, e)
        assert epochs.max() >= 1, f"source {sv.name} never rolled over"


def test_reverse_lookups(mix):
    plan = StreamPlan.open(mix, use_index=False)
    segs = plan.segments_range(0, 300)
    for k in (0, 17, len(segs) // 2, len(segs) - 1):
        i = int(segs.draw[k])
        info = plan.draw_info(i)
        assert (plan.sources.index(info.source), info.shard, info.doc, info.epoch) == (
            int(segs.source[k]), int(segs.shard[k]), int(segs.doc[k]), int(segs.epoch[k]))
        assert info.first_window <= segs.window[k] <= info.last_window
        s = plan.sources.index(info.source)
        assert plan.ordinal_of(s, info.shard, info.doc, info.epoch) == info.ordinal
        assert plan.draw_of(s, info.ordinal) == i
        occ = plan.occurrences(s, info.shard, info.doc, 0, 300)
        assert i in [o.draw for o in occ]
        hits = np.flatnonzero((segs.source == s) & (segs.shard == info.shard)
                              & (segs.doc == info.doc))
        assert sorted(set(segs.draw[hits].tolist())) == [o.draw for o in occ]


def test_bad_requests_fail_clearly(mix):
    plan = StreamPlan.open(mix, use_index=False)
    with pytest.raises(StreamError, match="window index"):
        plan.segments(-1)
    with pytest.raises(StreamError, match="reversed"):
        plan.segments_range(5, 4)
    with pytest.raises(StreamError, match="no document"):
        plan.ordinal_of(0, 0, 10**6, 0)


def test_synthetic_token_shards_match_lengths(tmp_path):
    from open1b_data.ingest.verify import verify
    from open1b_data.formats.shards import read_document

    url = small_mix(tmp_path / "tok", sources=SOURCES[1:], token_shards=True)
    # everything the manifest names is intact; only the (never written) tokenizer is absent
    assert verify(url) == ["tokenizer.json: missing file"]
    plan = StreamPlan.open(url, use_index=False)
    for seg in plan.segments(3) + plan.segments(40):
        sv = plan.view.sources[plan.sources.index(seg.source)]
        doc = read_document(plan.view.url(sv.shard_paths[seg.shard]), seg.doc)
        assert doc.shape == (seg.doc_length,) and doc.min() >= 1
