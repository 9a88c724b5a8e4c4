"""Stream commands of ``open1b-data``: ``stream-at``, ``schedule``, ``provenance``,
``plot-mix``. Each parses its options, calls the library and prints either a compact human
table or, with ``--json``, the documented schema (docs/CLI.md). Heavy imports (pyarrow,
matplotlib, tokenizers) happen inside the commands so ``--help`` stays fast."""
from __future__ import annotations

import json
from typing import Any

import click

from open1b_data.errors import Open1bDataError


def _fail(e: Exception) -> None:
    raise click.ClickException(str(e))


class StepRange(click.ParamType):
    """``A:B`` -> (A, B), inclusive step numbers with 1 <= A <= B."""

    name = "A:B"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        try:
            a, b = (int(x) for x in str(value).split(":"))
        except ValueError:
            self.fail(f"expected A:B with step numbers, e.g. 1:100; got {value!r}", param, ctx)
        if not 1 <= a <= b:
            self.fail(f"need 1 <= A <= B, got {value!r}", param, ctx)
        return a, b


STEPS = StepRange()


def _json_text(obj, indent: int = 0) -> str:
    """JSON with one item per line, except that a list or object holding no list or object
    goes on one line (a segment, a token list): the same data as ``json.dumps``, readable."""
    if isinstance(obj, dict):
        items, open_, close = list(obj.items()), "{", "}"
    elif isinstance(obj, list):
        items, open_, close = list(enumerate(obj)), "[", "]"
    else:
        return json.dumps(obj, ensure_ascii=False)
    if not items or not any(isinstance(v, (dict, list)) for _, v in items):
        return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))
    pad = " " * (indent + 1)
    keyed = isinstance(obj, dict)
    lines = [pad + (json.dumps(k, ensure_ascii=False) + ": " if keyed else "")
             + _json_text(v, indent + 1) for k, v in items]
    return open_ + "\n" + ",\n".join(lines) + "\n" + " " * indent + close


def _echo_json(obj) -> None:
    click.echo(_json_text(obj))


# ------------------------------------------------------------------------- stream-at

@click.command("stream-at")
@click.argument("mix")
@click.option("--window", "window", type=int, help="A stream window index (from 0).")
@click.option("--step", type=int, help="An optimizer step (from 1): all its windows.")
@click.option("--steps", "steps", type=STEPS,
              help="Step range A:B, inclusive, with --stats: one line per step (at most 64).")
@click.option("--world", type=int, default=None,
              help="Data-parallel ranks R (default: the schedule's reference_world).")
@click.option("--rank", type=int, default=None,
              help="Only this rank's windows (0..R-1); with --window, the window's owner.")
@click.option("--decode", is_flag=True, help="Also print each segment's decoded text.")
@click.option("--plan-only", is_flag=True,
              help="Plan only: segments without reading token shards (no sha256/tokens).")
@click.option("--stats", is_flag=True,
              help="The batch's data statistics (unique-token ratio, tokens and documents "
                   "per source, redrawn documents, longest run and repeat) instead of the "
                   "window listing.")
@click.option("--build-index", is_flag=True,
              help="Build the mix's seek index first if it is missing or short (one pass "
                   "over the schedule; ~1 min at Open-1B scale).")
@click.option("--proof", is_flag=True,
              help="Also every document the windows use, whole, with its Merkle inclusion "
                   "proof against its shard's root in the manifest (checked before output).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/CLI.md).")
def stream_at(mix, window, step, steps, world, rank, decode, plan_only, stats, build_index,
              proof, as_json):
    """What the stream holds at a window or step: ranks, micro-batches, window sha256,
    token ids and every document segment (source, shard, doc, doc_id, offsets) - or, with
    --stats, the batch's data statistics."""
    from open1b_data.explore import inspect

    if sum(x is not None for x in (window, step, steps)) != 1:
        raise click.UsageError("give exactly one of --window M, --step N or --steps A:B")
    if steps is not None and not stats:
        raise click.UsageError("--steps A:B lists statistics per step; add --stats (or "
                               "give one --step N)")
    if proof and (plan_only or stats):
        raise click.UsageError(f"--proof proves the documents of a window listing; drop "
                               f"--{'plan-only' if plan_only else 'stats'}")
    if build_index:
        click.echo("stream-at: loading or building the seek index...", err=True)
    try:
        if steps is not None:
            lines = None if as_json or decode or plan_only else inspect.StepLines(click.echo)
            if decode or plan_only:
                raise click.UsageError("--steps A:B --stats reads token content; drop "
                                       "--decode and --plan-only")
            rep = inspect.steps_stats(mix, steps, world, rank, build_index,
                                      on_step=lines)
        else:
            rep = inspect.stream_at(mix, window, step, world, rank, decode, plan_only, stats,
                                    build_index)
            if proof:
                from open1b_data.explore.proof import prove_stream_at

                rep = prove_stream_at(mix, rep)
    except Open1bDataError as e:
        _fail(e)
    if as_json:
        _echo_json(rep)
    elif steps is None:
        inspect.print_stream_at(rep, click.echo)
        if proof:
            _print_proofs(rep, click.echo)


