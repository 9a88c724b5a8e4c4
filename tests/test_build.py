"""The build files keep up with the C: setup.py builds every C file of the packages (each
``_*.c`` a source of an extension, each ``_*.h`` a dependency), an sdist holds them all
(setup.py's sources and dependencies, MANIFEST.in), and ``make setup`` / ``make test``
rebuild after an edit to any of them (the Makefile's SOURCES). Each check is also run on
forged build files that lag the C - a header no extension lists and MANIFEST.in does not
name, the Makefile's old SOURCES - and must name what they lack.

An extension is optional (setup.py), so a source missing from an sdist does not fail the
install: the extension is silently absent and the torch code runs. Only a check like this
one sees it."""
from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "__pycache__", "*.so",
                              "*.egg-info", ".pytest_cache", ".ruff_cache", "benchmarks")
# what the build files said before the kernels' C was cut by op (the forgeries)
OLD_MANIFEST_LINE = ("include open1b_data/ingest/tokenizer/_bpe.c "
                     "open1b_data/ingest/tokenizer/_bpe_*.h open1b_kernels/core/_mathfn.h "
                     "open1b_kernels/core/_pieces.h open1b_kernels/attention/_tilemm.h\n")
OLD_SOURCES = ("SOURCES := pyproject.toml setup.py $(wildcard open1b_data/ingest/tokenizer/_bpe*.[ch]) "
               "$(wildcard open1b_kernels/core/_*.[ch]) $(wildcard open1b_kernels/attention/_*.[ch])")


def _extension_files(root: Path, monkeypatch) -> set[str]:
    """Every source and dependency of the extensions setup.py declares in ``root``."""
    got: dict = {}
    monkeypatch.chdir(root)                     # setup.py globs the sources relative to it
    monkeypatch.setattr(setuptools, "setup", lambda **kw: got.update(kw))
    runpy.run_path(str(root / "setup.py"))
    files = {f for ext in got["ext_modules"] for f in (*ext.sources, *ext.depends)}
    assert files, "setup.py declares no extension"
    return files


def _c_files(root: Path) -> set[str]:
    """Every C source and header of the packages' extensions (``_*.c``, ``_*.h``)."""
    return {p.relative_to(root).as_posix() for pkg in ("open1b_kernels", "open1b_data")
            for p in (root / pkg).rglob("_*.[ch]")}


def _sdist_missing(root: Path, out: Path, monkeypatch) -> set[str]:
    """The C files of the packages and the extensions' files that an sdist of ``root``
    lacks."""
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(out)], cwd=root,
                   check=True, capture_output=True, timeout=300)
    (tar,) = out.glob("*.tar.gz")
    with tarfile.open(tar) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    return (_c_files(root) | _extension_files(root, monkeypatch)) - names


def _make_missing(root: Path) -> set[str]:
    """The C files the Makefile's SOURCES (what ``make`` rebuilds after) leaves out."""
    out = subprocess.run(["make", "--no-print-directory", "--eval",
                          "print-sources: ; @echo $(SOURCES)", "print-sources"], cwd=root,
                         check=True, capture_output=True, text=True, timeout=60)
    return _c_files(root) - set(out.stdout.split())


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the repository to build from (an sdist writes its egg-info beside setup.py)."""
    dst = tmp_path / "src"
    shutil.copytree(ROOT, dst, ignore=SKIP)
    return dst


def test_setup_builds_every_c_file_of_the_packages(tree, monkeypatch):
    # a _*.c beside an op that no extension compiles would be dead code, a header no
    # extension depends on would not trigger a rebuild; a folder setup.py does not know of
    # is caught
    assert _c_files(ROOT) <= _extension_files(ROOT, monkeypatch)
    (tree / "open1b_kernels" / "newop").mkdir()
    (tree / "open1b_kernels" / "newop" / "_loop.c").write_text("int loop(void);\n")
    assert _c_files(tree) - _extension_files(tree, monkeypatch) == {
        "open1b_kernels/newop/_loop.c"}


def test_an_sdist_holds_every_extensions_sources_and_headers(tree, tmp_path, monkeypatch):
    assert _sdist_missing(tree, tmp_path / "dist", monkeypatch) == set()


def test_an_sdist_of_build_files_that_lag_the_c_is_caught(tree, tmp_path, monkeypatch):
    # setup.py listing the headers it knew of, MANIFEST.in naming them: a header added
    # since is in neither, and an sdist built there lacks it
    setup_py = tree / "setup.py"
    text = setup_py.read_text()
    assert "depends=sorted(set(HEADERS + own))" in text
    setup_py.write_text(text.replace("depends=sorted(set(HEADERS + own))",
                                     'depends=["open1b_kernels/core/_pieces.h"]'))
    manifest = tree / "MANIFEST.in"
    kept = [line for line in manifest.read_text().splitlines(keepends=True)
            if "open1b_kernels" not in line and "_bpe" not in line]
    manifest.write_text(OLD_MANIFEST_LINE + "".join(kept))
    missing = _sdist_missing(tree, tmp_path / "dist", monkeypatch)
    assert "open1b_kernels/core/_ext.h" in missing and "open1b_kernels/int8/_hadamard.h" in missing


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_makefile_rebuilds_after_an_edit_to_any_c_file(tree):
    assert _make_missing(ROOT) == set()
    makefile = tree / "Makefile"
    lines = makefile.read_text().splitlines(keepends=True)
    makefile.write_text("".join(OLD_SOURCES + "\n" if line.startswith("SOURCES :=") else line
                                for line in lines))
    missing = _make_missing(tree)
    assert "open1b_kernels/int8/_pairmm.c" in missing and "open1b_kernels/ops/_rmsnorm.c" in missing
