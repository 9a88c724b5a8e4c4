"""Licenses of the redistributed text: which installed distributions are clearly
permissive, their license files, and the copies written beside the corpus (CPython's
license, each package's own files, ``pypi-licenses.json``)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil

from demo_corpus.records import STDLIB

PERMISSIVE = ("MIT", "BSD", "Apache", "PSF", "ISC", "Python Software Foundation")


def license_of(md) -> str:
    for key in ("License-Expression", "License"):
        v = md.get(key)
        if v and len(v) < 60:
            return v.strip()
    for c in md.get_all("Classifier") or []:
        if c.startswith("License :: OSI Approved :: "):
            return c.rsplit(" :: ", 1)[-1]
    return ""


def license_files(dist) -> list[str]:
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
        for src in license_files(dist):
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