def _print_proofs(rep: dict, echo) -> None:
    docs = rep["documents"]
    echo(f"\n{len(docs)} document(s), each proved against its shard's Merkle root in the "
         f"manifest (--json: tokens and sibling hashes)")
    width = max([len(d["shard_path"]) for d in docs] + [len("shard file")])
    echo(f"  {'shard file':<{width}} {'row':>7} {'tokens':>7} {'proof':>6}  root")
    for d in docs:
        echo(f"  {d['shard_path']:<{width}} {d['doc']:>7} {d['doc_length']:>7} "
             f"{len(d['proof']['siblings']):>6}  {d['root'][:16]}...")


# ------------------------------------------------------------------------- schedule

@click.command("schedule")
@click.option("--step", type=int, help="An optimizer step (from 1).")
@click.option("--tokens", type=int, help="A token index: the step that consumes it.")
@click.option("--mix", "mix", default=None,
              help="A built mix or mix definition (.toml) whose schedule to use "
                   "(default: the Open-1B schedule, manifests/mix-0626.toml).")
@click.option("--world", type=int, default=None,
              help="Data-parallel ranks (default: the schedule's reference_world).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/CLI.md).")
def schedule(step, tokens, mix, world, as_json):
    """Batch, accumulation, tokens before/after and learning rate of one step."""
    from open1b_data.stream.schedule import Schedule, open1b_spec

    if (step is None) == (tokens is None):
        raise click.UsageError("give exactly one of --step N or --tokens T")
    try:
        sched = Schedule(_schedule_spec(mix) if mix else open1b_spec())
        s = step if step is not None else sched.step_of_token(tokens)
        info = sched.step(s)
        R = sched.spec.reference_world if world is None else world
        acc = sched.accumulation(s, R)
    except Open1bDataError as e:
        _fail(e)
    rep = {"step": info.step, "phase": info.phase, "batch_sequences": info.batch_sequences,
           "batch_tokens": info.batch_sequences * sched.spec.seq_tokens, "world": R,
           "micro_batch": sched.spec.micro_batch, "accumulation": acc,
           "tokens_before": info.tokens_before, "tokens_after": info.tokens_after,
           "first_window": info.first_window,
           "last_window": info.first_window + info.batch_sequences - 1, "lr": info.lr,
           "last_step": sched.last_step}
    if tokens is not None:
        rep["token"] = tokens
    if as_json:
        _echo_json(rep)
        return
    echo = click.echo
    if tokens is not None:
        echo(f"token {tokens:,} is consumed by step {info.step}")
    echo(f"step {info.step} of {sched.last_step} (phase {info.phase})")
    echo(f"  batch          {info.batch_sequences} sequences = "
         f"{rep['batch_tokens']:,} tokens")
    echo(f"  accumulation   {acc} micro-batches of {sched.spec.micro_batch} per rank "
         f"on {R} ranks")
    echo(f"  tokens before  {info.tokens_before:,}")
    echo(f"  tokens after   {info.tokens_after:,}")
    echo(f"  windows        {info.first_window:,} .. {rep['last_window']:,}")
    echo(f"  lr             {info.lr:.6g}")


def _schedule_spec(mix: str):
    from open1b_data.formats.definition import load_mix

    if mix.endswith(".toml"):
        return load_mix(mix).schedule
    from open1b_data.stream.mixview import MixView
    from open1b_data.stream.schedule import Schedule

    return Schedule.from_definition(MixView.open(mix).definition).spec


# ------------------------------------------------------------------------- provenance

@click.command("provenance")
@click.argument("mix")
@click.option("--doc-id", "doc_id", help="A source-native document id.")
@click.option("--text", "phrase", help="A phrase: documents containing it, and their steps.")
@click.option("--steps", "steps", type=STEPS,
              help="Step range A:B, inclusive (default: the whole run).")
@click.option("--world", type=int, default=None,
              help="Data-parallel ranks for the rank column (default: reference_world).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/CLI.md).")
def provenance(mix, doc_id, phrase, steps, world, as_json):
    """Where a document (or every document containing a phrase) was trained on."""
    from open1b_data.explore import provenance as pv

    if (doc_id is None) == (phrase is None):
        raise click.UsageError("give exactly one of --doc-id ID or --text PHRASE")
    try:
        rep = pv.report(mix, doc_id=doc_id, phrase=phrase, steps=steps,
                        world=world)
    except Open1bDataError as e:
        _fail(e)
    if as_json:
        _echo_json(rep)
    else:
        pv.print_report(rep, click.echo)


# ------------------------------------------------------------------------- plot-mix

@click.command("plot-mix")
@click.argument("mix")
@click.option("--steps", "steps", type=STEPS, required=True,
              help="Step range A:B, inclusive.")
@click.option("--out", "out", default="mix-composition.png", show_default=True,
              help="PNG file to write.")
@click.option("--bins", type=int, default=50, show_default=True,
              help="Number of step bins on the x axis.")
def plot_mix(mix, steps, out, bins):
    """A PNG of token share per source over steps, beside the target shares."""
    from open1b_data.explore import plotmix

    try:
        summary = plotmix.plot_mix(mix, steps, out, bins=bins)
    except Open1bDataError as e:
        _fail(e)
    click.echo(f"wrote {out}: steps {summary['steps'][0]}..{summary['steps'][1]}, "
               f"{summary['windows']:,} windows")
    for name, real, target in summary["shares"]:
        click.echo(f"  {name:<16} realized {real:7.2%}  target {target:7.2%}")


COMMANDS = [stream_at, schedule, provenance, plot_mix]
