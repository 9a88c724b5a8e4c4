"""``open1b-train``: the thin click layer over ``open1b_train``.

With no arguments it trains the ``demo`` preset on ``build/demo-mix`` (what ``make demo``
builds) into ``build/demo-run``, resuming if that run exists. Commands: ``run``,
``resume``, ``show``, ``plot``, and ``generate``, ``export`` (from ``open1b_eval``, through
the ``open1b_train.commands`` entry points). Errors exit with status 1 and one line naming the bad value
and what to do; never a traceback.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import click

from open1b.cli import ERRORS, Cli, fail
from open1b_train import __version__

DEMO_MIX = os.path.join("build", "demo-mix")
DEMO_RUN = os.path.join("build", "demo-run")



def _mesh(ctx, param, text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        r, s = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"expected RxS (dp_replicate x dp_shard), e.g. 2x2; got "
                                 f"{text!r}") from None
    if r < 1 or s < 1:
        raise click.BadParameter(f"both sides of --mesh must be >= 1, got {text!r}")
    return r, s


def _step_set(text: str | None) -> frozenset[int]:
    """"5,7,10:12" -> {5, 7, 10, 11, 12}."""
    if not text:
        return frozenset()
    out = set()
    try:
        for part in text.split(","):
            a, _, b = part.partition(":")
            lo, hi = int(a), int(b or a)
            if not 1 <= lo <= hi:
                raise ValueError
            out.update(range(lo, hi + 1))
    except ValueError:
        raise click.BadParameter(f"expected steps like 5,7 or 10:12 (from 1), got {text!r}"
                                 ) from None
    return frozenset(out)


MEMORY_PLAN_HELP = ("How a step holds its state (never what it computes: the bits are the "
                    "same): resident (all in memory), lean (Adam moments in files under "
                    "RUN/memplan streamed in chunks, gradients straight into the reduced "
                    "buffer, activations recomputed except for as many layers as MemAvailable "
                    "holds, the LM head in token blocks, TreeFold partials spilled), lean:N "
                    "(lean keeping exactly N layers' activations; lean:0 recomputes all), "
                    "auto (lean when the resident plan's estimated peak exceeds "
                    "MemAvailable). One process only.")


def check_memory_plan(ctx, param, value: str) -> str:
    """click callback: ``value`` is auto, resident, lean or lean:N (``memplan.parse``)."""
    from open1b_train.errors import MemoryPlanError
    from open1b_train.memory.memplan import parse

    try:
        parse(value)
    except MemoryPlanError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _train(cfg, mix: str, out: str, quiet: bool, nproc: int = 1,
           trace_steps: frozenset[int] = frozenset(), memory_plan: str = "auto") -> None:
    from open1b_train.distributed import launch
    from open1b_train.train import train

    if not os.path.exists(os.path.join(mix, "manifest.json")) and "://" not in mix:
        raise click.ClickException(
            f"{mix!r} is not a built mix (no manifest.json); build one with `open1b-data "
            f"build-mix --out {mix}` (the demo: `make demo`)")
    if trace_steps and (nproc > 1 or launch.is_worker()):
        raise click.ClickException("--trace-steps runs on one process (a trace has the same "
                                   "bits on any number): drop --nproc or trace afterwards with "
                                   "`open1b-audit trace RUN --step N`")
    if memory_plan.startswith("lean") and (nproc > 1 or launch.is_worker()):
        raise click.ClickException("--memory-plan lean runs on one process: drop --nproc (the "
                                   "distributed engine holds its shards resident)")
    if nproc > 1 and not launch.is_worker():
        V = cfg.mesh[0] * cfg.mesh[1]
        if V % nproc:
            raise click.ClickException(
                f"--nproc {nproc} does not divide the mesh's {V} virtual ranks "
                f"({cfg.mesh[0]}x{cfg.mesh[1]}); use one of "
                f"{[p for p in range(1, V + 1) if V % p == 0]}")
        argv = [a for a in _argv_without_nproc(sys.argv[1:])]
        code, msg = launch.launch(nproc, argv)
        if code:
            raise click.ClickException(msg)
        return
    if launch.is_worker():
        _worker(cfg, mix, out, quiet)
        return
    click.echo(f"open1b-train: preset {cfg.preset!r}, mesh {cfg.mesh[0]}x{cfg.mesh[1]}, "
               f"mix {mix} -> {out}", err=True)
    try:
        s = train(cfg, mix, out, progress=None if not quiet else False,
                  echo=lambda m: click.echo(m, err=True), trace_steps=trace_steps,
                  memory_plan=memory_plan)
    except ERRORS as e:
        fail(e)
    if s.tokens:
        click.echo(f"trained steps {s.first_step}..{s.last_step}: {s.tokens:,} tokens in "
                   f"{s.seconds:.1f} s ({s.tokens / max(s.seconds, 1e-9):,.0f} tokens/s), "
                   f"final loss {s.loss:.4f}, {s.skipped_steps} skipped")
    click.echo(f"run hash (step {s.last_step}): {s.run_hash}")


@click.group(cls=Cli, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-train")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Train Open-1B on the reproducible runtime; every step hashed, bit-exact resume.

    Without a command: train the demo preset on build/demo-mix into build/demo-run."""
    if ctx.invoked_subcommand is None:
        from open1b_train.config import preset

        _train(preset("demo"), DEMO_MIX, DEMO_RUN, quiet=False)


