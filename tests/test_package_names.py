"""This project's runtime lives in ``open1b_kernels``, not in a top-level ``kernels``: that
is the import name of Hugging Face's ``kernels`` distribution, which transformers 5.25
requires, and two top-level packages of one name shadow each other. An environment that
has a ``kernels`` package first on its path must still run the runtime and the trainer."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_top_level_package_is_named_kernels():
    assert not (ROOT / "kernels").exists()
    spec = importlib.util.find_spec("open1b_kernels")
    assert spec is not None and Path(spec.origin).parent == ROOT / "open1b_kernels"


def test_a_foreign_kernels_package_first_on_the_path_shadows_nothing(tmp_path):
    # a stand-in for Hugging Face's distribution, ahead of everything on sys.path
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("MARK = 'foreign'\n")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import kernels, open1b_kernels.core.mathc, open1b_train.model\n"
            "from open1b_kernels.ops.lmhead import lmhead_forward\n"
            "print(kernels.MARK)\n" % str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "foreign"


def test_the_real_hugging_face_kernels_imports_beside_the_runtime():
    # where transformers' dependency is installed (transformers >= 5.25): both import
    if importlib.util.find_spec("kernels") is None:
        pytest.skip("Hugging Face's kernels distribution is not installed")
    code = ("import kernels, open1b_kernels.core.mathc; from pathlib import Path\n"
            "print(Path(kernels.__file__).resolve().parent.parent == Path(%r))\n" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
