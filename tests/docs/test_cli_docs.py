"""docs/CLI.md's examples are real: every ```console block marked ``<!-- cli -->`` starts
with ``$ open1b-data ARGS``; this test runs ARGS through the ``open1b-data`` click group,
in order, in a fresh directory (the first example builds the demo mix into
``build/demo-mix`` there, as a reader would), and compares what follows with the output.

The rules (also stated at the top of docs/CLI.md):

* the block shows standard output; a marker ``<!-- cli: exit N -->`` expects exit status N
  and shows standard error instead (errors go there);
* ``<!-- cli: first N lines -->`` shows only the first N lines, followed by a line
  ``[... M more lines]`` whose M is checked too;
* trailing spaces are ignored; everything else must match exactly.

After an intended change of an output (a new fingerprint, a new field), rewrite the blocks
with ``OPEN1B_UPDATE_DOCS=1 .venv/bin/python -m pytest tests/docs`` and review the diff.
Slow (~10-20 s: one demo build and ~20 commands), hence the marker; every command and
option of the group must also be documented (``test_every_command_and_option_documented``).
"""
from __future__ import annotations

import difflib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from open1b_data.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"
BLOCK = re.compile(r"<!-- cli(?::\s*(?P<opts>[^>]*?))?\s*-->\n```console\n(?P<body>.*?)```",
                   re.S)
MORE = re.compile(r"\[\.\.\. (\d+) more lines\]")
PROMPT = "$ open1b-data "
UPDATE = os.environ.get("OPEN1B_UPDATE_DOCS") == "1"


@dataclass(frozen=True)
class Example:
    """One console block: where its body is in the document, and what it claims."""

    start: int
    end: int
    args: tuple[str, ...]
    body: str
    exit_code: int
    first: int | None            # only the first N lines are shown


def examples(text: str) -> list[Example]:
    out = []
    for m in BLOCK.finditer(text):
        opts = (m.group("opts") or "").strip()
        exit_code, first = 0, None
        for opt in filter(None, (o.strip() for o in opts.split(","))):
            if (e := re.fullmatch(r"exit (\d+)", opt)) is not None:
                exit_code = int(e.group(1))
            elif (f := re.fullmatch(r"first (\d+) lines", opt)) is not None:
                first = int(f.group(1))
            else:
                raise AssertionError(f"docs/CLI.md: unknown cli marker option {opt!r}")
        body = m.group("body")
        head = body.split("\n", 1)[0]
        assert head.startswith(PROMPT), (f"docs/CLI.md: a cli block must start with "
                                        f"{PROMPT!r}, got {head!r}")
        out.append(Example(m.start("body"), m.end("body"), tuple(shlex.split(head[2:])[1:]),
                           body, exit_code, first))
    return out


def render(ex: Example, output: str) -> str:
    """The block body the example should have, given the command's real output."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    if ex.first is not None and len(lines) > ex.first:
        lines = lines[:ex.first] + [f"[... {len(lines) - ex.first} more lines]"]
    return "\n".join([PROMPT + shlex.join(ex.args), *lines]) + "\n"


def run(ex: Example) -> str:
    res = CliRunner().invoke(main, list(ex.args), prog_name="open1b-data", terminal_width=80)
    assert res.exit_code == ex.exit_code, (
        f"open1b-data {shlex.join(ex.args)} exited {res.exit_code}, docs/CLI.md says "
        f"{ex.exit_code}:\n{res.output}{res.exception!r}")
    return res.stdout if ex.exit_code == 0 else res.stderr


def normalized(body: str) -> str:
    return "\n".join(ln.rstrip() for ln in body.splitlines()) + "\n"


@pytest.mark.slow
def test_examples_are_the_real_output(tmp_path, monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    exs = examples(text)
    monkeypatch.chdir(tmp_path)
    stale, new_text = [], text
    bodies = [render(ex, run(ex)) for ex in exs]     # in document order: build-mix first
    for ex, want in zip(reversed(exs), reversed(bodies)):   # back to front: offsets hold
        if normalized(ex.body) != want:
            stale.append("".join(difflib.unified_diff(
                normalized(ex.body).splitlines(True), want.splitlines(True),
                "docs/CLI.md", "real output", n=1)))
            new_text = new_text[:ex.start] + want + new_text[ex.end:]
    if stale and UPDATE:
        tmp = DOC.with_suffix(".md.tmp")
        tmp.write_text(new_text, encoding="utf-8")
        os.replace(tmp, DOC)                  # atomic: a reader never sees half a file
        return
    assert not stale, ("docs/CLI.md examples differ from the real output (rewrite them "
                       "with OPEN1B_UPDATE_DOCS=1 .venv/bin/python -m pytest tests/docs):\n"
                       + "\n".join(reversed(stale)))


def sections(text: str) -> dict[str, str]:
    """``## `command ...` `` heading -> the section's text."""
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {m.group(1): p for p in parts if (m := re.match(r"`([\w-]+)", p))}


def test_every_command_and_option_documented():
    text = DOC.read_text(encoding="utf-8")
    secs = sections(text)
    run_cmds = {ex.args[0] for ex in examples(text) if ex.args}
    for name, cmd in main.commands.items():
        assert name in secs, f"docs/CLI.md has no '## `{name} ...`' section"
        assert name in run_cmds, f"docs/CLI.md has no example that runs {name}"
        for p in cmd.params:
            for opt in p.opts:
                if opt.startswith("--"):
                    assert opt in secs[name], f"docs/CLI.md: {name} does not document {opt}"


def test_every_audit_command_and_option_listed():
    """open1b-audit's commands are summed up in docs/CLI.md's table, one row each."""
    from open1b_audit.cli import main as audit

    rows = {m.group(1): m.group(0) for m in
            re.finditer(r"^\| `open1b-audit ([\w-]+)(?:[^|\\]|\\.)*", DOC.read_text(encoding="utf-8"), re.M)}
    for name, cmd in audit.commands.items():
        assert name in rows, f"docs/CLI.md's table has no row for open1b-audit {name}"
        for p in cmd.params:
            for opt in p.opts:
                if opt.startswith("--"):
                    assert opt in rows[name], f"docs/CLI.md: open1b-audit {name} lacks {opt}"


def test_marker_rules():
    text = ("<!-- cli: exit 1, first 2 lines -->\n```console\n$ open1b-data stream-at "
            "'a b' --step 1\nx\ny\n[... 3 more lines]\n```\n")
    (ex,) = examples(text)
    assert ex.args == ("stream-at", "a b", "--step", "1") and ex.exit_code == 1
    assert render(ex, "x  \ny\nz\nu\nv\n") == normalized(ex.body)
    assert render(ex, "x\ny\nz\n") != normalized(ex.body)      # the count is checked
    with pytest.raises(AssertionError, match="unknown cli marker option"):
        examples(text.replace("exit 1", "exit one"))
