"""open1b_eval: use a trained Open-1B run - reproducible generation, scoring, export to
Hugging Face transformers (``open1b_eval.hf``), an lm-evaluation-harness model
(``open1b_eval.harness``) and the ``open1b-eval`` command (docs/EVAL.md)."""

__version__ = "0.1.0"