def _argv_without_nproc(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def _worker(cfg, mix: str, out: str, quiet: bool) -> None:
    """One process of a torch.distributed run (started by --nproc or by torchrun)."""
    import torch.distributed as dist

    from open1b_train.distributed import launch
    from open1b_train.distributed.engine import train_distributed

    launch.init_worker()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        s = train_distributed(cfg, mix, out, progress=None if not quiet else False,
                              echo=lambda m: click.echo(m, err=True))
    except ERRORS as e:
        raise click.ClickException(f"rank {rank}: {e}") from None
    except RuntimeError as e:          # a collective failed: a peer died or timed out
        raise click.ClickException(f"rank {rank}: a collective failed ({str(e).splitlines()[0]}); "
                                   f"a peer process died or timed out") from None
    finally:
        dist.destroy_process_group()
    if rank == 0:
        if s.tokens:
            click.echo(f"trained steps {s.first_step}..{s.last_step} on "
                       f"{world} processes: "
                       f"{s.tokens:,} tokens in {s.seconds:.1f} s, final loss {s.loss:.4f}")
        click.echo(f"run hash (step {s.last_step}): {s.run_hash}")


@main.command("run")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="A TOML config: preset = \"...\" plus overridden fields.")
@click.option("--preset", "preset_name", default=None,
              help="open1b, demo or micro (default: demo, or the config file's).")
@click.option("--mix", default=DEMO_MIX, show_default=True, help="A built mix (directory/URL).")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Stop after this step (default: the schedule's last).")
@click.option("--mesh", default=None, callback=_mesh, help="Logical mesh RxS = dp_replicate x dp_shard "
              "(default 1x1); fixes the reduction tree, so it is part of the run's identity.")
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None,
              help="Run seed for init and data order (default: the mix's seed).")
@click.option("--backend", type=click.Choice(["auto", "cpu", "triton"]), default=None,
              help="Kernels: auto (Triton on CUDA), cpu (reference), triton (CUDA or "
                   "TRITON_INTERPRET=1). The bits are the same.")
@click.option("--out", default=DEMO_RUN, show_default=True, help="Run directory.")
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Local worker processes (torch.distributed, gloo on CPU / NCCL on GPU); "
                   "must divide the mesh's virtual ranks. The bits do not depend on it.")
@click.option("--trace-steps", default=None, callback=lambda c, p, v: _step_set(v),
              help="Steps (e.g. 5,7 or 10:12) whose per-op digest trace is written to "
                   "RUN/traces/ (for open1b-audit bisect).")
