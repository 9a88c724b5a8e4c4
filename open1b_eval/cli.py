"""``open1b-eval`` (perplexity, suite, generate, export) and the ``generate`` / ``export``
commands of ``open1b-train``: thin click commands over ``open1b_eval``. Errors exit with
status 1 and one line naming the bad value; never a traceback."""
from __future__ import annotations

import json
import os
import sys

import click

from open1b.cli import Cli, fail
from open1b_eval import __version__
from open1b_eval.errors import EvalError


_fail = fail


def _force(backend: str):
    from open1b_kernels.core import backend as kb

    return kb.force(None if backend == "auto" else backend)   # auto: by device


def _load(run: str, step: int | None, expect: str | None):
    from open1b_eval.trained import load
    from open1b_data.errors import Open1bDataError

    try:
        t = load(run, step, expect=expect)
    except (EvalError, Open1bDataError) as e:
        _fail(e)
    _notes(t.notes)
    return t


def _notes(notes: list[str]) -> None:
    for n in notes:                     # on stderr: --json output stays one object
        click.echo(f"note: {n}", err=True)


def _hash_param(ctx, param, value):
    from open1b_train.chain import is_hash

    if value is not None and not is_hash(value.lower()):
        raise click.BadParameter(f"{value!r} is not a run hash (64 hex digits)")
    return None if value is None else value.lower()


_EXPECT = click.option(
    "--expect-run-hash", "expect", default=None, metavar="H", callback=_hash_param,
    help="The run hash its owner published: refuse a run whose log does not end in it "
         "(without it, the weights are checked against the run's own log only).")


_BACKEND = click.option("--backend", type=click.Choice(["auto", "cpu", "triton"]),
                        default="auto", show_default=True,
                        help="Kernels: auto (Triton on CUDA), cpu (reference), triton (CUDA "
                             "or TRITON_INTERPRET=1). The tokens are the same.")
_STEP = click.option("--step", type=click.IntRange(min=0), default=None,
                     help="Checkpoint step (default: the latest).")


@click.command("generate")
@click.argument("run", type=click.Path(file_okay=False))
@_STEP
@click.option("--prompt", "prompts", multiple=True, required=True,
              help="Prompt text; repeat for a batch (the tokens do not depend on it).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="New tokens per prompt (fewer if the separator is generated).")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy; > 0 samples by the rule of docs/EVAL.md.")
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True,
              help="Sampling seed: Philox word at (seed, position).")
@_BACKEND
@_EXPECT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def generate_cmd(run, step, prompts, max_tokens, temperature, seed, backend, expect,
                 as_json) -> None:
    """Continue each PROMPT with the checkpoint's model, KV-cached on the reproducible
    runtime: the same checkpoint, prompt and seed give the same tokens everywhere."""
    from open1b_eval.decoder import Decoder
    from open1b_eval.generate import generate

    t = _load(run, step, expect)
    ids = [t.encode_prompt(p) for p in prompts]
    with _force(backend):
        gens = generate(Decoder(t.cfg, t.params), ids, max_tokens, temperature, seed,
                        stop_id=t.eot)
    out = [{"prompt": p, "prompt_ids": i, "ids": g,
            "text": t.decode([x for x in g if x != t.eot])} for p, i, g in zip(prompts, ids, gens)]
    if as_json:
        click.echo(json.dumps({"run": run, "step": t.step, "run_hash": t.run_hash,
                               "step_hash": t.step_hash, "run_hash_pinned": expect is not None,
                               "temperature": temperature, "seed": seed, "outputs": out},
                              indent=1))
        return
    for o in out:
        click.echo(o["prompt"] + o["text"])
        click.echo("-" * 40)


@click.command("export")
@click.argument("run", type=click.Path(file_okay=False))
@_STEP
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory for config.json, model.safetensors, the tokenizer and "
                   "open1b_provenance.json (replaced once the new one is complete).")
@_EXPECT
def export_cmd(run, step, out, expect) -> None:
    """Write a checked checkpoint as a transformers model directory with its provenance
    (model_type open1b; load it after `import open1b_eval.hf`; check it with `open1b-audit
    verify-model`)."""
    from open1b_eval.export import export

    t = _load(run, step, expect)
    try:
        export(t, out)
    except OSError as e:
        _fail(EvalError(f"{out}: cannot write the export ({e})"))
    click.echo(f"wrote {out} (step {t.step} of run {t.run_hash[:16]}..."
               + (", the published run hash" if expect else ", run hash not pinned") + ")")
    click.echo(f"load it with `import open1b_eval.hf` then AutoModelForCausalLM."
               f"from_pretrained({out!r}); check it with `open1b-audit verify-model {out} "
               f"--run {run} --expect-run-hash {t.run_hash}`")


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-eval")
def main() -> None:
    """Evaluate a trained run: perplexity per source, lm-eval task suites over checkpoints,
    reproducible generation and export to transformers (docs/EVAL.md)."""


