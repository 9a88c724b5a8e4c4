"""FineWeb-Edu-style educational pages: the NumPy reference pages (function docstrings),
scored by the demo's stand-in for the FineWeb-Edu classifier, in FineWeb-Edu's Parquet
schema and dump layout."""
from __future__ import annotations

import inspect
import os

import pyarrow as pa

from demo_corpus.records import det_uuid, split_even, words, write_parquet


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
            rel = (os.path.relpath(src, os.path.dirname(os.path.dirname(np.__file__)))
                if src else f"{prefix}/{name}")
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
