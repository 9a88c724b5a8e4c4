"""Tokenizer: deterministic sample and training, HF vs tiktoken ids, round trip, loading."""
from __future__ import annotations

import glob
import hashlib
import importlib
import os
import sysconfig
from pathlib import Path
from collections import Counter

import numpy as np
import pytest

from open1b_data.ingest import tokenizer as tk
from open1b_data.errors import BuildError
from open1b_data.formats.definition import TokenizerSpec, default_mix_path, load_mix
from open1b_data.ingest.sources import list_inputs, read_input
from open1b_data.ingest.document import Document

SPEC = TokenizerSpec(vocab_size=4096)


def _python_texts() -> tuple[list[str], list[str]]:
    """Real text found on every Python install: stdlib sources and pydoc's prose topics."""
    lib = sysconfig.get_paths()["stdlib"]
    files = [f for f in sorted(glob.glob(f"{lib}/*.py")) if os.path.getsize(f) < 60_000][:60]
    code = [Path(f).read_text(encoding="utf-8") for f in files]
    topics = importlib.import_module("pydoc_data.topics").topics
    prose = [topics[k] for k in sorted(topics)]
    return code, prose


def _demo_texts(per_source: int = 40) -> list[str]:
    """Kept documents of the committed demo corpus (all four sources)."""
    mix = load_mix(default_mix_path())
    texts = []
    for spec in mix.sources:
        n = 0
        for inp in list_inputs(spec):
            for r in read_input(spec, inp):
                if isinstance(r, Document) and n < per_source:
                    texts.append(r.text)
                    n += 1
    return texts


@pytest.fixture(scope="module")
def corpus():
    code, prose = _python_texts()
    demo = _demo_texts()
    train = code[::2] + prose[::2] + demo[::2]
    held_out = code[1::2] + prose[1::2] + demo[1::2]
    return train, held_out


@pytest.fixture(scope="module")
def trained(corpus):
    return tk.train_tokenizer(SPEC, corpus[0])


def test_training_is_byte_deterministic(tmp_path, corpus, trained):
    tk.save_tokenizer(trained, str(tmp_path / "a.json"))
    tk.save_tokenizer(tk.train_tokenizer(SPEC, corpus[0]), str(tmp_path / "b.json"))
    a, b = (tmp_path / "a.json").read_bytes(), (tmp_path / "b.json").read_bytes()
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()
    assert trained.get_vocab_size() == SPEC.vocab_size
    assert trained.token_to_id(SPEC.eot) == 0
    # A different training text gives a different file (the test can fail).
    tk.save_tokenizer(tk.train_tokenizer(SPEC, corpus[1]), str(tmp_path / "c.json"))
    assert (tmp_path / "c.json").read_bytes() != a


@pytest.mark.parametrize("backend", ["native", "tiktoken"])
def test_hf_and_fast_encoder_identical_and_round_trip(corpus, trained, backend):
    if backend == "native":
        pytest.importorskip("open1b_data.ingest.tokenizer._bpe", reason="compiled encoder not built")
    fast = tk.FastEncoder.from_tokenizer(trained, backend=backend)
    assert fast.backend == backend
    assert fast.eot_id == 0
    texts = corpus[1] + corpus[0][:40] + [
        "", " ", "\n\n\t  x", "a literal <|endoftext|> inside text", "naïve café 日本語 🎉 e\u0301",
        "x = 1234567890 + 3.14159e-10", "''\"\"'s'll'VE\r\n\r\n  \u00a0\u2003end"]
    tk.check_equivalence(trained, fast, texts)  # raises on the first difference
    trained.encode_special_tokens = True
    ref = trained.encode_batch(texts, add_special_tokens=False)
    got = fast.encode_batch(texts)
    n_tokens = 0
    for text, r, g in zip(texts, ref, got):
        assert g.dtype == np.uint32
        assert r.ids == g.tolist()
        assert fast.decode(g) == text
        assert trained.decode(r.ids, skip_special_tokens=False) == text
        n_tokens += len(g)
    assert n_tokens > 100_000  # a real amount of text was compared
    # The separator inside a document is text, not the separator id.
    assert 0 not in fast.encode("a literal <|endoftext|> inside text").tolist()
    threaded = tk.FastEncoder.from_tokenizer(trained, threads=2, backend=backend).encode_batch(texts)
    assert all(np.array_equal(a, b) for a, b in zip(threaded, got))


