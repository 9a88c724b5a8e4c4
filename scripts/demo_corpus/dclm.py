"""DCLM-style web pages: docs.python.org pages, pypi.org project pages, PyTorch doc pages,
as DCLM baseline records (WARC metadata, word counts, the quality-classifier field) in
zstd JSON lines laid out as DCLM's global/local shards."""
from __future__ import annotations

import html.parser
import importlib.metadata
import inspect
import os

from demo_corpus.licenses import PERMISSIVE, license_files, license_of
from demo_corpus.records import STDLIB, det_uuid, sha1_b32, split_even, words, zstd_jsonl


class _HtmlText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "li", "h1", "h2", "h3", "h4", "pre", "dt", "dd", "tr", "br", "table",
             "section", "ul", "ol", "dl", "blockquote"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self.skip -= 1
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)

    def text(self) -> str:
        lines = [" ".join(line.split()) for line in "".join(self.out).splitlines()]
        text = "\n".join(lines)
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        return text.strip() + "\n"


def python_doc_pages() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    pages = [(f"https://docs.python.org/3.11/search.html?q={name}", topics[name])
             for name in sorted(topics)]
    parser = _HtmlText()
    with open(os.path.join(STDLIB, "idlelib", "help.html"), encoding="utf-8") as f:
        parser.feed(f.read())
    pages.append(("https://docs.python.org/3.11/library/idle.html", parser.text()))
    return pages


def pypi_pages() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    pages, licenses = [], []
    dists = {d.metadata["Name"].lower(): d for d in importlib.metadata.distributions()}
    for name in sorted(dists):
        d = dists[name]
        md = d.metadata
        lic = license_of(md)
        if not lic or "MPL" in lic or "GPL" in lic or not any(p in lic for p in PERMISSIVE):
            continue  # only clearly permissive project pages are redistributed
        if name == "open1b":
            continue  # this project itself: its page is our README, not an upstream page
        if not license_files(d):
            continue  # redistribution needs the license text beside the page
        body = md.get_payload() if md.get_payload() else (md.get("Description") or "")
        version = md["Version"]
        pages.append((f"https://pypi.org/project/{md['Name']}/{version}/", body))
        licenses.append((md["Name"], version, lic, license_files(d)))
    return pages, licenses


def torch_pages() -> list[tuple[str, str]]:
    import torch

    pages, seen = [], set()
    for prefix, mod in (("torch", torch), ("torch.nn", torch.nn),
                        ("torch.nn.functional", torch.nn.functional),
                        ("torch.linalg", torch.linalg), ("torch.special", torch.special),
                        ("torch.fft", torch.fft), ("torch.optim", torch.optim),
                        ("torch.distributions", torch.distributions),
                        ("torch.Tensor", torch.Tensor)):
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            doc = getattr(obj, "__doc__", None)
            if not callable(obj) or not isinstance(doc, str) or len(doc) < 600:
                continue
            if prefix == "torch" and isinstance(obj, type) or doc in seen:
                continue
            seen.add(doc)
            pages.append((f"https://docs.pytorch.org/docs/2.13/generated/{prefix}.{name}.html",
                          inspect.cleandoc(doc) + "\n"))
    return pages


def dclm_record(url: str, text: str, site: str) -> dict:
    body = text.encode("utf-8")
    n = words(text)
    return {
        "bff_contained_ngram_count_before_dedupe": 0,
        "language_id_whole_page_fasttext": {"en": 1.0},
        "metadata": {
            "Content-Length": str(len(body)),
            "Content-Type": "text/plain",
            "WARC-Payload-Digest": sha1_b32(body),
            "WARC-Record-ID": f"<urn:uuid:{det_uuid('dclm:' + url)}>",
            "WARC-Target-URI": url,
            "WARC-Type": "conversion",
            "WARC-Warcinfo-ID": f"<urn:uuid:{det_uuid('warcinfo:' + site)}>",
        },
        "previous_word_count": n,
        "text": text,
        "url": url,
        "warcinfo": f"software: open1b scripts/make_demo_corpus.py\nformat: WARC File "
                    f"Format 1.1\ndescription: {site}, extracted from the installed copy",
        "fasttext_openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train_prob":
            round(1.0 - 1.0 / (1.0 + n / 200.0), 6),
    }


def make_dclm(out: str) -> tuple[int, list]:
    py = [dclm_record(u, t, "docs.python.org 3.11") for u, t in python_doc_pages()]
    pypi, licenses = pypi_pages()
    pp = [dclm_record(u, t, "pypi.org project pages") for u, t in pypi]
    tp = [dclm_record(u, t, "docs.pytorch.org 2.13") for u, t in torch_pages()]
    files = {
        "global-shard_01_of_10/local-shard_0_of_10/shard_00000000_processed.jsonl.zstd": py,
        "global-shard_01_of_10/local-shard_1_of_10/shard_00000000_processed.jsonl.zstd": pp,
    }
    for i, part in enumerate(split_even(tp, 3)):
        files[f"global-shard_02_of_10/local-shard_0_of_10/shard_0000000{i}_processed"
              f".jsonl.zstd"] = part
    total = 0
    for rel, recs in files.items():
        zstd_jsonl(os.path.join(out, "dclm-baseline", rel), recs)
        total += sum(len(r["text"].encode()) for r in recs)
    return total, licenses
