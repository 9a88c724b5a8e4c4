"""Property 6: golden vectors. The plan of a small synthetic mix (its fingerprint pinned
too, so a drift in the synthetic data is told apart from a drift in the stream) must give
exactly these segment hashes; the demo mix (built by build-mix from the committed
corpus) must give these segment hashes and window sha256s (token ids as uint32 LE).
Regenerate only on purpose (a definition change bumps the STREAM.md version):
    .venv/bin/python -m tests.stream.test_golden --write
"""
import hashlib
import json
import os
import sys

import numpy as np
import pytest

from open1b_data.stream.plan import StreamPlan
from tests.stream.test_plan import small_mix

ASSET = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "stream_golden.json")


def window_digest(segs) -> str:
    """sha256 of the canonical JSON list of [source, shard, doc, epoch, doc_start, length,
    window_offset] of a window's segments (STREAM.md "Test vectors")."""
    rows = [[s.source, s.shard, s.doc, s.epoch, s.doc_start, s.length, s.window_offset]
            for s in segs]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def compute(tmp) -> dict:
    url = small_mix(tmp)
    plan = StreamPlan.open(url, use_index=False)
    segs = plan.segments_range(0, 256).to_list(plan.sources)
    by_window = [[s for s in segs if s.window == m] for m in range(256)]
    return {
        "synthetic": {
            "fingerprint": plan.fingerprint,
            "weights": list(plan.view.weights),
            "windows_0_7": [window_digest(w) for w in by_window[:8]],
            "windows_0_255": hashlib.sha256("".join(
                window_digest(w) for w in by_window).encode()).hexdigest(),
            "state_255": json.loads(plan.state_at(255).to_json()),
        }
    }


def window_tokens(plan, segs, eot: int) -> bytes:
    """A window's canonical bytes: its token ids as uint32 little-endian, read straight from
    the shards (documents followed by the separator ``eot``)."""
    from open1b_data.formats.shards import read_document

    parts = []
    for s in segs:
        sv = plan.view.sources[plan.sources.index(s.source)]
        doc = read_document(plan.view.url(sv.shard_paths[s.shard]), s.doc)
        full = np.concatenate([doc, np.array([eot], dtype=np.uint32)])
        parts.append(full[s.doc_start:s.doc_start + s.length])
    return np.concatenate(parts).astype("<u4").tobytes()


def compute_demo(tmp) -> dict:
    from open1b_data.ingest.pipeline import build_mix
    from open1b_data.formats.definition import default_mix_path, load_mix

    build_mix(load_mix(default_mix_path()), str(tmp))
    plan = StreamPlan.open(str(tmp), use_index=False)
    with open(os.path.join(str(tmp), "manifest.json")) as f:
        eot = json.load(f)["tokenizer"]["eot_id"]
    segs = plan.segments_range(0, 8).to_list(plan.sources)
    by_window = [[s for s in segs if s.window == m] for m in range(8)]
    # the content code (windows.py, S2) must agree with this direct reading of the shards
    from open1b_data.stream.windows import WindowReader, window_sha256

    reader = WindowReader(plan)
    for m, w in enumerate(by_window):
        assert window_sha256(reader.window_tokens(m)) == hashlib.sha256(
            window_tokens(plan, w, eot)).hexdigest()
    return {"demo": {
        "fingerprint": plan.fingerprint,
        "windows_0_7_segments": [window_digest(w) for w in by_window],
        "windows_0_7_sha256": [hashlib.sha256(window_tokens(plan, w, eot)).hexdigest()
                               for w in by_window],
        "state_8": json.loads(plan.state_at(8).to_json()),
    }}


@pytest.fixture(scope="module")
def golden():
    with open(ASSET) as f:
        return json.load(f)


def test_golden_demo(tmp_path, golden):
    got = compute_demo(tmp_path / "demo")["demo"]
    want = golden["demo"]
    if got["fingerprint"] != want["fingerprint"]:
        pytest.fail("the built demo mix changed (corpus, tokenizer, shards or definition), so "
                    "its stream goldens no longer apply; if the change is intended, "
                    "regenerate with `.venv/bin/python -m tests.stream.test_golden --write` "
                    "and say why in the commit")
    assert got["windows_0_7_segments"] == want["windows_0_7_segments"]
    assert got["windows_0_7_sha256"] == want["windows_0_7_sha256"]
    assert got["state_8"] == want["state_8"]


def test_golden_plan(tmp_path):
    with open(ASSET) as f:
        golden = json.load(f)["synthetic"]
    got = compute(tmp_path / "mix")["synthetic"]
    assert got["fingerprint"] == golden["fingerprint"], (
        "the synthetic test mix itself changed (lengths generator or manifest format); "
        "the stream goldens below cannot be compared")
    assert got["weights"] == golden["weights"]
    assert got["windows_0_7"] == golden["windows_0_7"]
    assert got["windows_0_255"] == golden["windows_0_255"]
    assert got["state_255"] == golden["state_255"]


def test_stream_md_states_the_golden_values(golden):
    """STREAM.md section 9 prints the goldens for re-implementers: the same values."""
    text = open(os.path.join(os.path.dirname(ASSET), "..", "..", "STREAM.md")).read()
    demo, syn = golden["demo"], golden["synthetic"]
    for value in (demo["fingerprint"], *demo["windows_0_7_segments"],
                  *demo["windows_0_7_sha256"], syn["fingerprint"], syn["windows_0_255"],
                  *syn["windows_0_7"], str(syn["weights"])):
        assert value in text, value
    for state in (demo["state_8"], syn["state_255"]):
        block = "\n".join("  " + ln for ln in json.dumps(state, sort_keys=True,
                                                         indent=1).splitlines())
        assert block in text


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        data = compute(os.path.join(d, "mix"))
        data.update(compute_demo(os.path.join(d, "demo")))
    old = json.load(open(ASSET)) if os.path.exists(ASSET) else {}
    old.update(data)
    with open(ASSET, "w") as f:
        json.dump(old, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", ASSET)