WHITESPACE_CASES = [
    "a  b", "a \tb", "  \n  x", "x   ", "\u3000\u3000y", "1  2", "a  (b)", "tab\t\tend",
    "\n\n    def f():\n        return 1\n", " \u00a0 word", "end  ", "  ", "\t", "x\r\n  \r\n y",
    "it's  'll  \u2028\u2028z", "a\x0b\x0cb", "\u1680\u1680!", "  .  ,  ;"]


def test_delegated_pattern_splits_the_same(corpus, trained):
    """The faster spelling of the split pattern gives the same ids as the pattern itself."""
    import tiktoken

    from open1b_data.formats.definition import LLAMA3_SPLIT

    grouped = tk.delegated_pattern(LLAMA3_SPLIT)
    assert grouped == "(?:" + LLAMA3_SPLIT[: -len(tk.LOOKAHEAD_TAIL)] + ")" + tk.LOOKAHEAD_TAIL
    for other in (r"\s+(?!\S)|\s+", "a\\" + tk.LOOKAHEAD_TAIL, r"(?=x)y" + tk.LOOKAHEAD_TAIL,
                  r"\p{L}+|\s+"):
        assert tk.delegated_pattern(other) == other  # nothing to group, or unsafe to
    fast = tk.FastEncoder.from_tokenizer(trained, backend="tiktoken")
    assert fast.encoding._pat_str == grouped
    plain = tiktoken.Encoding(name="plain", pat_str=LLAMA3_SPLIT,
                              mergeable_ranks=fast.encoding._mergeable_ranks,
                              special_tokens=fast.encoding._special_tokens)
    texts = corpus[1] + WHITESPACE_CASES
    got = fast.encode_batch(texts)
    for text, g in zip(texts, got):
        want = plain.encode(text, allowed_special=set(), disallowed_special=())
        assert g.tolist() == want, text[:80]
    tk.check_equivalence(trained, fast, WHITESPACE_CASES)


def test_check_equivalence_names_the_difference(trained):
    fast = tk.FastEncoder.from_tokenizer(trained)

    class Skewed(tk.FastEncoder):
        def encode(self, text):
            ids = super().encode(text)
            if "needle" in text:
                ids = ids.copy()
                ids[2] = (ids[2] + 1) % 4000 + 1
            return ids

    skewed = Skewed(fast.encoding, fast.eot_id)
    with pytest.raises(BuildError, match=r"document 1 at token 2"):
        tk.check_equivalence(trained, skewed, ["fine text", "a needle in a haystack"])


def test_check_equivalence_checks_given_ids(trained):
    """A build passes the ids it stores; a wrong stored id fails the check."""
    fast = tk.FastEncoder.from_tokenizer(trained)
    texts = ["fine text", "a needle in a haystack"]
    ids = fast.encode_batch(texts)
    tk.check_equivalence(trained, fast, texts, ids)
    bad = [ids[0], ids[1].copy()]
    bad[1][-1] += 1
    with pytest.raises(BuildError, match=r"document 1 at token"):
        tk.check_equivalence(trained, fast, texts, bad)
    with pytest.raises(BuildError, match="2 texts but 1 id arrays"):
        tk.check_equivalence(trained, fast, texts, ids[:1])


