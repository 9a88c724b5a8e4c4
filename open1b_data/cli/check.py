"""``open1b-data rebuild-check``: a thin click command over
``open1b_data.ingest.rebuildcheck.rebuild_check`` - is a published mix what its upstream
sources give?"""
from __future__ import annotations

import json
import logging
import sys

import click

from open1b_data.errors import Open1bDataError


def _locations(values: tuple[str, ...], names: list[str], what: str) -> dict[str, str]:
    """``NAME=LOCATION`` for one source, or a bare ``DIR`` holding one folder per source
    (``DIR/<name>``, as manifests/demo/ does) for every source not named otherwise."""
    out: dict[str, str] = {}
    base = None
    for v in values:
        name, sep, loc = v.partition("=")
        if sep and name in names:
            out[name] = loc
        elif sep and "/" not in name and ":" not in name:
            raise click.BadParameter(f"{v!r}: the mix has no source {name!r}; its sources: "
                                     f"{names}", param_hint=what)
        else:
            base = v
    if base is not None:
        for name in names:
            out.setdefault(name, f"{base.rstrip('/')}/{name}")
    return out


def _from_definition(path: str | None, names: list[str]) -> tuple[dict, dict]:
    """Roots and content stores of the sources named ``names`` in definition ``path``."""
    if path is None:
        return {}, {}
    from open1b_data.formats.definition import default_mix_path, load_mix

    spec = load_mix(default_mix_path() if path == "demo" else path)
    srcs = [s for s in spec.sources if s.name in names]
    return ({s.name: s.root for s in srcs},
            {s.name: s.content_store for s in srcs if s.content_store})


@click.command("rebuild-check", epilog=(
    "Exit status 0 when every checked input rebuilds to the published content, 1 naming "
    "the first differing document and field otherwise. Works on a mix on object storage "
    "(s3://...; FSSPEC_S3_ENDPOINT_URL for a custom endpoint)."))
@click.argument("mix")
@click.option("--sources", "sources", multiple=True, metavar="NAME=ROOT|DIR",
              help="Where the upstream files are kept here: NAME=ROOT for one source (a path "
                   "or URL), or a DIR with one folder per source (DIR/<name>). Repeatable. "
                   "Sources not given use the roots in the manifest's definition.")
@click.option("--definition", default=None, metavar="FILE|demo",
              help="A mix definition (TOML) whose sources' roots and content stores say "
                   "where the upstream files are kept here (e.g. the file you would build "
                   "the mix from); 'demo' is the embedded demo definition "
                   "(manifests/demo.toml). --sources overrides it per source.")
@click.option("--content-store", "stores", multiple=True, metavar="NAME=TEMPLATE",
              help="A stack-v2 source's content store URL template (with {blob_id}); by "
                   "default the definition's, moved with the source's root.")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Check the inputs of K shards drawn uniformly from the mix (about K "
                   "shards' work) instead of every input.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Which sample: another seed draws another slice.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Inputs rebuilt at a time.")
@click.option("--work", default=None,
              help="Where to rebuild (kept; default: a temporary directory, removed).")
@click.option("--retrain-tokenizer", is_flag=True,
              help="Also train the tokenizer again from the sources and compare its content "
                   "(the check otherwise encodes with the published tokenizer).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rebuild_check(mix, sources, definition, stores, sample, seed, workers, work,
                  retrain_tokenizer, as_json):
    """Rebuild all or a sample of MIX's shards from the upstream sources and compare their
    content with the published mix (docs/FORMATS.md)."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.ingest.rebuildcheck import rebuild_check as run

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        names = [s.name for s in load_manifest(mix).sources]
        roots, content = _from_definition(definition, names)
        roots.update(_locations(sources, names, "--sources"))
        content.update(_locations(stores, names, "--content-store"))
        rep = run(mix, roots, content, sample=sample, seed=seed,
                  workers=workers, work=work, retrain_tokenizer=retrain_tokenizer,
                  progress=not as_json)
    except Open1bDataError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1))
    else:
        scope = "every input" if sample is None else f"a sample of {sample} shard(s)"
        click.echo(f"mix {rep.name!r} fingerprint {rep.fingerprint[:16]}...: {scope}, "
                   f"{rep.inputs_checked} of {rep.inputs_total} inputs, {rep.shards_checked} "
                   f"of {rep.shards_total} shards, {rep.documents:,} documents, "
                   f"{rep.tokens:,} tokens rebuilt")
        if rep.rebuilt_fingerprint:
            click.echo(f"rebuilt fingerprint {rep.rebuilt_fingerprint}")
        for d in rep.differences:
            click.echo(f"DIFFER {d}")
        click.echo("MATCH" if rep.matches else f"{len(rep.differences)} difference(s)")
    if not rep.matches:
        sys.exit(1)


COMMANDS = [rebuild_check]
