"""The held-out set (STREAM.md section 10): the rule's test vectors, the definition key,
and on a small built mix: the manifest's rows are the rule's, the stream never draws them
(by document id, for every window of the schedule), and held-out windows are a pure
function of the mix; on the demo mix (manifests/demo.toml, ``[heldout]``): no window of its
whole schedule holds a held-out document, by document id."""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from open1b_data import StreamPlan
from open1b_data.errors import MixSpecError
from open1b_data.formats.definition import default_mix_path, load_mix, parse_mix
from open1b_data.formats.heldout import is_heldout, parse_fraction
from open1b_data.ingest.verify import verify
from open1b_data.stream.heldout import HeldoutWindows
from open1b_data.stream.plan import HeldOutError
from open1b_data.stream.schedule import Schedule
from open1b_data.stream.shardreader import ShardReader
from testkit.trainmix import train_mix

# STREAM.md section 10 "Test vectors": (doc_id, fraction, held out?)
VECTORS = [
    ("doc-377", "0.001", True),      # SHA-256 starts 003bb1ed...: 0.000911... of 2^256
    ("doc-377", "0.0009", False),
    ("b", "0.25", True),             # 3e23e816...: 0.2427...
    ("b", "0.24", False),
    ("doc-2", "0.4", True),          # 664b4034...: 0.3996...
    ("doc-2", "0.3", False),
    ("a", "0.79", False),            # ca978112...: 0.7914...
    ("a", "0.8", True),
    ("doc-1", "0", False),
]


@pytest.mark.parametrize("doc_id,fraction,held", VECTORS)
def test_rule_vectors(doc_id, fraction, held):
    assert is_heldout(doc_id, parse_fraction(fraction, "f")) is held


@pytest.mark.parametrize("bad", [0.001, "1", "1.0", "-0.1", "1e-3", ".5", "0.5 ", "",
                                 "0.", "00.1", "+0.1", "-0", " 0.1", "01"])
def test_fraction_is_a_decimal_string_in_0_1(bad):
    with pytest.raises(MixSpecError, match="f"):
        parse_fraction(bad, "f")


@pytest.mark.parametrize("good, value", [("0", 0), ("0.001", Fraction(1, 1000)),
                                         ("0.5", Fraction(1, 2)), ("0.50", Fraction(1, 2))])
def test_valid_decimal_spellings(good, value):
    assert parse_fraction(good, "f") == value


def test_definition_key_enters_only_when_present():
    import tomllib
    with open(default_mix_path(), "rb") as f:
        raw = tomllib.load(f)
    assert raw.pop("heldout") == {"fraction": "0.05"}          # the demo's own
    d = parse_mix(raw, base_dir="manifests").to_dict()
    assert "heldout" not in d and all("heldout" not in s for s in d["sources"])
    raw["heldout"] = {"fraction": "0.001"}
    raw["sources"][1]["heldout"] = "0.01"
    spec2 = parse_mix(raw, base_dir="manifests")
    d2 = spec2.to_dict()
    assert d2["heldout"] == {"fraction": "0.001"} and d2["sources"][1]["heldout"] == "0.01"
    assert "heldout" not in d2["sources"][0]
    assert spec2.heldout_fraction(spec2.sources[0].name) == Fraction(1, 1000)
    assert spec2.heldout_fraction(spec2.sources[1].name) == Fraction(1, 100)
    raw["heldout"] = {"fraction": 0.001}
    with pytest.raises(MixSpecError, match="heldout.fraction"):
        parse_mix(raw, base_dir="manifests")
    raw["heldout"] = {"fractoin": "0.1"}
    with pytest.raises(MixSpecError, match="fraction"):
        parse_mix(raw, base_dir="manifests")


@pytest.fixture(scope="module")
def hmix(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("heldout"), steps=12, batch=12, heldout="0.2")


def _ids(view, reader, s):
    return [reader.column(s, h, "doc_id") for h in range(view.sources[s].shards)]


