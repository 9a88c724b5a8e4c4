"""Property 3: realized token shares converge to the targets and every source advances at
the same rate (epochs); and the exact integer weight rule of mixview.py."""
from fractions import Fraction

import numpy as np
import pytest

from open1b_data.errors import StreamError
from open1b_data.stream.mixview import WEIGHT_LIMIT, source_weights, target_shares
from open1b_data.stream.plan import StreamPlan
from testkit.synthetic import SyntheticSource, write_synthetic_mix
from tests.stream.test_plan import SCHEDULE, WINDOW


def test_natural_weights_are_document_counts():
    shares = target_shares([300, 900, 50], [None, None, None])
    assert shares == [Fraction(300, 1250), Fraction(900, 1250), Fraction(50, 1250)]
    assert source_weights([10, 30, 5], [300, 900, 50], shares) == [2, 6, 1]


def test_declared_weights_are_exact():
    shares = target_shares([1000, 3000], [0.25, 0.75])
    assert shares == [Fraction(1, 4), Fraction(3, 4)]
    # share * docs / tokens: 1/4 * 10/1000 : 3/4 * 20/3000 = 1/400 : 1/200 = 1 : 2
    assert source_weights([10, 20], [1000, 3000], shares) == [1, 2]
    # a mix declaring some shares: the rest split by tokens
    assert target_shares([100, 300, 100], [0.5, None, None]) == [
        Fraction(1, 2), Fraction(3, 8), Fraction(1, 8)]
    with pytest.raises(StreamError, match=">= 1"):
        target_shares([1, 1], [1.0, None])


def test_huge_denominators_fall_back_to_62_bits():
    toks = [300_500_000_017, 59_800_000_019, 54_200_000_003, 36_000_000_007]
    docs = [240_000_001, 59_500_003, 27_400_007, 5_300_009]
    shares = target_shares(toks, [0.667, 0.133, 0.12, 0.08])
    w = source_weights(docs, toks, shares)
    assert sum(w) <= WEIGHT_LIMIT and all(v > 0 for v in w)
    exact = [s * d / t for s, d, t in zip(shares, docs, toks)]
    for v, r in zip(w, exact):
        assert abs(Fraction(v, sum(w)) - r / sum(exact)) < Fraction(1, 2**58)


@pytest.mark.parametrize("declared", [None, (0.5, 0.3, 0.2)])
def test_realized_shares_converge_and_epochs_keep_pace(tmp_path, declared):
    specs = [("web", 2000, 300, 1.0), ("code", 500, 700, 1.3), ("math", 120, 2500, 1.2)]
    srcs = [SyntheticSource(n, d, m, sg, 500,
                            target_share=None if declared is None else declared[i])
            for i, (n, d, m, sg) in enumerate(specs)]
    url = str(tmp_path / "mix")
    write_synthetic_mix(url, srcs, window=WINDOW, schedule=SCHEDULE)
    plan = StreamPlan.open(url, use_index=False)
    n = 30_000
    segs = plan.segments_range(0, n)
    got = np.bincount(segs.source, weights=segs.length, minlength=3) / (n * WINDOW)
    want = np.array([float(s.share) for s in plan.view.sources])
    # ~12k documents per 1M tokens... the standard error of a share here is < 0.005
    assert np.abs(got - want).max() < 0.02, (got, want)
    if declared is None:
        # natural shares: each source is consumed at the same rate, in epochs
        st = plan.state_at(n)
        progress = np.array(st.consumed) / np.array(st.documents)
        assert progress.min() > 4
        assert (progress.max() - progress.min()) / progress.mean() < 0.05, progress