@click.option("--eval-every", type=click.IntRange(min=0), default=None,
              help="Validation loss per source on the mix's held-out windows every N steps, "
                   "hashed into those steps' scalars (val_loss); 0 = off (default). Needs a "
                   "mix with [heldout]; part of the run's identity.")
@click.option("--eval-windows", type=click.IntRange(min=1), default=None,
              help="Held-out windows per source the validation loss covers (default 8).")
@click.option("--memory-plan", default="auto", callback=check_memory_plan, show_default=True,
              metavar="auto|resident|lean|lean:N", help=MEMORY_PLAN_HELP)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run_cmd(config_path, preset_name, mix, steps, mesh, seed, backend, out, nproc,
            trace_steps, eval_every, eval_windows, memory_plan, quiet) -> None:
    """Train (or continue) a run: RUN/steps.jsonl gets one hashed line per step."""
    from open1b_train.config import load_config, preset

    try:
        cfg = load_config(config_path) if config_path else preset(preset_name or "demo")
        if config_path and preset_name:
            raise click.UsageError("give --config or --preset, not both")
        changes = {k: v for k, v in (("steps", steps), ("mesh", mesh), ("seed", seed),
                                     ("backend", backend), ("eval_every", eval_every),
                                     ("eval_windows", eval_windows)) if v is not None}
        cfg = dataclasses.replace(cfg, **changes)
    except ERRORS as e:
        fail(e)
    _train(cfg, mix, out, quiet, nproc, trace_steps, memory_plan)


@main.command("resume")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--mix", default=None, help="The built mix (default: the one the run used).")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Stop after this step (default: the run's own setting).")
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Local worker processes (any divisor of the mesh's virtual ranks).")
@click.option("--memory-plan", default="auto", callback=check_memory_plan, show_default=True,
              metavar="auto|resident|lean|lean:N", help=MEMORY_PLAN_HELP)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def resume_cmd(run, mix, steps, nproc, memory_plan, quiet) -> None:
    """Continue RUN from its latest good checkpoint (same config, mix and seed)."""
    from open1b_train.run import read_run

    try:
        cfg, mix = read_run(run, mix, own=True)        # resuming one's own run
    except ERRORS as e:
        fail(click.ClickException(str(e)))
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps)
    _train(cfg, mix, run, quiet, nproc, memory_plan=memory_plan)


@main.command("show")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--step", type=click.IntRange(min=0), required=True, help="The step to show.")
@click.option("--top", type=click.IntRange(min=0), default=5, show_default=True,
              help="Highest-loss windows to list with their source documents.")
@click.option("--mix", default=None, help="The built mix (default: the one the run used).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show_cmd(run, step, top, mix, as_json) -> None:
    """A step's hash components, loss, LR, norm, and its highest-loss windows with the
    source documents behind them."""
    from open1b_train import show

    try:
        rep = show.step_report(run, step, top, mix)
    except ERRORS as e:
        fail(e)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
    else:
        show.print_report(rep, click.echo)


@main.command("plot")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--out", default=None, help="PNG file (default: RUN/training.png).")
def plot_cmd(run, out) -> None:
    """PNG of loss, LR, gradient norm and tokens/s vs step, batch-ramp phases marked."""
    from open1b_train import plot

    try:
        path = plot.plot_run(run, out)
    except ERRORS as e:
        fail(e)
    click.echo(f"wrote {path}")


def _plugins() -> None:
    """Commands other packages add to ``open1b-train`` through the entry-point group
    ``open1b_train.commands`` (``generate`` and ``export`` from ``open1b_eval``, docs/EVAL.md):
    the trainer never imports the packages downstream of it."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="open1b_train.commands"), key=lambda e: e.name):
        main.add_command(ep.load(), ep.name)


_plugins()


if __name__ == "__main__":  # python -m open1b_train.cli
    sys.exit(main())