def test_loads_in_tokenizers_and_transformers(tmp_path, trained):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = str(tmp_path / "tokenizer.json")
    tk.save_tokenizer(trained, path)
    text = "def f(x):\n    return x ** 2  # squares\n"
    want = trained.encode(text).ids
    assert Tokenizer.from_file(path).encode(text).ids == want
    assert tk.load_tokenizer(path).encode(text).ids == want
    hf = PreTrainedTokenizerFast(tokenizer_file=path, eos_token=SPEC.eot)
    assert hf(text)["input_ids"] == want
    assert hf.decode(want) == text
    assert hf.eos_token_id == 0
    with pytest.raises(BuildError, match="does not exist"):
        tk.load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BuildError, match="cannot be loaded"):
        tk.load_tokenizer(str(tmp_path / "bad.json"))


def test_sample_is_deterministic_and_proportional():
    mix = load_mix(default_mix_path())
    inputs = {s.name: list_inputs(s) for s in mix.sources}
    a = tk.select_sample(mix, inputs)
    b = tk.select_sample(mix, {k: list(reversed(v)) for k, v in inputs.items()})
    assert a.to_dict() == b.to_dict()  # listing order does not matter
    assert list(a.texts()) == list(b.texts())
    quotas = tk.source_quotas(mix, {k: sum(i.size for i in v) for k, v in inputs.items()})
    assert sum(quotas.values()) <= mix.tokenizer.sample_bytes
    rec = {s["name"]: s for s in a.to_dict()["sources"]}
    for spec in mix.sources:
        r = rec[spec.name]
        assert r["quota_bytes"] == quotas[spec.name]
        assert quotas[spec.name] == int(mix.tokenizer.sample_bytes * spec.share
                                        / sum(s.share for s in mix.sources))
        # Either the quota is met (the last document may overshoot it) or the source ran out.
        kept = {i.path: [d for d in read_input(spec, i) if isinstance(d, Document)]
                for i in inputs[spec.name]}
        if r["bytes"] < r["quota_bytes"]:
            assert r["documents"] == sum(len(v) for v in kept.values())
        # The record says exactly which rows: re-reading them gives the sampled texts.
        recorded = []
        for entry in r["inputs"]:
            wanted = {row for lo, hi in entry["rows"] for row in range(lo, hi)}
            recorded += [d.text for d in kept[entry["path"]] if d.row in wanted]
        assert len(recorded) == r["documents"]
        assert sum(len(t.encode()) for t in recorded) == r["bytes"]
        assert Counter(recorded) <= Counter(a.texts())
    assert sum(s["documents"] for s in rec.values()) == len(list(a.texts()))


def test_quotas_without_shares_follow_input_bytes():
    import dataclasses

    mix = load_mix(default_mix_path())
    unshared = dataclasses.replace(mix, sources=tuple(dataclasses.replace(s, share=None)
                                                      for s in mix.sources))
    sizes = {s.name: 1000 * (i + 1) for i, s in enumerate(mix.sources)}
    q = tk.source_quotas(unshared, sizes)
    total = sum(sizes.values())
    assert q == {k: int(mix.tokenizer.sample_bytes * v / total) for k, v in sizes.items()}


def test_training_same_bytes_serial_and_parallel(tmp_path):
    """HF's thread pool must not change the result: train serially in a subprocess and
    with 2 threads here, compare the files byte for byte."""
    import subprocess
    import sys

    script = (
        "import sys, glob, sysconfig\n"
        "from open1b_data.ingest import tokenizer as tk\n"
        "from open1b_data.formats.definition import TokenizerSpec\n"
        "lib = sysconfig.get_paths()['stdlib']\n"
        "files = sorted(glob.glob(lib + '/*.py'))[:80]\n"
        "texts = [open(f, encoding='utf-8').read() for f in files]\n"
        "tk.save_tokenizer(tk.train_tokenizer(TokenizerSpec(vocab_size=3000), texts), "
        "sys.argv[1])\n")
    outs = []
    for parallel, threads in (("false", "1"), ("true", "2")):
        out = tmp_path / f"tok-{parallel}.json"
        env = {**os.environ, "TOKENIZERS_PARALLELISM": parallel, "RAYON_RS_NUM_CPUS": threads}
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env,
                       cwd=Path(__file__).resolve().parents[2])
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
