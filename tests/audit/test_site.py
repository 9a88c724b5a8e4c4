"""The run explorer without a browser: what its pages say against the library's answers,
escaping of corpus text, hashed-only values, the CLI and the loopback server."""
from __future__ import annotations

import glob
import json
import os
import shutil
import threading
import urllib.request

import pytest
from click.testing import CliRunner

from open1b_audit.cli import main
from open1b_audit.errors import SiteError
from open1b_audit.site import render, static
from open1b_audit.site.data import Explorer
from open1b_audit.site.scalars import f32, scalars_of
from open1b_data.explore import inspect, provenance
from open1b_train import runlog
from open1b_train.show import step_report
from testkit.sitefixture import ATTACK, CERTIFIED, CERTIFIED_STEPS, PAGE, STEPS


def test_script_json_cannot_close_or_open_anything():
    s = render.script_json({"t": "</script><!-- \u2028\u2029 & <b>"})
    assert "<" not in s and ">" not in s and "&" not in s
    assert "\u2028" not in s and "\u2029" not in s
    assert json.loads(s) == {"t": "</script><!-- \u2028\u2029 & <b>"}
    assert render.e('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"


def test_scalars_come_from_the_hashed_fields():
    line = {"loss": 99.0, "lr": 1.0, "grad_norm": 5.0,
            "scalars": {"loss": "40490fdb", "lr": (0.5).hex(), "grad_norm": "3f800000",
                        "tokens": 8, "skipped": False, "spike": True, "window_loss": []}}
    sc = scalars_of(line)
    assert sc["loss"] == f32("40490fdb") and abs(sc["loss"] - 3.14159265) < 1e-6
    assert sc["lr"] == 0.5 and sc["grad_norm"] == 1.0 and sc["spike"] and sc["val_loss"] is None
    assert scalars_of({"scalars": {"val_loss": "3f800000"}})["val_loss"] == 1.0


def test_step_page_is_the_librarys_answer(site_run):
    ex = Explorer.open(site_run.run, site_run.mix, site_run.certs)
    assert ex.finding is None and ex.last == STEPS
    for s in (1, STEPS):
        d = ex.step_page(s)
        lib = inspect.stream_at(site_run.mix, step=s, world=ex.world, seed=ex.plan.seed)
        assert [w["window"] for w in d["windows"]] == [w["window"] for w in lib["windows"]]
        assert ([[g["doc_id"] for g in w["documents"]] for w in d["windows"]] ==
            [[g["doc_id"] for g in w["segments"]] for w in lib["windows"]])
        show = step_report(site_run.run, s, top=0, mix=site_run.mix)
        assert [w["loss"] for w in d["windows"]] == [w["loss"] for w in show["windows"]]
        assert d["scalars"]["loss"] == show["loss"] and d["scalars"]["lr"] == show["lr"]
        stats = inspect.stream_at(site_run.mix, step=s, world=ex.world, stats=True,
                                  seed=ex.plan.seed)["stats"]
        assert d["stats"] == stats
    assert [c["signature"] for c in ex.step_page(CERTIFIED)["certificates"]] == ["verified"]
    assert ex.coverage_page()["counts"] == {s: 1 for s in CERTIFIED_STEPS}


def test_a_large_step_is_paged_and_its_pages_are_the_one_page_answer(site_run):
    one = Explorer.open(site_run.run, site_run.mix)
    paged = Explorer.open(site_run.run, site_run.mix)
    paged.page_windows = PAGE
    for s in (1, STEPS):
        whole = one.step_page(s)
        d = paged.step_page(s)
        assert d["windows"] is None and d["stats"] is None and d["pages"] == 2
        assert [(x["window"], x["rank"], x["micro_batch"], x["loss"], x["documents"])
                for x in d["index"]] == [(w["window"], w["rank"], w["micro_batch"], w["loss"],
                                          len(w["documents"])) for w in whole["windows"]]
        assert [x["page"] for x in d["index"]] == [0, 0, 0, 1]
        pages = [paged.window_page(s, k) for k in range(d["pages"])]
        assert [p["mesh_range"] for p in pages] == [[0, 3], [3, 4]]
        assert [w for p in pages for w in p["windows"]] == whole["windows"]
        assert paged.stats_page(s)["stats"] == whole["stats"]
        assert paged.doc_keys(s) == [g["doc_key"] for w in whole["windows"]
                                     for g in w["documents"]]
    with pytest.raises(SiteError, match="no window page 2"):
        paged.window_page(1, 2)
    with pytest.raises(SiteError, match="no statistics"):
        paged.stats_page(0)


def test_search_text_comes_in_bounded_files():
    texts = ["a" * 50, "<b>" * 10, "c" * 500, "", "d" * 20]
    chunks = static.search_chunks(texts, 100)
    assert [t for _, part in chunks for t in part] == texts
    assert [first for first, _ in chunks] == [0, 1, 2, 3]     # "<b>" x 10 is 132 bytes escaped
    for _, part in chunks:
        assert len(part) == 1 or sum(len(render.script_json(t)) + 1 for t in part) <= 100


def test_paged_site_writes_window_and_statistics_pages(paged_site_dir):
    names = set(os.listdir(paged_site_dir))
    for s in range(1, STEPS + 1):
        assert {f"step-{s}.html", f"step-{s}-windows-0.html", f"step-{s}-windows-1.html",
                f"step-{s}-stats.html"} <= names
        assert f"step-{s}-windows-2.html" not in names
        page = open(os.path.join(paged_site_dir, f"step-{s}.html"), encoding="utf-8").read()
        assert 'class="window"' not in page and f'href="step-{s}-windows-1.html#w' in page


def test_document_page_is_reverse_provenance(site_run):
    ex = Explorer.open(site_run.run, site_run.mix)
    key = ex.step_page(1)["windows"][0]["documents"][0]["doc_key"]
    doc = ex.document_page(key)
    lib = provenance.report(site_run.mix, doc_id=doc["doc_id"], steps=(1, STEPS),
                            world=ex.world, seed=ex.plan.seed)["documents"]
    assert doc["steps"] == lib[0]["steps"] and 1 in doc["steps"]
    assert doc["occurrences"] == lib[0]["occurrences"]


def test_corpus_markup_is_shown_as_text_only(site_dir):
    pages = {p: open(p, encoding="utf-8").read() for p in glob.glob(f"{site_dir}/**/*.*",
                                                                  recursive=True)
             if p.endswith((".html", ".js"))}
    assert not any("window.PWNED" in t and "<script>window.PWNED" in t for t in pages.values())
    docs = [t for p, t in pages.items() if "/doc-" in p and "PWNED" in t]
    assert docs, "no document page shows the planted document"
    assert render.e(ATTACK.split("\n")[0]) in docs[0]
    search = "".join(t for p, t in pages.items() if "/data/search-text-" in p)
    assert "\\u003cscript\\u003ewindow.PWNED=1" in search and "\u2028" not in search


def test_edited_unhashed_fields_change_nothing(site_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(site_run.run, run, ignore=shutil.ignore_patterns("checkpoints"))
    lines = runlog.read(run)
    before = Explorer.open(run, site_run.mix).series(1, STEPS)
    lines[2] = {**lines[2], "loss": 0.001, "lr": 9.0, "grad_norm": 1e9}
    runlog.rewrite(run, lines)
    ex = Explorer.open(run, site_run.mix)
    # the chain refuses decimals that disagree with the hashed scalars, naming the step
    assert (ex.finding.step, ex.finding.component) == (2, "scalars"), ex.finding
    assert ex.series(1, STEPS) == before           # and the explorer does not show them


def test_cli_site_and_its_errors(site_run, tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(main, ["site", site_run.run, "--mix", site_run.mix, "--certs",
                                  site_run.certs, "--out", str(out), "--steps", "2:3",
                                  "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["steps"] == [2, 3] and (out / "step-3.html").exists()
    assert not (out / "step-1.html").exists() and (out / "certs" / f"step-{CERTIFIED:08d}.json").exists()
    assert rep["largest"]["bytes"] < 4 << 20
    r = CliRunner().invoke(main, ["site", site_run.run, "--out", str(out), "--steps", "1:99"])
    assert r.exit_code == 1 and "cannot write step 5" in r.output
    r = CliRunner().invoke(main, ["site", site_run.run, "--mix", str(tmp_path), "--out",
                                  str(out)])
    assert r.exit_code == 1 and r.output.startswith("Error:") and "Traceback" not in r.output


def test_serve_renders_any_step_on_loopback(site_run):
    from open1b_audit.site.serve import make_server

    ex = Explorer.open(site_run.run, site_run.mix, site_run.certs)
    server = make_server(ex, 0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    base = f"http://{host}:{port}/"

    def get(path):
        try:
            with urllib.request.urlopen(base + path) as f:
                return f.status, f.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    try:
        assert get("")[0] == 200 and "chain OK" in get("index.html")[1]
        code, page = get(f"step-{STEPS}.html")
        assert code == 200 and f"step {STEPS}" in page and "<script>window.PWNED" not in page
        assert get("data/curves-0.js")[1].startswith("(window.OPEN1B_CHUNKS")
        assert get("coverage.html")[0] == 200 and get("mix.html")[0] == 200
        assert get("step-99.html")[0] == 404 and get("../etc/passwd")[0] == 404
        code, page = get(f"step-{STEPS}-windows-0.html")          # one page: all 4 windows
        assert code == 200 and page.count('<section class="window"') == 4
        assert get(f"step-{STEPS}-windows-1.html")[0] == 404
        code, page = get(f"step-{STEPS}-stats.html")
        assert code == 200 and "unique-token ratio" in page
        assert get("step-0-stats.html")[0] == 404
        code, page = get("search.html?q=PWNED")
        assert code == 200 and "doc-" in page
        code, page = get("search.html?q=3")
        assert 'href="step-3.html"' in page
    finally:
        server.shutdown()
        server.server_close()
