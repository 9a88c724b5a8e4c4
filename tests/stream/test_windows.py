"""Window content (property 4): every token of every window traces to exactly one segment,
segments decode to their document's text slice, and reading modes agree byte for byte."""
import hashlib
import struct

import numpy as np
import pytest

from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule
from open1b_data.ingest.tokenizer import load_tokenizer
from open1b_data.stream.windows import WindowReader, window_sha256
from testkit.s2mix import text_mix, token_mix


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return text_mix(str(tmp_path_factory.mktemp("text")))


@pytest.fixture(scope="module")
def tokmix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("tok")))


def test_every_token_traces_to_one_segment_and_decodes(text):
    mix, corpus = text
    plan = StreamPlan.open(mix)
    reader = WindowReader(plan)
    tok = load_tokenizer(f"{mix}/tokenizer.json")
    n = Schedule.from_definition(plan.view.definition).total_windows
    wins = reader.windows(0, n)
    segs = plan.segments_range(0, n)
    owner = np.full((n, plan.window), -1)
    pieces: dict[int, list] = {}
    for i, seg in enumerate(segs.to_list(plan.sources)):
        sl = owner[seg.window, seg.window_offset:seg.window_offset + seg.length]
        assert (sl == -1).all()                       # no token is claimed twice
        sl[:] = i
        pieces.setdefault(seg.draw, []).append((seg, wins[seg.window, seg.window_offset:
                                                           seg.window_offset + seg.length]))
    assert (owner >= 0).all()                         # and every token is claimed
    complete = 0
    for draw, parts in pieces.items():
        seg0 = parts[0][0]
        src, shard, doc = seg0.source, seg0.shard, seg0.doc
        doc_id = reader.doc_ids(plan.sources.index(src), shard, [doc])[0]
        original = corpus[src][int(doc_id.rsplit("-", 1)[1])]
        ids = tok.encode(original).ids
        for seg, got in parts:                          # each slice is the document's slice
            body = got[:min(seg.length, seg.doc_length - seg.doc_start)]
            assert body.tolist() == ids[seg.doc_start:seg.doc_start + body.size]
            if seg.has_separator:
                assert int(got[-1]) == reader.eot_id
        if parts[0][0].doc_start == 0 and parts[-1][0].has_separator:
            whole = np.concatenate([g for _, g in parts])
            assert tok.decode(whole[:-1].tolist()) == original      # exact text round trip
            complete += 1
    assert complete > 100


def test_sha256_is_of_uint32_le_bytes(tokmix):
    reader = WindowReader(StreamPlan.open(tokmix))
    w = reader.window_tokens(5)
    raw = struct.pack(f"<{w.size}I", *w.tolist())
    assert window_sha256(w) == hashlib.sha256(raw).hexdigest()
    assert len(raw) == 4 * 129


def test_modes_and_requests_agree(tokmix):
    whole = WindowReader(StreamPlan.open(tokmix), whole_shards=True)
    rows = WindowReader(StreamPlan.open(tokmix), whole_shards=False)
    ref = whole.windows(0, 200)
    assert np.array_equal(rows.windows(0, 200), ref)
    parts = np.concatenate([whole.windows(a, a + 7) for a in range(0, 196, 7)])
    assert np.array_equal(parts, ref[:196])
    ms = [150, 3, 77, 3, 199]
    assert np.array_equal(rows.select(ms), ref[ms])
    fresh = WindowReader(StreamPlan.open(tokmix))
    assert np.array_equal(fresh.window_tokens(123), ref[123])   # random access, cold plan


def test_whole_shard_decoded_once_per_epoch(tokmix):
    plan = StreamPlan.open(tokmix)
    reader = WindowReader(plan, cache_shards=1)      # one shard per source is enough
    ref = WindowReader(StreamPlan.open(tokmix), whole_shards=False).windows(0, 300)
    got = np.concatenate([reader.windows(a, a + 10) for a in range(0, 300, 10)])
    assert np.array_equal(got, ref)
    segs = plan.segments_range(0, 300)
    assert segs.epoch.max() >= 1                              # several epochs were read
    runs = 0                  # per source, the runs of one shard in draw order
    for s in range(len(plan.sources)):
        h = segs.shard[segs.source == s]
        runs += int(h.size > 0) + int(np.count_nonzero(np.diff(h)))
    assert reader.shard_loads == runs


def test_separator_is_manifest_eot(text):
    mix, _ = text
    reader = WindowReader(StreamPlan.open(mix))
    tok = load_tokenizer(f"{mix}/tokenizer.json")
    assert reader.eot_id == tok.token_to_id("<|endoftext|>")


def test_readahead_serves_the_same_windows_decoding_each_shard_once(tokmix):
    plan = StreamPlan.open(tokmix)
    ahead = WindowReader(plan, cache_shards=1, readahead=True)
    ref = WindowReader(StreamPlan.open(tokmix), whole_shards=False).windows(0, 300)
    got = np.concatenate([ahead.windows(a, a + 10) for a in range(0, 300, 10)])
    ahead.close()
    assert np.array_equal(got, ref)
    segs = plan.segments_range(0, 300)
    runs = sum(int(h.size > 0) + int(np.count_nonzero(np.diff(h)))
               for h in (segs.shard[segs.source == s] for s in range(len(plan.sources))))
    # every shard a source walks to was decoded ahead, once; at most one more per source
    # (the shard after the last one used) may have been started
    assert runs <= ahead.shard_loads <= runs + len(plan.sources)
    # and each source's shards after its first were asked for after their readahead began
    assert ahead.shards.ahead_hits == runs - len(np.unique(segs.source))
