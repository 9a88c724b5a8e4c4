"""``keygen`` writes a private key: as the README showed it (``keygen me.pem`` at the
repository's root) the key landed in the work tree, not ignored by git, one ``git add -A``
from being published. Keys are ignored by the repository now, and keygen warns whenever it
writes one inside a git work tree."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from open1b_audit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_keygen_warns_inside_a_git_work_tree(tmp_path):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    r = CliRunner().invoke(main, ["keygen", str(tmp_path / "repo" / "keys" / "me.pem")])
    assert r.exit_code == 0 and "private key inside the git work tree" in r.stderr
    assert (tmp_path / "repo" / "keys" / "me.pem").stat().st_mode & 0o077 == 0
    r = CliRunner().invoke(main, ["keygen", str(tmp_path / "outside" / "me.pem")])
    assert r.exit_code == 0 and r.stderr == ""


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="not a git checkout")
def test_the_repository_ignores_keys():
    for name in ("me.pem", "me.pem.pub", "keys/auditor.pem"):
        assert subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT).returncode == 0
