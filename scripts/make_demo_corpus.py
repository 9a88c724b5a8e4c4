"""Extract the demo corpus (``manifests/demo/``) from real text shipped with Python and with
packages of this project's environment, laid out in the four upstream formats of Mix 0626.

Run once; its output is committed, so every machine builds the identical demo mix (golden
hashes depend on it). Re-running needs the same versions (checked below) to reproduce the
same bytes. Nothing here generates text: every document is a real page, docstring or
source file; the only derived values are metadata no local tool can reproduce (quality
scores, ids), each by a rule written in ``manifests/demo/ATTRIBUTION.md``.

    .venv/bin/python scripts/make_demo_corpus.py [--out manifests/demo]

One file on purpose (past the usual length): the whole provenance of the demo corpus -
what was taken from where, under which license, and every derived field - reads in one
place, next to ATTRIBUTION.md which states it in prose.
"""
from __future__ import annotations

import argparse
import ast
import base64
import gzip
import hashlib
import html.parser
import importlib.metadata
import inspect
import json
import os
import shutil
import sys
import sysconfig
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

EXPECTED = {"python": "3.11.7", "numpy": "2.4.6", "sympy": "1.14.0", "mpmath": "1.3.0",
            "torch": "2.13.0+cpu", "pyarrow": "26.0.1", "zstandard": "0.25.0"}
STDLIB = sysconfig.get_paths()["stdlib"]
INCLUDE = sysconfig.get_paths()["include"]
ZSTD_LEVEL = 19
PERMISSIVE = ("MIT", "BSD", "Apache", "PSF", "ISC", "Python Software Foundation")
DEMO_MAX_BYTES = 130_000  # the demo's stack-v2 size limit (demo.toml); 2 files exceed it
NO_LICENSE = ("antigravity.py", "keyword.py", "this.py")  # relabelled to exercise the filter


def check_versions() -> None:
    import mpmath
    import numpy
    import sympy
    import torch

    got = {"python": ".".join(map(str, sys.version_info[:3])), "numpy": numpy.__version__,
           "sympy": sympy.__version__, "mpmath": mpmath.__version__,
           "torch": torch.__version__, "pyarrow": pa.__version__,
           "zstandard": zstandard.__version__}
    if got != EXPECTED:
        sys.exit(f"versions differ from the committed corpus's: {got} vs {EXPECTED}; the "
                 f"output would not match manifests/demo byte for byte")


def det_uuid(key: str) -> str:
    """A stable UUID (RFC 4122 layout, version 4 bits) from SHA-256 of ``key``."""
    return str(uuid.UUID(bytes=hashlib.sha256(key.encode()).digest()[:16], version=4))


def sha1_b32(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def zstd_jsonl(path: str, records: list[dict]) -> None:
    data = b"".join(json.dumps(r, ensure_ascii=False, sort_keys=False).encode() + b"\n"
                    for r in records)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def write_parquet(path: str, table: pa.Table) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, compression="zstd", compression_level=ZSTD_LEVEL,
                   row_group_size=256)


