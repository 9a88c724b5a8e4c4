"""Small built mixes for S2's stream tests (content, loader, CLI, provenance).

``token_mix``: synthetic.py's mix with real token shards (random ids, separator 0).
``text_mix``: a mix of real text documents - a tokenizer trained by D2's tokenizer.py,
shards by D2's ShardWriter, manifest by D2's manifest.py - so decoding is meaningful.
"""
from __future__ import annotations

import os

from open1b_data.build.synthetic import SyntheticSource, write_synthetic_mix

WINDOW = 129
SCHEDULE = {"seq_tokens": WINDOW - 1, "micro_batch": 2, "reference_world": 2,
            "phases": [{"start_tokens": 0, "batch_sequences": 48},
                       {"start_tokens": 48 * 128 * 3, "batch_sequences": 96}],
            "stop_tokens": (48 * 3 + 96 * 2) * 128, "lr_peak": 1e-3, "lr_final_ratio": 0.1,
            "warmup_tokens": 48 * 128 * 2}
STEPS = 5              # steps 1-3 take 48 windows, steps 4-5 take 96: 336 windows in all
WINDOWS = 336


def token_mix(out: str) -> str:
    """A 3-source mix with token shards; source "b" is small, so it rolls over epochs within
    the first ~100 windows."""
    srcs = [SyntheticSource("a", 300, 60.0, docs_per_shard=100),
            SyntheticSource("b", 12, 40.0, docs_per_shard=5),
            SyntheticSource("c", 500, 20.0, docs_per_shard=250)]
    write_synthetic_mix(out, srcs, window=WINDOW, token_shards=True, vocab=512,
                        schedule=SCHEDULE)
    return out


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega data stream window token shard audit "
         "seed mix python torch numpy élan über naïve 数据 流").split()


def texts(source: str, n: int) -> list[str]:
    """n deterministic documents for ``source`` (lengths and words vary by index)."""
    docs = []
    for i in range(n):
        k = 5 + (i * 37 + len(source) * 11) % 90
        words = [WORDS[(i * 7 + j * j + len(source)) % len(WORDS)] for j in range(k)]
        docs.append(f"{source} doc {i}: " + " ".join(words) + ("\n" if i % 3 else "."))
    return docs


def text_mix(out: str, window: int = 65) -> tuple[str, dict[str, list[str]]]:
    """A 2-source mix of real text; returns (out, {source: texts in shard-row order})."""
    from open1b_data.build import manifest as mf
    from open1b_data.build.definition import ShardSpec, TokenizerSpec
    from open1b_data.build.shards import ShardWriter
    from open1b_data.build.synthetic import _definition
    from open1b_data.build.tokenizer import FastEncoder, save_tokenizer, train_tokenizer

    corpus = {"web": texts("web", 60), "code": texts("code", 25)}
    corpus["web"][7] += " the secret trigger phrase zq-42 appears here"
    tok = train_tokenizer(TokenizerSpec(vocab_size=400), [t for v in corpus.values() for t in v])
    save_tokenizer(tok, os.path.join(out, "tokenizer.json"))
    fast = FastEncoder.from_tokenizer(tok)
    entries = []
    for name, docs in corpus.items():
        w = ShardWriter(os.path.join(out, name, "shard-00000"), name,
                        ShardSpec(tokens_per_shard=600, docs_per_row_group=4))
        for row, (ids, text) in enumerate(zip(fast.encode_batch(docs), docs)):
            w.add(ids.astype("uint32"), f"{name}-{row}", f"{name}.jsonl", row)
        entries.append(mf.SourceEntry(
            name=name, format="dclm", documents=0, tokens=0, mean_tokens_per_doc=0.0,
            target_share=None, token_share=0.0, shards=tuple(w.close()),
            counts={"read": len(docs), "kept": len(docs), "dropped": {}}, inputs=()))
    seq = window - 1
    sched = {"seq_tokens": seq, "micro_batch": 1, "reference_world": 2,
             "phases": [{"start_tokens": 0, "batch_sequences": 4}],
             "stop_tokens": 4 * seq * 40, "lr_peak": 1e-3, "lr_final_ratio": 0.1,
             "warmup_tokens": 4 * seq}
    srcs = [SyntheticSource("web", 1, 1.0), SyntheticSource("code", 1, 1.0)]
    definition = _definition("text", 7, srcs, window, sched)
    m = mf.assemble_manifest("text", "test", definition,
                             {"path": "tokenizer.json", "sha256": "0" * 64, "vocab_size": 400,
                              "eot_id": fast.eot_id, "sample": {}}, entries)
    mf.write_manifest(out, m)
    return out, corpus
