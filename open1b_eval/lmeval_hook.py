"""Makes lm-eval's own ``lm_eval`` command (and ``lm_eval.simple_evaluate``) know the
``open1b`` model without any import of ours first.

lm-eval (0.4.x) finds models only in its registry (``lm_eval.api.registry.model_registry``)
and reads no entry points for them. It fills the registry, the first time a model is
looked up, by importing ``lm_eval.models``, whose table registers each of its own models
as a lazy ``"module:Class"`` target. The package installs a startup file
(``open1b_lmeval.pth``, written by setup.py at the root of site-packages; Python's ``site``
runs its one ``import`` line at interpreter startup) that imports this module, which puts
one finder first on ``sys.meta_path``:

* it answers no import itself: for every name but ``lm_eval.models`` it returns None at
  the cost of one string comparison;
* for ``lm_eval.models`` it lets the other finders find the module, and wraps that
  module's loader so that, once the module has run, ``open1b`` joins lm-eval's own
  models the same way - the lazy target ``open1b_eval.harness:Open1bLM``, imported only
  when a run asks for ``--model open1b`` - unless the name is already registered; then
  the finder takes itself off ``sys.meta_path``.

Importing this module imports nothing but ``sys`` (not torch, numpy, lm_eval or the
harness), installs the finder at most once per interpreter, and never raises: a failure
leaves lm-eval exactly as it would be without the package. Without lm-eval installed
nothing ever imports ``lm_eval.models`` and the finder only ever returns None.
"""
import sys  # the only import (no ``from __future__``: it too is a module import at startup)

MODEL = "open1b"
TARGET = "open1b_eval.harness:Open1bLM"
TABLE = "lm_eval.models"        # lm-eval's module that registers its own models


def register() -> bool:
    """Register ``open1b`` as a lazy target in lm-eval's model registry unless a model of
    that name is already there; True when this call registered it."""
    from lm_eval.api.registry import model_registry

    if MODEL in model_registry:
        return False
    model_registry.register(MODEL, target=TARGET)
    return True


class RegisterOpen1b:
    """The ``sys.meta_path`` finder of the module docstring."""

    open1b_lmeval_hook = True       # marks the finder, so that it is installed once

    def find_spec(self, name, path=None, target=None):
        if name != TABLE:
            return None
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            run = getattr(loader, "exec_module", None)
            if run is None:
                return None

            def exec_module(module, _run=run):
                _run(module)            # lm-eval's own models first; its errors are its own
                self.done()

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None

    def done(self) -> None:
        try:
            register()
        except Exception:
            pass
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once); register at once if lm-eval's model
    table is already imported."""
    if any(getattr(f, "open1b_lmeval_hook", False) for f in sys.meta_path):
        return
    finder = RegisterOpen1b()
    if TABLE in sys.modules:
        finder.done()
    else:
        sys.meta_path.insert(0, finder)


try:
    install()
except Exception:
    pass
