"""Open-1B training on the reproducible runtime and the invariant stream.

``open1b_train.train.train`` trains a ``TrainConfig`` (``open1b_train.config``: presets
open1b, demo, micro) on a built mix: the model of ``model.py`` (only ``kernels`` ops, an
explicit backward), one optimizer step = Algorithm 1 over the logical mesh + the recipe
(``step.py``, ``reduction/``), per-step component digests chained into a run hash
(``statehash.py``, ``runlog.py``), atomic verified checkpoints (``checkpoint.py``). The
command is ``open1b-train`` (``cli.py``).
"""

__version__ = "0.1.0"