def test_manifest_rows_are_the_rule_and_verify_rederives_them(hmix):
    plan = StreamPlan.open(hmix, use_index=False)
    view = plan.view
    reader = ShardReader(view)
    assert view.definition["heldout"] == {"fraction": "0.2"}
    for s, sv in enumerate(view.sources):
        assert sv.heldout
        for h, ids in enumerate(_ids(view, reader, s)):
            want = [i for i, d in enumerate(ids) if is_heldout(d, Fraction("0.2"))]
            assert sv.shard_heldout[h].tolist() == want
        assert plan.documents[s] == sv.documents - sum(x.size for x in sv.shard_heldout)
        assert 0 < plan.documents[s] < sv.documents
    assert verify(hmix) == []
    # a manifest whose held-out list is not the rule's: verify names the shard
    raw = json.load(open(f"{hmix}/manifest.json"))
    sh = raw["sources"][0]["shards"][0]
    sh["heldout"] = [] if sh["heldout"] else [0]
    from open1b_data.formats.manifest import fingerprint
    raw["fingerprint"] = fingerprint(raw)
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(hmix, d, dirs_exist_ok=True)
        with open(f"{d}/manifest.json", "w") as f:
            json.dump(raw, f)
        problems = verify(d)
        assert any(sh["path"] in p and "held-out rows differ" in p for p in problems)


