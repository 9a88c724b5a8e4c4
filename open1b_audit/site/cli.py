"""``open1b-audit site`` and ``open1b-audit serve``: the run explorer's two commands (the
thin click layer over ``open1b_audit.site``; registered by ``open1b_audit.cli``).

Both take what ``coverage`` and every audit command take from out of band - the published
run hash (``--expect-run-hash``: a log that does not end in it is refused) and the trusted
keys (``--trusted-keys``: only their certificates count) - and when either is missing they
say so: on every page that shows a chain status or a count (``render.trust_banner``), and
on standard error (in the JSON report with ``--json``)."""
from __future__ import annotations

import os

import click

from open1b.cli import ERRORS, emit, fail
from open1b_audit.options import announcement, expect_recipe, expect_run_hash, trusted_keys
from open1b_data.cli.stream import STEPS


def _open(run, mix, certs, build_index, keys, expect, preset=None, mix_fp=None):
    from open1b_audit import certificate
    from open1b_audit.site.data import Explorer

    trusted = certificate.read_trusted_keys(keys) if keys else None
    return Explorer.open(run, mix, certs, build_index, trusted=trusted, expect=expect,
                         announce=announcement(expect, preset, mix_fp))


def warnings(ex) -> list[str]:
    """What the explorer was not given, in the words of its pages' banner."""
    out = []
    if ex.expect is None:
        out.append("no --expect-run-hash: the log is not pinned to the published run hash "
                   "(a truncated or re-chained log also shows 'chain OK'); the pages say so")
    if ex.trusted is None:
        out.append("no --trusted-keys: any key counts (anyone can make one); the pages say so")
    missing = [f for f in ex.announce.unpinned() if f != "--expect-run-hash"]
    if missing:
        out.append(f"no {' or '.join(missing)}: the run is compared with its own recipe "
                   f"claims only, not the announced ones; the pages say so")
    return out


@click.command("site")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--certs", type=click.Path(file_okay=False), default=None,
              help="A directory of certificates (*.json) for coverage and step pages.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory to write the static site into (open OUT/index.html).")
@click.option("--steps", "steps", type=STEPS, default=None,
              help="Write step pages for steps A..B (default: the first 64 and every "
                   "certified step).")
@click.option("--build-index", is_flag=True,
              help="Build the mix's seek index first if it is missing (far steps).")
@trusted_keys
@expect_run_hash
@expect_recipe
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def site_cmd(run, mix, certs, out, steps, build_index, trusted_keys, expect, expect_preset,
             expect_mix, as_json) -> None:
    """Write the run explorer of RUN as a static site: run, step, document, coverage and
    mix pages (docs/AUDIT.md, "The run explorer")."""
    from open1b_audit.site.static import write_site

    try:
        ex = _open(run, mix, certs, build_index, trusted_keys, expect, expect_preset, expect_mix)
        rep = write_site(ex, out, None if steps is None else list(range(steps[0], steps[1] + 1)))
    except ERRORS as e:
        fail(e)
    rep["warnings"] = warnings(ex)
    if not as_json:
        for w in rep["warnings"]:
            click.echo(f"warning: {w}", err=True)
    emit(rep, as_json, lambda r: click.echo(
        f"wrote {r['out']}: {r['files']} files, {r['bytes'] / 2**20:.1f} MiB ({len(r['steps'])} "
        f"step pages, {r['documents']} document pages; largest {r['largest']['file']} "
        f"{r['largest']['bytes'] / 2**10:.0f} KiB) in {r['seconds']:.1f} s\n"
        f"open {os.path.join(r['out'], 'index.html')}"))


@click.command("serve")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--certs", type=click.Path(file_okay=False), default=None,
              help="A directory of certificates (*.json) for coverage and step pages.")
@click.option("--port", type=click.IntRange(0, 65535), default=8017, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--build-index", is_flag=True,
              help="Build the mix's seek index first if it is missing (far steps).")
@trusted_keys
@expect_run_hash
@expect_recipe
def serve_cmd(run, mix, certs, port, build_index, trusted_keys, expect, expect_preset,
              expect_mix) -> None:
    """Serve the run explorer of RUN on 127.0.0.1, every page rendered on demand (any
    step of a large run); Ctrl-C stops it. Only requests for a loopback name are answered."""
    from open1b_audit.site.serve import make_server

    try:
        ex = _open(run, mix, certs, build_index, trusted_keys, expect, expect_preset, expect_mix)
        server = make_server(ex, port)
    except ERRORS as e:
        fail(e)
    for w in warnings(ex):
        click.echo(f"warning: {w}", err=True)
    host, bound = server.server_address[:2]
    click.echo(f"serving {run} ({ex.last} steps) at http://{host}:{bound}/ - Ctrl-C stops")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
