"""``open1b-eval suite``: lm-eval tasks over several checkpoints - a table and a PNG of
score against training tokens.

Each (step, task) runs ``lm_eval.simple_evaluate`` with the ``open1b`` model
(``open1b_eval.harness``) and reports the task's main metric: ``acc_norm`` if the task has
it, else ``acc``, else ``exact_match``. ``--include-path`` adds local task YAMLs (and their
data); names in ``OLMES`` map the OLMES evaluation set to lm-eval's task names, which need
their datasets in the local Hugging Face cache (``HF_DATASETS_OFFLINE=1`` is respected).
"""
from __future__ import annotations

import json
import os

from open1b_eval.errors import EvalError

# the OLMES suite (Gu et al. 2024) as lm-eval task names
OLMES = {"arc_challenge": "arc_challenge", "arc_easy": "arc_easy", "boolq": "boolq",
         "csqa": "commonsense_qa", "hellaswag": "hellaswag", "mmlu": "mmlu",
         "openbookqa": "openbookqa", "piqa": "piqa", "socialiqa": "social_iqa",
         "winogrande": "winogrande"}
METRICS = ("acc_norm,none", "acc,none", "exact_match,none")


def tokens_at(run: str, step: int) -> int | None:
    """Training tokens consumed up to ``step`` (steps.jsonl's scalars; None if absent)."""
    try:
        with open(os.path.join(run, "steps.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("step") == step:
                    return int(rec.get("scalars", {}).get("tokens"))
    except (OSError, ValueError, TypeError):
        return None
    return 0 if step == 0 else None


def main_metric(res: dict) -> tuple[str, float]:
    for m in METRICS:
        if m in res:
            return m.split(",")[0], float(res[m])
    raise EvalError(f"task result has none of {METRICS}: {sorted(res)}")


def run_suite(run: str, steps: list[int], tasks: list[str], include_path: str | None = None,
              limit: int | None = None, backend: str = "auto", out: str | None = None,
              expect: str | None = None) -> dict:
    """{"rows": [{"step", "tokens", "task", "metric", "score"}], "table", "png"}."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import open1b_eval.harness  # noqa: F401  (registers the model)

    names = [OLMES.get(t, t) for t in tasks]
    tm = TaskManager(include_path=include_path) if include_path else TaskManager()
    rows = []
    for step in steps:
        res = lm_eval.simple_evaluate(model="open1b",
                                      model_args=f"run={run},step={step},backend={backend}"
                                      + (f",expect_run_hash={expect}" if expect else ""),
                                      tasks=names, task_manager=tm, limit=limit)["results"]
        for t in names:
            metric, score = main_metric(res[t])
            rows.append({"step": step, "tokens": tokens_at(run, step), "task": t,
                         "metric": metric, "score": score})
    table = ["| step | tokens | task | metric | score |", "|---|---|---|---|---|"]
    table += [f"| {r['step']} | {r['tokens']} | {r['task']} | {r['metric']} | {r['score']:.4f} |"
              for r in rows]
    rep = {"run": run, "rows": rows, "table": "\n".join(table), "png": None}
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "suite.md"), "w") as f:
            f.write(rep["table"] + "\n")
        with open(os.path.join(out, "suite.json"), "w") as f:
            json.dump(rows, f, indent=1)
        rep["png"] = _plot(rows, names, os.path.join(out, "suite.png"))
    return rep


def _plot(rows: list[dict], names: list[str], png: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in names:
        pts = [(r["tokens"] if r["tokens"] is not None else r["step"], r["score"])
               for r in rows if r["task"] == t]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("score (acc_norm / acc / exact match)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
