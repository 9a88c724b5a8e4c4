"""Every command and option of open1b-train, open1b-audit and open1b-eval is documented
(docs/CLI.md, docs/TRAINING.md, docs/AUDIT.md, docs/EVAL.md)."""
from __future__ import annotations

from pathlib import Path

import click
import pytest

from open1b_audit.cli import main as audit_main
from open1b_eval.cli import main as eval_main
from open1b_train.cli import main as train_main

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("group,prog", [(train_main, "open1b-train"), (audit_main, "open1b-audit"),
                                        (eval_main, "open1b-eval")])
def test_every_command_and_option_documented(group: click.Group, prog: str):
    text = "".join((DOCS / n).read_text() for n in ("CLI.md", "TRAINING.md", "AUDIT.md", "EVAL.md"))
    for name, cmd in group.commands.items():
        assert f"{prog} {name}" in text, f"{prog} {name} is not documented"
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--") and opt not in ("--help",):
                    assert opt in text, f"{prog} {name} {opt} is not documented"
