"""``open1b-data build-mix`` and ``open1b-data verify``: thin click commands over
``open1b_data.ingest.pipeline.build_mix`` and ``open1b_data.ingest.verify.verify``.

Object stores: ``--out s3://bucket/prefix`` and ``s3://`` roots in the mix definition go
through s3fs. Point them at a custom endpoint (MinIO, moto, Ceph...) with the environment:
``FSSPEC_S3_ENDPOINT_URL=http://host:port`` (fsspec's per-protocol config, read by every
worker process) or ``AWS_ENDPOINT_URL`` (botocore), plus ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``.
"""
from __future__ import annotations

import json
import logging
import os
import sys

import click

from open1b_data.errors import Open1bDataError

DEFAULT_OUT = os.path.join("build", "demo-mix")


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@click.command("build-mix", epilog=(
    "Object stores: --out s3://bucket/prefix and s3:// roots in the mix file use s3fs; "
    "for a custom endpoint (MinIO, Ceph, moto) set FSSPEC_S3_ENDPOINT_URL=http://host:port "
    "(or AWS_ENDPOINT_URL) plus AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY. A killed build "
    "resumes by rerunning the same command."))
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False), default=None,
              help="Mix definition TOML. Default: the embedded demo mix (manifests/demo.toml).")
@click.option("--out", default=DEFAULT_OUT, show_default=True,
              help="Output directory or URL (e.g. s3://bucket/mix); relative paths are "
                   "relative to the current directory.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Local workers (>= 1). Default: the number of usable CPU cores.")
@click.option("--executor", type=click.Choice(["auto", "threads", "processes"]),
              default="auto", show_default=True,
              help="How workers run: processes (scale past the GIL; forked on Linux, "
                   "spawned elsewhere) or threads of this process. auto: processes for 2+ "
                   "workers where they fork, else only for >= 256 MB of input and more than "
                   "2 workers. The output is the same either way.")
@click.option("--task", type=click.IntRange(min=0), default=None,
              help="Build only inputs whose global index % --tasks == TASK, TASK in "
                   "[0, --tasks) (array jobs / machines sharing one --out; docs/SCALE-OUT.md).")
@click.option("--tasks", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of tasks the inputs are split into (>= 1, with --task). Keep it "
                   "the same for every task and relaunch of one build.")
@click.option("--merge-only", is_flag=True,
              help="Build nothing; write manifest.json once every input is built.")
@click.option("--tokenizer-only", is_flag=True,
              help="List the inputs, record the plan, train and save the tokenizer, then "
                   "stop: the first job of a scaled-out build, before the --task runs "
                   "(docs/SCALE-OUT.md).")
@click.option("--tokenizer", "tokenizer_from", default=None, metavar="FROM",
              help="Take the published tokenizer instead of training one: a tokenizer.json "
                   "(path or URL) or a built mix (its tokenizer files are checked against "
                   "its manifest). It must fit the definition (vocab_size, separator, "
                   "pre-tokenizer).")
@click.option("--expect-tokenizer", default=None, metavar="DIGEST",
              help="The content digest the tokenizer must have (build-mix --json reports it "
                   "as tokenizer_content; the definition's [tokenizer] expect does the "
                   "same): a tokenizers version that trains other merges stops the build "
                   "before any shard is written.")
@click.option("--strict", is_flag=True,
              help="Exit with status 1 once the build has finished if any input file was "
                   "truncated or unreadable, naming each (the outputs and manifest.json, "
                   "which records them, are still written).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result (summary, per-input counts, fingerprint) as JSON on "
                   "stdout.")
@click.option("--quiet", is_flag=True,
              help="No progress lines on stderr (errors still go there, one line each).")