@main.command("perplexity")
@click.argument("run", type=click.Path(file_okay=False))
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@_STEP
@click.option("--all-steps", is_flag=True,
              help="Every checkpoint of RUN; writes a PNG of validation loss vs step.")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="Context tokens per prediction window (default: the mix's training window).")
@click.option("--png", default=None, help="PNG for --all-steps (default: RUN/validation.png).")
@click.option("--heldout-windows", type=click.IntRange(min=0), default=8, show_default=True,
              help="Held-out windows per source scored when the run's mix has held-out data "
                   "(the documents it never trains on); 0 = skip them.")
@_BACKEND
@_EXPECT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def perplexity_cmd(run, files, step, all_steps, window, png, heldout_windows, backend, expect,
                   as_json) -> None:
    """Loss (nats/token) and perplexity per source of the text FILES (one source each),
    and of the mix's held-out data when it has some (then FILES may be omitted)."""
    from open1b_eval import perplexity as pp
    from open1b_eval.trained import open_run
    from open1b_train.checkpoint import list_steps

    try:
        sources = pp.read_sources(list(files), allow_none=bool(heldout_windows)
                                  and not all_steps)
        with _force(backend):
            if not all_steps:
                t = _load(run, step, expect)
                if not sources and not pp.has_heldout(t):
                    pp.read_sources([])          # raises: no files and nothing held out
                reps = [pp.perplexity(t, sources, window, heldout_windows)]
            else:
                png = png or os.path.join(run, "validation.png")
                pub = open_run(run, expect=expect)
                _notes(pub.notes)
                reps = pp.over_steps(pub, sources, list_steps(run), window, png)
    except EvalError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(reps if all_steps else reps[0], indent=1))
        return
    for r in reps:
        click.echo(f"step {r['step']} (window {r['window']}):")
        rows = [*r["sources"].items(), ("all", r["all"])] if r["sources"] else []
        if "heldout" in r:
            h = r["heldout"]
            rows += [(f"held-out {k}", v) for k, v in h["sources"].items()]
            rows.append(("held-out all", h["all"]))
        for name, s in rows:
            click.echo(f"  {name:<32} {s['tokens']:>9,} tokens  loss {s['loss']:.4f}  "
                       f"ppl {s['perplexity']:.2f}")
    if all_steps:
        click.echo(f"wrote {png}")


@main.command("suite")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--tasks", required=True,
              help="Comma-separated lm-eval task names (OLMES short names map: arc_easy, "
                   "arc_challenge, boolq, csqa, hellaswag, mmlu, openbookqa, piqa, "
                   "socialiqa, winogrande).")
@click.option("--steps", default=None,
              help="Comma-separated checkpoint steps (default: every checkpoint).")
@click.option("--include-path", default=None, type=click.Path(file_okay=False),
              help="A directory of local task YAMLs (lm-eval's --include_path).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most this many documents per task.")
@click.option("--out", default=None, help="Directory for suite.md, suite.json, suite.png "
              "(default: RUN/suite).")
@_BACKEND
@_EXPECT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def suite_cmd(run, tasks, steps, include_path, limit, out, backend, expect, as_json) -> None:
    """Run lm-eval TASKS on several checkpoints: a table and a PNG of score vs tokens."""
    from open1b_eval.suite import run_suite
    from open1b_train.checkpoint import list_steps

    try:
        step_list = [int(s) for s in steps.split(",")] if steps else list_steps(run)
    except ValueError:
        raise click.BadParameter(f"expected steps like 20,40, got {steps!r}") from None
    try:
        rep = run_suite(run, step_list, [t for t in tasks.split(",") if t], include_path,
                        limit, backend, out or os.path.join(run, "suite"), expect)
    except EvalError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
        return
    click.echo(rep["table"])
    click.echo(f"wrote {rep['png']}")


main.add_command(generate_cmd)
main.add_command(export_cmd)

if __name__ == "__main__":  # python -m open1b_eval.cli
    sys.exit(main())
