"""Proof-Pile-2-style math: mpmath's LaTeX-heavy function documentation (arxiv), SymPy's
documentation pages (open-web-math) and SymPy/mpmath source code (algebraic-stack), as
zstd JSON lines in Proof-Pile-2's subset layout."""
from __future__ import annotations

import ast
import inspect
import os

from demo_corpus.records import split_even, zstd_jsonl


def mpmath_function_docs() -> list[tuple[str, str]]:
    import mpmath

    path = os.path.join(os.path.dirname(mpmath.__file__), "function_docs.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docs = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
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