def build_mix(manifest_path: str | None, out: str, workers: int | None, executor: str,
              task: int | None, tasks: int, merge_only: bool, tokenizer_only: bool,
              tokenizer_from: str | None, expect_tokenizer: str | None, strict: bool,
              as_json: bool, quiet: bool) -> None:
    """Build a mix: tokenizer, token shards and manifest.json (resumable, deterministic).

    Without --manifest this builds the embedded demo mix into build/demo-mix under the
    current directory."""
    from open1b_data.ingest.pipeline import BuildOptions, build_mix as run
    from open1b_data.ingest.report import format_bad_inputs, format_table
    from open1b_data.formats.definition import default_mix_path, load_mix

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    path = manifest_path or default_mix_path()
    try:
        options = BuildOptions(workers=_default_workers() if workers is None else workers,
                               task=task, tasks=tasks, merge_only=merge_only,
                               tokenizer_only=tokenizer_only, progress=not quiet,
                               executor=executor, tokenizer_from=tokenizer_from,
                               expect_tokenizer=expect_tokenizer)
        mix = load_mix(path)
        if not quiet:   # the resolved configuration: a progress line like the others
            click.echo(f"build-mix: mix {mix.name!r} from {path} -> {out} (workers "
                       f"{options.workers}, task {task if task is not None else 'all'}"
                       f"{'' if task is None else f' of {tasks}'}"
                       f"{', merge only' if merge_only else ''}"
                       f"{', tokenizer only' if tokenizer_only else ''})", err=True)
        result = run(mix, out, options)
        if result.merged:
            # The stream's seek index for the mix's own seed is part of a finished build,
            # so `stream-at` never has to replay the stream (other seeds:
            # `StreamPlan.open(..., build_index=True)`). It is derived data, verified
            # against the fingerprint on load.
            from open1b_data.stream import seekindex
            from open1b_data.stream.plan import StreamPlan

            seekindex.ensure(StreamPlan.open(out, use_index=False))
    except Open1bDataError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, sort_keys=True))
    elif tokenizer_only:
        click.echo(f"tokenizer ready: {out.rstrip('/')}/tokenizer.json; {result.inputs_total} "
                   f"inputs to build (run the --task array, then --merge-only)")
    else:
        click.echo(format_table(result.summary))
        bad = format_bad_inputs(result.inputs)
        if bad:
            click.echo("\n" + bad)
        if result.merged:
            click.echo(f"\n{result.inputs_built} inputs built, {result.inputs_skipped} already "
                       f"done; manifest {out.rstrip('/')}/manifest.json, fingerprint "
                       f"{result.fingerprint}")
        else:
            click.echo(f"\n{result.inputs_built} inputs built; {len(result.missing)} inputs "
                       f"still missing (other tasks); run with --merge-only once all tasks "
                       f"finished")
    if strict and result.unreadable:
        names = ", ".join(f"{i.source}/{i.path} ({'+'.join(i.unreadable)})"
                          for i in result.unreadable)
        record = "manifest.json records" if result.merged else "their markers record"
        raise click.ClickException(
            f"--strict: {len(result.unreadable)} input file(s) truncated or unreadable: "
            f"{names}; the build finished and {record} what was read (inputs[].first_error); "
            f"replace the files and build into a new --out")


@click.command("verify")
@click.argument("mix")
@click.option("--json", "as_json", is_flag=True, help="Print the mismatches as a JSON list.")
def verify(mix: str, as_json: bool) -> None:
    """Check every file of built MIX (directory or URL) against the content its
    manifest.json records (shards' Merkle roots, document lengths, held-out rows,
    tokenizer content); exits non-zero naming each mismatch."""
    from open1b_data.ingest.verify import check

    try:
        found = check(mix)
    except Open1bDataError as e:
        raise click.ClickException(str(e)) from None
    problems = list(found.problems)
    if as_json:
        click.echo(json.dumps(problems, indent=1))
    else:
        for p in problems:
            click.echo(f"MISMATCH {p}")
        click.echo(f"{mix}: {'OK' if not problems else f'{len(problems)} mismatch(es)'} - "
                   f"{found.summary()}", err=bool(problems))
    if problems:
        sys.exit(1)


COMMANDS = [build_mix, verify]
