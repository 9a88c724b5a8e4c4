"""Paths inside a built mix: what a manifest may name, and where that lies.

A manifest is data made by others, so every path read from one is confined before use:
relative to the mix root, '/'-separated, no absolute path, URL, drive letter, backslash,
control character, empty, ``.`` or ``..`` component (``check_path``). ``resolve`` is the
only way to turn such a path into a URL or local path.
"""
from __future__ import annotations

import re
from typing import Any

from open1b.safeio import refuse_linked_dirs
from open1b_data.errors import ManifestError
from open1b_data.storage import join

MANIFEST = "manifest.json"

# A confined path, all at once: components of characters other than '/', backslash and
# C0 controls, none of them '.' or '..', and no drive letter in front. An empty component
# (a leading '/', '//', a trailing '/') cannot match, and a URL's '://' holds one.
_COMPONENT = r"(?!\.\.?(?:/|\Z))[^/\\\x00-\x1f]+"
CONFINED = re.compile(rf"(?![A-Za-z]:){_COMPONENT}(?:/{_COMPONENT})*")


def check_path(rel: Any, what: str = "path") -> str:
    """``rel`` if it is a confined, '/'-separated relative path; else ``ManifestError``."""
    if type(rel) is str and CONFINED.fullmatch(rel):
        return rel
    if not isinstance(rel, str) or not rel:
        raise ManifestError(f"{what}: expected a non-empty relative path, got {rel!r}")
    bad = None
    if "\\" in rel:
        bad = "contains a backslash"
    elif "://" in rel or rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        bad = "is absolute"
    elif any(part in ("", ".", "..") for part in rel.split("/")):
        bad = "has an empty, '.' or '..' component"
    elif any(ord(c) < 32 for c in rel):
        bad = "contains a control character"
    else:   # unreachable while CONFINED and these rules agree (tested on random paths)
        bad = "is not a confined path"
    if bad:
        raise ManifestError(f"{what}: {rel!r} {bad}; manifest paths must stay inside the mix "
                            f"root (relative, '/'-separated, no '..')")
    return rel


def resolve(mix_url: str, rel_path: str) -> str:
    """The URL (or local path) of ``rel_path`` inside the mix at ``mix_url``, confined: on a
    local mix no folder below its root may be a link (``safeio.refuse_linked_dirs``: a
    ``shards -> /home/auditor`` link would send reads onto the auditor's machine; the last
    component is refused by the readers' ``O_NOFOLLOW``)."""
    url = join(mix_url, check_path(rel_path))
    # a local mix, named as a path or a file:// URL (whose readers open the same files)
    root = mix_url[len("file://"):] if mix_url.startswith("file://") else mix_url
    if "/" in rel_path and "://" not in root:
        refuse_linked_dirs(root, join(root, rel_path), "mix file", ManifestError)
    return url


def mix_root(mix_url: str) -> str:
    """Accept the mix directory or its manifest.json."""
    url = str(mix_url).rstrip("/")
    return url[: -len(MANIFEST) - 1] if url.endswith("/" + MANIFEST) else url


__all__ = ["CONFINED", "MANIFEST", "check_path", "mix_root", "resolve"]
