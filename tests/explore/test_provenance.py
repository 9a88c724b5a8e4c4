"""Provenance: doc-id and phrase queries agree with a brute-force scan of the planned
windows (every window, step and rank holding tokens of the document)."""
import pytest

from open1b_data.errors import StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.explore.provenance import report
from open1b_data.stream.schedule import Schedule
from testkit.s2mix import text_mix


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return text_mix(str(tmp_path_factory.mktemp("prov")))[0]


def brute(mix, source, shard, doc, steps, world):
    plan = StreamPlan.open(mix, use_index=False)
    sched = Schedule.from_definition(plan.view.definition)
    a = sched.step(steps[0]).first_window
    last = sched.step(steps[1])
    segs = plan.segments_range(a, last.first_window + last.batch_sequences)
    s = plan.sources.index(source)
    sel = segs.select((segs.source == s) & (segs.shard == shard) & (segs.doc == doc))
    return [(int(m), sched.step_of_window(int(m)), int(m) % world, int(st),
             int(min(st + n, L))) for m, st, n, L in zip(sel.window, sel.doc_start,
                                                          sel.length, sel.doc_length)]


@pytest.mark.parametrize("steps,world", [(None, 2), ((3, 31), 4), ((10, 12), 1)])
def test_doc_id_matches_brute_force(mix, steps, world):
    rep = report(mix, doc_id="web-7", steps=steps, world=world)
    sched = Schedule.from_definition(StreamPlan.open(mix).view.definition)
    span = steps or (1, sched.last_step)
    assert rep["steps"] == list(span)
    (doc,) = rep["documents"]
    got = [(o["window"], o["step"], o["rank"], o["doc_start"], o["doc_end"])
           for o in doc["occurrences"]]
    want = brute(mix, doc["source"], doc["shard"], doc["doc"], span, world)
    assert got == want
    assert doc["steps"] == sorted({w[1] for w in want})
    if steps is None:
        assert len({o["epoch"] for o in doc["occurrences"]}) > 1   # seen in several epochs


def test_phrase_finds_the_document_and_its_steps(mix):
    by_text = report(mix, phrase="zq-42")
    by_id = report(mix, doc_id="web-7")
    assert [d["doc_id"] for d in by_text["documents"]] == ["web-7"]
    assert by_text["documents"][0]["occurrences"] == by_id["documents"][0]["occurrences"]
    many = report(mix, phrase="code doc 1")       # prefix of "code doc 1:" and "code doc 1x:"
    assert {d["doc_id"] for d in many["documents"]} == {f"code-{i}" for i in [1, *range(10,
                                                                                      20)]}
    assert report(mix, phrase="no such phrase anywhere")["documents"] == []


def test_bad_queries(mix):
    with pytest.raises(StreamError, match="no document with doc_id 'nope'"):
        report(mix, doc_id="nope")
    with pytest.raises(StreamError, match="past the last step"):
        report(mix, doc_id="web-7", steps=(1, 10**6))
