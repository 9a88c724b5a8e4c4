"""The startup hook that makes lm-eval's own command line know ``open1b``
(open1b_eval/lmeval_hook.py): the build writes its .pth at the wheel root, its line never
breaks startup, importing it imports nothing heavy, it does nothing without lm-eval, and
with lm-eval it registers the model once, lazily, next to lm-eval's own models. Each check
runs in a fresh interpreter (a subprocess): the hook acts at startup and on first import."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testkit.runs import cli_env

ROOT = Path(__file__).resolve().parents[2]
PTH = "open1b_lmeval.pth"


def python(code: str, *flags: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter of this environment (``flags`` first, e.g. ``-S``:
    no ``site``, so no site-packages and no .pth files), the repository importable."""
    return subprocess.run([sys.executable, *flags, "-c", code], env=cli_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_build_writes_a_startup_line_that_never_breaks_startup(tmp_path):
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path),
                        "build_py", "--build-lib", str(tmp_path / "lib")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = (tmp_path / "lib" / PTH).read_text()     # build_lib is the wheel's root
    assert line.startswith("import ") and line.count("\n") == 1   # site exec()s such a line
    run = f"exec({line.strip()!r}); import sys; print('open1b_eval.lmeval_hook' in sys.modules)"
    assert ok(python(run, "-S")) == "True"
    # the package gone (an empty directory as the only path): no error, nothing printed
    gone = python(f"import sys; sys.path[:] = [{str(tmp_path / 'empty')!r}]; " + run, "-S")
    assert (gone.returncode, gone.stdout.strip(), gone.stderr) == (0, "False", "")


def test_importing_the_hook_imports_only_itself():
    new = ok(python("import sys; before = set(sys.modules); import open1b_eval.lmeval_hook; "
                    "print(sorted(set(sys.modules) - before))", "-S"))
    assert new == "['open1b_eval', 'open1b_eval.lmeval_hook']"
    heavy = ok(python("import sys, open1b_eval.lmeval_hook; print(sorted(m for m in sys.modules "
                      "if m.split('.')[0] in ('torch', 'numpy', 'lm_eval', 'open1b_kernels', "
                      "'open1b_train', 'open1b_data') or m == 'open1b_eval.harness'))"))
    assert heavy == "[]"


def test_without_lm_eval_the_hook_is_inert():
    # -S: no site-packages, so no lm-eval; imports behave as without the hook
    out = ok(python(
        "import sys, importlib.util, json, email.parser, importlib.metadata\n"
        "import open1b_eval.lmeval_hook as h\n"
        "assert importlib.util.find_spec('lm_eval') is None\n"
        "[f] = [f for f in sys.meta_path if getattr(f, 'open1b_lmeval_hook', False)]\n"
        "assert f.find_spec('lm_eval.models') is None and f.find_spec('json') is None\n"
        "import fractions, decimal\n"
        "try:\n    import lm_eval\nexcept ModuleNotFoundError as e:\n    print(e.name)\n", "-S"))
    assert out == "lm_eval"


def test_hook_registers_open1b_lazily_once_beside_lm_evals_own_models():
    pytest.importorskip("lm_eval")
    out = ok(python(
        "import sys\n"
        "import open1b_eval.lmeval_hook as h\n"        # also when the .pth is not installed
        "h.install(); h.install()\n"
        "mark = lambda: sum(getattr(f, 'open1b_lmeval_hook', False) for f in sys.meta_path)\n"
        "assert mark() == 1\n"
        "from lm_eval.api import registry\n"
        "assert 'open1b' not in registry.model_registry\n"    # not before lm-eval's own table
        "assert registry.get_model('dummy').__name__ == 'DummyLM'\n"
        "assert 'open1b' in registry.model_registry and mark() == 0\n"   # registered, finder gone
        "assert 'open1b_eval.harness' not in sys.modules\n"           # lazily: nothing imported
        "h.install(); assert mark() == 0 and h.register() is False\n"   # never twice
        "cls = registry.get_model('open1b')\n"
        "print(cls.__module__, cls.__name__, registry.get_model('dummy').__name__)\n"))
    assert out == "open1b_eval.harness Open1bLM DummyLM"


def test_importing_the_harness_first_keeps_lm_evals_models():
    pytest.importorskip("lm_eval")
    # the harness's own registration meets the hook's lazy one (the same target) and must
    # leave lm-eval's models findable: its registry loads them only while it is empty
    out = ok(python("import open1b_eval.lmeval_hook, open1b_eval.harness as m\n"
                    "from lm_eval.api.registry import get_model\n"
                    "print(get_model('open1b') is m.Open1bLM, get_model('dummy').__name__)"))
    assert out == "True DummyLM"
