"""The compiled encoder (open1b_data.ingest.tokenizer._bpe): the same pieces as HF's pre-tokenizer on every
code point, the same ids as tiktoken and HF on real and adversarial text, bounded cache."""
from __future__ import annotations

import random

import numpy as np
import pytest
import tiktoken

from open1b_data.ingest import tokenizer as tk
from open1b_data.errors import BuildError
from open1b_data.formats.definition import LLAMA3_SPLIT, TokenizerSpec
from tests.ingest.test_tokenizer import WHITESPACE_CASES, _demo_texts, _python_texts

_bpe = pytest.importorskip("open1b_data.ingest.tokenizer._bpe",
                           reason="compiled encoder not built (no C compiler)")


@pytest.fixture(scope="module")
def trained():
    code, prose = _python_texts()
    return tk.train_tokenizer(TokenizerSpec(vocab_size=4096), code[::2] + prose[::2])


@pytest.fixture(scope="module")
def encoders(trained):
    native = tk.FastEncoder.from_tokenizer(trained, backend="native")
    plain = tiktoken.Encoding(name="plain", pat_str=LLAMA3_SPLIT,
                              mergeable_ranks=native.encoding._mergeable_ranks,
                              special_tokens=native.encoding._special_tokens)
    return native, plain


def _hf_ends(trained, text: str) -> list[int]:
    return [end for _, (_, end) in trained.pre_tokenizer.pre_tokenize_str(text)]


CONTRACTIONS = ["it's", "IT'S", "it'ſ", "we're", "WE'RE", "we'Re", "they've", "I'm", "I'M",
                "you'll", "YOU'LL", "you'lL", "he'd", "HE'D", "'sup", "'llama", "'re'", "'",
                "''", "'x", "a'", "'ŝ", "'K", "'\u212a", "rock'n'roll", "'ſup", "it'ſo", "'LLama",
                "'REx", "'Ve1", "'Dx", "'Mx", "'Tx"]


@pytest.mark.slow
def test_split_matches_hf_on_every_code_point(trained, encoders):
    """Every code point after a letter, after a number, after a space and doubled: the
    piece boundaries are HF's (proves the Unicode 16.0 class table)."""
    native, _ = encoders
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for k in range(0, len(cps), 32768):
        text = "".join(f"a{c}1{c} {c}{c}." for c in map(chr, cps[k:k + 32768]))
        want, got = _hf_ends(trained, text), native.native.split(text)
        if got != want:
            i = next(i for i, (a, b) in enumerate(zip(want, got)) if a != b)
            pytest.fail(f"split differs near {text[max(0, want[i] - 10):want[i] + 4]!r}")


def test_split_matches_hf_on_contractions_and_whitespace(trained, encoders):
    native, _ = encoders
    for text in CONTRACTIONS + WHITESPACE_CASES + ["\r\n\r\n  x", "  \r  \n\t y", "x \t"]:
        assert native.native.split(text) == _hf_ends(trained, text), repr(text)


def test_ids_match_tiktoken_and_hf_on_real_text(trained, encoders):
    native, plain = encoders
    code, prose = _python_texts()
    texts = code[1::2] + prose[1::2] + _demo_texts(20) + CONTRACTIONS + WHITESPACE_CASES
    for text, got in zip(texts, native.encode_batch(texts)):
        assert got.dtype == np.uint32
        assert got.tolist() == plain.encode(text, allowed_special=set(), disallowed_special=())
    tk.check_equivalence(trained, native, texts)  # and HF, with exact round trips


def test_long_pieces_and_a_full_cache_give_the_same_ids(encoders, monkeypatch):
    """Pieces longer than the cache limit (merged through the heap), and more distinct pieces
    than the cache holds (it is dropped and refilled): still tiktoken's ids."""
    native, plain = encoders
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyzéßπж"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12)))
             for _ in range(300_000)]
    # Long pieces (> 64 bytes) take the heap-ordered merge: many ties, small alphabets.
    long_ones = ["x" * 5000, "ab" * 700, "".join(rng.choice("ACGT") for _ in range(100_000))]
    long_ones += ["".join(rng.choice(alphabet) for _ in range(rng.randint(60, 3000)))
                  for alphabet in ("ab", "abc", "ACGT", "aé", letters) for _ in range(40)]
    text = " ".join(words + long_ones)
    got = native.encode(text)
    assert got.tolist() == plain.encode(text, allowed_special=set(), disallowed_special=())
    assert native.native.cache_size() <= 1 << 18  # bounded: dropped when full
    assert native.encode(text).tolist() == got.tolist()  # and again, from a refilled cache


def test_bad_arguments_are_refused(encoders):
    native, _ = encoders
    with pytest.raises(TypeError, match="expected str"):
        native.native.encode(b"bytes")
    with pytest.raises(UnicodeEncodeError):
        native.encode("lone \ud800 surrogate")
    with pytest.raises(ValueError, match="byte 0x00 has no rank"):
        _bpe.Encoder({b"a": 1})
    with pytest.raises(ValueError, match="not usable"):
        _bpe.Encoder({b"": 1})


def test_backend_choice(trained, monkeypatch):
    assert tk.FastEncoder.from_tokenizer(trained).backend == "native"
    assert tk.FastEncoder.from_tokenizer(trained, backend="tiktoken").backend == "tiktoken"
    monkeypatch.setenv(tk.ENCODER_ENV, "tiktoken")
    assert tk.FastEncoder.from_tokenizer(trained).backend == "tiktoken"
    monkeypatch.setenv(tk.ENCODER_ENV, "fastest")
    with pytest.raises(BuildError, match="must be 'native' or 'tiktoken'"):
        tk.FastEncoder.from_tokenizer(trained)
    # Another split pattern: the compiled split does not apply, tiktoken does the work.
    assert tk.native_encoder(r"\S+|\s+", {bytes([b]): b for b in range(256)}) is None