def split_even(items: list, parts: int) -> list[list]:
    n = len(items)
    return [items[i * n // parts:(i + 1) * n // parts] for i in range(parts)]


def words(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------------------------------
# DCLM-style web pages: docs.python.org pages, pypi.org project pages, PyTorch doc pages.

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


def _license_of(md) -> str:
    for key in ("License-Expression", "License"):
        v = md.get(key)
        if v and len(v) < 60:
            return v.strip()
    for c in md.get_all("Classifier") or []:
        if c.startswith("License :: OSI Approved :: "):
            return c.rsplit(" :: ", 1)[-1]
    return ""


def pypi_pages() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    pages, licenses = [], []
    dists = {d.metadata["Name"].lower(): d for d in importlib.metadata.distributions()}
    for name in sorted(dists):
        d = dists[name]
        md = d.metadata
        lic = _license_of(md)
        if not lic or "MPL" in lic or "GPL" in lic or not any(p in lic for p in PERMISSIVE):
            continue  # only clearly permissive project pages are redistributed
        if name == "open1b":
            continue  # this project itself: its page is our README, not an upstream page
        if not _license_files(d):
            continue  # redistribution needs the license text beside the page
        body = md.get_payload() if md.get_payload() else (md.get("Description") or "")
        version = md["Version"]
        pages.append((f"https://pypi.org/project/{md['Name']}/{version}/", body))
        licenses.append((md["Name"], version, lic, _license_files(d)))
    return pages, licenses


def _license_files(dist) -> list[str]:
    """License/notice files a distribution ships in its dist-info (top level only)."""
    files = []
    for f in dist.files or []:
        parts = f.parts
        if not parts[0].endswith(".dist-info") or len(parts) > 3:
            continue
        if len(parts) == 3 and parts[1] != "licenses":
            continue
        if parts[-1].upper().startswith(("LICEN", "COPYING", "NOTICE", "AUTHORS")):
            files.append(str(dist.locate_file(f)))
    return sorted(files)


def copy_licenses(out: str, licenses: list) -> None:
    """Beside the text: CPython's license, and each redistributed package's own files."""
    dest = os.path.join(out, "licenses")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.join(dest, "pypi"))
    shutil.copyfile(os.path.join(STDLIB, "LICENSE.txt"),
                    os.path.join(dest, "CPython-3.11.7-LICENSE.txt"))
    # Packages whose docstrings/sources are used directly (whether or not their pypi.org
    # page is part of the DCLM-style pages).
    for pkg in ("numpy", "sympy", "mpmath", "torch"):
        dist = importlib.metadata.distribution(pkg)
        for src in _license_files(dist):
            d = os.path.join(dest, "pypi", f"{dist.metadata['Name']}-{dist.version}")
            os.makedirs(d, exist_ok=True)
            shutil.copyfile(src, os.path.join(d, os.path.basename(src)))
    index = []
    for name, version, lic, files in licenses:
        copied = []
        for src in files:
            d = os.path.join(dest, "pypi", f"{name}-{version}")
            os.makedirs(d, exist_ok=True)
            shutil.copyfile(src, os.path.join(d, os.path.basename(src)))
            copied.append(f"licenses/pypi/{name}-{version}/{os.path.basename(src)}")
        index.append({"name": name, "version": version, "license": lic, "files": copied})
    with open(os.path.join(out, "pypi-licenses.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


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


# ---------------------------------------------------------------------------------------
# FineWeb-Edu-style educational pages: the NumPy reference pages (function docstrings).

def edu_score(doc: str) -> float:
    """The demo's stand-in for the FineWeb-Edu classifier (ATTRIBUTION.md): points for the
    parts of a reference page that teach - parameters, results, worked examples, notes -
    plus up to one point for length."""
    s = 1.0
    s += 0.75 * ("Parameters\n----------" in doc)
    s += 0.5 * ("Returns\n-------" in doc)
    s += 1.0 * ("Examples\n--------" in doc)
    s += 0.5 * ("Notes\n-----" in doc or "See Also\n--------" in doc)
    s += min(1.0, words(doc) / 500.0)
    return round(s, 4)


def numpy_pages() -> list[tuple[str, str, str]]:
    import numpy as np

    seen, pages = set(), []
    for prefix, mod in (("numpy", np), ("numpy.linalg", np.linalg), ("numpy.fft", np.fft),
                        ("numpy.random", np.random), ("numpy.polynomial", np.polynomial),
                        ("numpy.ma", np.ma)):
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name)
            if not callable(obj) or isinstance(obj, type) and issubclass(obj, np.generic):
                continue
            doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else ""
            key = id(obj)
            if key in seen or len(doc) < 200:
                continue
            seen.add(key)
            src = inspect.getsourcefile(obj) if inspect.isfunction(obj) else None
            rel = os.path.relpath(src, os.path.dirname(os.path.dirname(np.__file__))) \
                if src else f"{prefix}/{name}"
            pages.append((f"https://numpy.org/doc/2.4/reference/generated/{prefix}.{name}"
                          f".html", inspect.cleandoc(doc) + "\n", rel))
    return pages


def make_fineweb(out: str) -> int:
    pages = numpy_pages()
    total = 0
    for i, part in enumerate(split_even(pages, 2)):
        dump = f"CC-MAIN-DEMO-NUMPY-{i + 1}"
        rows = []
        for url, text, file_path in part:
            score = edu_score(text)
            letters = [c for c in text if c.isalpha()]
            rows.append({
                "text": text, "id": f"<urn:uuid:{det_uuid('fineweb-edu:' + url)}>",
                "dump": dump, "url": url, "file_path": file_path, "language": "en",
                "language_score": round(sum(c.isascii() for c in letters) / max(1, len(letters)), 4),
                "token_count": words(text), "score": score,
                "int_score": int(round(max(0.0, min(score, 5.0)))),
            })
            total += len(text.encode())
        schema = pa.schema([("text", pa.string()), ("id", pa.string()), ("dump", pa.string()),
                            ("url", pa.string()), ("file_path", pa.string()),
                            ("language", pa.string()), ("language_score", pa.float64()),
                            ("token_count", pa.int64()), ("score", pa.float64()),
                            ("int_score", pa.int64())])
        write_parquet(os.path.join(out, "fineweb-edu", "data", dump, "000_00000.parquet"),
                      pa.Table.from_pylist(rows, schema=schema))
    return total


# ---------------------------------------------------------------------------------------
# The Stack v2-style code: CPython's Lib/ and Include/ files + a gzip content store.

STACK_SCHEMA = pa.schema([
    ("blob_id", pa.string()), ("directory_id", pa.string()), ("path", pa.string()),
    ("content_id", pa.string()), ("detected_licenses", pa.list_(pa.string())),
    ("license_type", pa.string()), ("repo_name", pa.string()), ("snapshot_id", pa.string()),
    ("revision_id", pa.string()), ("branch_name", pa.string()),
    ("visit_date", pa.timestamp("ns")), ("revision_date", pa.timestamp("ns")),
    ("committer_date", pa.timestamp("ns")), ("github_id", pa.int64()),
    ("star_events_count", pa.int64()), ("fork_events_count", pa.int64()),
    ("gha_license_id", pa.string()), ("gha_event_created_at", pa.timestamp("ns")),
    ("gha_created_at", pa.timestamp("ns")), ("gha_language", pa.string()),
    ("src_encoding", pa.string()), ("language", pa.string()), ("is_vendor", pa.bool_()),
    ("is_generated", pa.bool_()), ("length_bytes", pa.int64()), ("extension", pa.string()),
])


def stack_files() -> dict[str, list[tuple[str, str, str]]]:
    """language -> [(absolute file, repo path, src_encoding)]."""
    lib = sorted(f for f in os.listdir(STDLIB) if f.endswith(".py"))
    py, budget = [], 650_000
    for f in lib:
        size = os.path.getsize(os.path.join(STDLIB, f))
        if f in ("_pydecimal.py", "turtle.py") or f in NO_LICENSE or (
                size <= DEMO_MAX_BYTES and budget > 0):
            py.append((os.path.join(STDLIB, f), f"Lib/{f}", "UTF-8"))
            budget -= size if size <= DEMO_MAX_BYTES else 0
    for f, enc in (("module_iso_8859_1.py", "ISO-8859-1"), ("module_koi8_r.py", "KOI8-R")):
        py.append((os.path.join(STDLIB, "test", "encoded_modules", f),
                   f"Lib/test/encoded_modules/{f}", enc))
    c, budget = [], 150_000
    for f in sorted(os.listdir(INCLUDE)):
        if f.endswith(".h") and budget > 0:
            c.append((os.path.join(INCLUDE, f), f"Include/{f}", "UTF-8"))
            budget -= os.path.getsize(os.path.join(INCLUDE, f))
    css = [(os.path.join(STDLIB, "pydoc_data", "_pydoc.css"), "Lib/pydoc_data/_pydoc.css",
            "UTF-8")]
    return {"Python": py, "C": c, "CSS": css}


def make_stack(out: str) -> int:
    store = os.path.join(out, "the-stack-v2", "content")
    os.makedirs(store, exist_ok=True)
    total = 0
    for language, files in stack_files().items():
        rows = []
        for src, path, enc in files:
            with open(src, "rb") as f:
                data = f.read()
            data.decode(enc)  # the label must be true
            blob = git_blob_sha1(data)
            with open(os.path.join(store, blob), "wb") as f:
                f.write(gzip.compress(data, compresslevel=9, mtime=0))
            name = path.rsplit("/", 1)[-1]
            rows.append({
                "blob_id": blob, "directory_id": None, "path": "/" + path,
                "content_id": hashlib.sha1(data).hexdigest(),
                "detected_licenses": [] if name in NO_LICENSE else ["PSF-2.0"],
                "license_type": "no_license" if name in NO_LICENSE else "permissive",
                "repo_name": "python/cpython", "snapshot_id": None, "revision_id": None,
                "branch_name": "refs/tags/v3.11.7", "visit_date": None, "revision_date": None,
                "committer_date": None, "github_id": None, "star_events_count": None,
                "fork_events_count": None, "gha_license_id": None,
                "gha_event_created_at": None, "gha_created_at": None,
                "gha_language": language, "src_encoding": enc, "language": language,
                "is_vendor": False, "is_generated": False, "length_bytes": len(data),
                "extension": name.rsplit(".", 1)[-1],
            })
            total += len(data)
        parts = split_even(rows, 2 if len(rows) > 40 else 1)
        for i, part in enumerate(parts):
            write_parquet(os.path.join(out, "the-stack-v2", "data", language,
                                       f"train-{i:05d}-of-{len(parts):05d}.parquet"),
                          pa.Table.from_pylist(part, schema=STACK_SCHEMA))
    return total


# ---------------------------------------------------------------------------------------
# Proof-Pile-2-style math: mpmath's LaTeX-heavy function documentation (arxiv), SymPy's
# documentation pages (open-web-math) and SymPy/mpmath source code (algebraic-stack).

def mpmath_function_docs() -> list[tuple[str, str]]:
    import mpmath

    path = os.path.join(os.path.dirname(mpmath.__file__), "function_docs.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docs = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            docs.append((node.targets[0].id, inspect.cleandoc(node.value.value) + "\n"))
    return docs


def sympy_pages() -> list[tuple[str, str]]:
    import sympy

    pages = []
    for name in sorted(dir(sympy)):
        obj = getattr(sympy, name)
        doc = getattr(obj, "__doc__", None)
        if name.startswith("_") or not isinstance(doc, str) or len(doc) < 1500:
            continue
        if not any(m in doc for m in (".. math::", "$", "\\frac", "\\int", "\\sum")):
            continue
        pages.append((f"https://docs.sympy.org/1.14/search.html?q={name}",
                      inspect.cleandoc(doc) + "\n"))
    return pages


def math_sources() -> list[tuple[str, str, str]]:
    import mpmath
    import sympy

    out = []
    for pkg, sub, repo in ((mpmath, "functions", "mpmath/mpmath"),
                           (sympy, "ntheory", "sympy/sympy")):
        root = os.path.dirname(pkg.__file__)
        d = os.path.join(root, sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".py"):
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    out.append((repo, f"{pkg.__name__}/{sub}/{f}", fh.read()))
    return out


def make_proof_pile(out: str) -> int:
    root = os.path.join(out, "proof-pile-2")
    arxiv = [{"text": t, "meta": {"source": "mpmath 1.3.0 function_docs.py", "object": f"mpmath.{n}",
                                   "url": f"https://mpmath.org/doc/1.3.0/search.html?q={n}",
                                   "language": "en"}}
             for n, t in mpmath_function_docs()]
    owm = [{"text": t, "meta": {"url": u, "date": None}} for u, t in sympy_pages()]
    alg = [{"text": t, "meta": {"max_stars_repo_name": repo, "max_stars_repo_path": path,
                                "id": f"{repo}:{path}"}}
           for repo, path, t in math_sources()]
    total = 0
    for sub, recs, stem, parts in (("arxiv", arxiv, "arXiv_{:03d}", 2),
                                   ("open-web-math", owm, "shard-{:04d}", 1),
                                   ("algebraic-stack", alg, "algebraic_stack_train_{:04d}", 2)):
        for i, part in enumerate(split_even(recs, parts)):
            zstd_jsonl(os.path.join(root, sub, "train", stem.format(i) + ".jsonl.zst"), part)
        total += sum(len(r["text"].encode()) for r in recs)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..",
                                                  "manifests", "demo"))
    args = ap.parse_args()
    check_versions()
    out = os.path.normpath(args.out)
    for sub in ("dclm-baseline", "fineweb-edu", "the-stack-v2", "proof-pile-2"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    sizes = {}
    sizes["dclm-baseline"], licenses = make_dclm(out)
    sizes["fineweb-edu"] = make_fineweb(out)
    sizes["the-stack-v2"] = make_stack(out)
    sizes["proof-pile-2"] = make_proof_pile(out)
    copy_licenses(out, licenses)
    total = sum(sizes.values())
    for name, b in sizes.items():
        print(f"{name:15s} {b:>10,d} bytes of text written")
    print(f"{'total':15s} {total:>10,d}")
    print_shares(os.path.join(os.path.dirname(out), "demo.toml"))


def print_shares(mix_path: str) -> None:
    """The text bytes each source keeps after its filters, read back through the real
    readers: the `share` values of demo.toml are these bytes' proportions."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from open1b_data.build.document import Document
    from open1b_data.build.definition import load_mix
    from open1b_data.build.sources import list_inputs, read_input

    if not os.path.exists(mix_path):
        return
    kept = {}
    for spec in load_mix(mix_path).sources:
        kept[spec.name] = sum(len(r.text.encode()) for inp in list_inputs(spec)
                              for r in read_input(spec, inp) if isinstance(r, Document))
    total = sum(kept.values())
    for name, b in kept.items():
        print(f"{name:15s} {b:>10,d} bytes kept   share = {b / total:.3f}")


if __name__ == "__main__":
    main()