def test_training_never_draws_a_heldout_document(hmix):
    """Every window of the schedule (and past it, through epochs), by document id."""
    plan = StreamPlan.open(hmix, use_index=False)
    view = plan.view
    reader = ShardReader(view)
    sched = Schedule.from_definition(view.definition)
    n = sched.total_windows * 4                 # several epochs of every source
    segs = plan.segments_range(0, n)
    ids = [_ids(view, reader, s) for s in range(len(view.sources))]
    held = {ids[s][h][int(r)] for s, sv in enumerate(view.sources)
            for h, rows in enumerate(sv.shard_heldout) for r in rows}
    assert held
    drawn = {ids[int(s)][int(h)][int(d)] for s, h, d in zip(segs.source, segs.shard, segs.doc)}
    assert not drawn & held
    # each epoch is a permutation of exactly the training documents
    for s, sv in enumerate(view.sources):
        for e in (0, 1):
            k = np.arange(e * plan.documents[s], (e + 1) * plan.documents[s])
            _, shard, doc, _ = plan.lookup(s, k)
            got = sorted(ids[s][int(h)][int(d)] for h, d in zip(shard, doc))
            want = sorted(i for per in ids[s] for i in per if i not in held)
            assert got == want
    # the state counts training documents; a state round-trips; held-out docs are never
    # found as training documents
    st = plan.state_at(n // 2)
    assert list(st.documents) == plan.documents.tolist()
    assert plan.from_state(st) == n // 2
    s, h, r = 0, *next((h, int(rows[0])) for h, rows in
                       enumerate(view.sources[0].shard_heldout) if rows.size)
    with pytest.raises(HeldOutError, match="held out"):
        plan.ordinal_of(s, h, r, 0)
    assert plan.occurrences(s, h, r, 0, 50) == []


def test_heldout_windows_are_the_documents_packed_in_order(hmix):
    ho = HeldoutWindows.open(hmix)
    view = ho.view
    reader = ShardReader(view)
    for name in ho.sources:
        s = view.source_index(name)
        flat = []
        for h, r in ho.documents(name):
            flat += reader.rows(s, h, [r])[0].tolist() + [view.eot_id]
        n = len(flat) // view.window
        got = ho.windows(name, 10**6)
        assert got.shape == (n, view.window)
        assert got.reshape(-1).tolist() == flat[:n * view.window]
        assert np.array_equal(ho.windows(name, 2), got[:2])
        assert np.array_equal(HeldoutWindows.open(hmix).windows(name, 3), got[:3])


@pytest.fixture(scope="module")
def demo_mix(tmp_path_factory) -> str:
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = tmp_path_factory.mktemp("demo") / "mix"
    build_mix(load_mix(default_mix_path()), str(out), BuildOptions(workers=1, progress=False))
    return str(out)


def held_by_rule(view, ids, fraction: str) -> dict[str, tuple[int, int, int]]:
    """{doc_id: (source, shard, row)} of every document the rule holds out at ``fraction``,
    from the shards' doc_id columns (not from the manifest's lists)."""
    f = Fraction(fraction)
    return {d: (s, h, r) for s in range(len(view.sources)) for h, per in enumerate(ids[s])
            for r, d in enumerate(per) if is_heldout(d, f)}


def assert_never_trained(plan, sched, ids, held: dict) -> int:
    """No window of ``sched`` has a segment of a document in ``held`` (by doc_id): the
    plan's segments (index arithmetic, no token decoded) give each window's (source,
    shard, row); raises naming the first such document and its window. Returns the
    number of documents drawn."""
    segs = plan.segments_range(0, sched.total_windows)
    drawn = set()
    for m, s, h, r in zip(segs.window.tolist(), segs.source.tolist(), segs.shard.tolist(),
                          segs.doc.tolist()):
        d = ids[s][h][r]
        if d in held:
            raise AssertionError(f"held-out document {d!r} ({plan.sources[s]} shard {h} row "
                                 f"{r}) is trained on in window {m} (step "
                                 f"{sched.step_of_window(m)})")
        drawn.add(d)
    return len(drawn)


def test_demo_mix_trains_on_no_heldout_document_in_any_window(demo_mix):
    plan = StreamPlan.open(demo_mix, use_index=False)
    view = plan.view
    sched = Schedule.from_definition(view.definition)
    assert view.definition["heldout"] == {"fraction": "0.05"}
    assert [p.batch_sequences for p in sched.spec.phases] == [8, 16, 32]
    assert sched.step_of_window(sched.total_windows - 1) == sched.last_step
    assert sched.step(sched.last_step).phase == 2         # every step of all three phases
    reader = ShardReader(view)
    ids = [_ids(view, reader, s) for s in range(len(view.sources))]
    held = held_by_rule(view, ids, "0.05")
    for s, sv in enumerate(view.sources):                  # the manifest lists the rule's rows
        listed = {(h, int(r)) for h, rows in enumerate(sv.shard_heldout) for r in rows}
        assert listed == {(h, r) for s2, h, r in held.values() if s2 == s} and listed
    drawn = assert_never_trained(plan, sched, ids, held)
    assert drawn > 1000
    # the check fails when a document is trained on: the rule at 10% holds out a superset,
    # whose extra documents (5-10%) the demo does train on - it names one and its window
    wider = held_by_rule(view, ids, "0.1")
    with pytest.raises(AssertionError, match=r"is trained on in window \d+ \(step \d+\)") as e:
        assert_never_trained(plan, sched, ids, wider)
    named = [d for d in wider if f"document {d!r} (" in str(e.value)]
    assert len(named) == 1 and named[0] not in held


def test_a_source_with_everything_held_out_is_refused_on_open(hmix, tmp_path):
    """STREAM.md section 3: a source with a weight but no training document leaves the
    stream undefined - refused naming it, never silently given weight 0."""
    import shutil

    from open1b_data.errors import StreamError
    from testkit.rewrite import refingerprint

    mix = str(tmp_path / "mix")
    shutil.copytree(hmix, mix)
    shutil.rmtree(f"{mix}/stream", ignore_errors=True)
    refingerprint(mix, lambda d: [sh.update(heldout=list(range(sh["documents"])))
                                  for sh in d["sources"][1]["shards"]])
    name = json.load(open(f"{mix}/manifest.json"))["sources"][1]["name"]
    with pytest.raises(StreamError, match=f"source '{name}' .* no document to train on"):
        StreamPlan.open(mix)
    assert HeldoutWindows.open(mix).sources            # its held-out windows still read


def test_lists_and_fractions_must_agree(hmix, tmp_path):
    """STREAM.md section 10, "Recorded": a fraction without a shard's list, or a list
    without a fraction, is refused when the mix is opened, naming the source."""
    import shutil

    from open1b_data.errors import ManifestError
    from testkit.rewrite import refingerprint

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for mix in (a, b):
        shutil.copytree(hmix, mix)
        shutil.rmtree(f"{mix}/stream", ignore_errors=True)
    refingerprint(a, lambda d: d["sources"][0]["shards"][-1].pop("heldout"))
    with pytest.raises(ManifestError, match="holds out 1/5 of its documents but shard "
                                            ".* lists no held-out rows"):
        StreamPlan.open(a)

    def no_fraction(d):
        d["definition"].pop("heldout")
        for sh in d["sources"][1]["shards"]:
            sh.pop("heldout")
    refingerprint(b, no_fraction)
    with pytest.raises(ManifestError, match="list held-out rows but the definition gives "
                                            "it no held-out fraction"):
        StreamPlan.open(b)
