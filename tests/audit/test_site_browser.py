"""The run explorer in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) through Selenium, loading the static site from disk (file://).

Curves render as SVG paths with points; a step page lists the library's documents, and a
large step's index leads to window pages that do; the static search finds a phrase's steps
as ``provenance`` does, loading document text from several files; the coverage map shows
the certified step; a document holding ``<script>`` and an ``onerror`` image shows them as
text and runs neither. Skipped when no Chromium (or Selenium) is installed; ``make test``'s setup
installs both.
"""
from __future__ import annotations

import os
import shutil
import urllib.parse

import pytest

from open1b_audit.site import render, static
from open1b_audit.site.data import Explorer
from open1b_data.explore import inspect, provenance
from testkit.sitefixture import ATTACK, CERTIFIED_STEPS, PAGE, STEPS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
                       reason="no chromium + chromedriver (apt-get install chromium "
                              "chromium-driver)"),
]


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1100,1400", "--allow-file-access-from-files"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def _open(browser, site_dir, page):
    browser.get("file://" + os.path.join(site_dir, page))
    return browser


def _searched(browser, site_dir, q):
    """The search page for ``q`` once its script has loaded the text files and answered."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    b = _open(browser, site_dir, "search.html?q=" + urllib.parse.quote(q))
    WebDriverWait(b, 10).until(
        lambda d: d.find_element(By.ID, "results").get_attribute("data-done") == "1")
    return b


def test_curves_render_as_svg_paths(browser, site_dir):
    b = _open(browser, site_dir, "index.html")
    from selenium.webdriver.common.by import By

    paths = b.find_elements(By.CSS_SELECTOR, "figure.chart path.curve")
    series = {p.find_element(By.XPATH, "../..").get_attribute("data-series") for p in paths}
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= series
    assert all(int(p.get_attribute("data-points")) == STEPS for p in paths)
    assert all(p.get_attribute("d").count("L") == STEPS - 1 for p in paths)
    b.find_element(By.CSS_SELECTOR, "input[name=x][value=tokens]").click()
    assert b.find_elements(By.CSS_SELECTOR, "figure.chart path.curve")
    form = b.find_element(By.ID, "zoom")
    form.find_element(By.NAME, "a").send_keys("2")
    form.find_element(By.NAME, "b").send_keys("3")
    form.find_element(By.TAG_NAME, "button").click()
    # the zoom redraws the charts: the path found first may be the old one, replaced (stale)
    # while it is read, so look it up afresh until the redrawn one is there (5 s at most)
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def zoomed(drv):
        path = drv.find_element(By.CSS_SELECTOR, "figure[data-series=loss] path.curve")
        return path.get_attribute("data-points") == "2"

    WebDriverWait(b, 5, ignored_exceptions=(StaleElementReferenceException,)).until(zoomed)


def test_step_page_lists_the_librarys_documents(browser, site_run, site_dir):
    from selenium.webdriver.common.by import By

    ex = Explorer.open(site_run.run, site_run.mix)
    lib = inspect.stream_at(site_run.mix, step=STEPS, world=ex.world, seed=ex.plan.seed)
    b = _open(browser, site_dir, f"step-{STEPS}.html")
    shown = [[row.find_elements(By.TAG_NAME, "td")[3].text
              for row in sec.find_elements(By.CSS_SELECTOR, "table.docs tr")[1:]]
             for sec in b.find_elements(By.CSS_SELECTOR, "section.window")]
    assert shown == [[g["doc_id"] for g in w["segments"]] for w in lib["windows"]]
    assert b.execute_script("return window.PWNED") is None


def test_a_large_steps_index_leads_to_window_pages(browser, site_run, paged_site_dir):
    from selenium.webdriver.common.by import By

    ex = Explorer.open(site_run.run, site_run.mix)
    lib = inspect.stream_at(site_run.mix, step=STEPS, world=ex.world, seed=ex.plan.seed)
    b = _open(browser, paged_site_dir, f"step-{STEPS}.html")
    assert not b.find_elements(By.CSS_SELECTOR, "section.window")
    rows = b.find_elements(By.CSS_SELECTOR, "table.index tr")[1:]
    assert ([int(r.find_element(By.TAG_NAME, "a").text) for r in rows] ==
        [w["window"] for w in lib["windows"]])
    last = lib["windows"][-1]["window"]
    rows[-1].find_element(By.TAG_NAME, "a").click()               # -> its window page
    assert b.current_url.endswith(f"step-{STEPS}-windows-1.html#w{last}")
    shown = []
    for k in range(-(-len(lib["windows"]) // PAGE)):
        b = _open(browser, paged_site_dir, f"step-{STEPS}-windows-{k}.html")
        shown += [[row.find_elements(By.TAG_NAME, "td")[3].text
                   for row in sec.find_elements(By.CSS_SELECTOR, "table.docs tr")[1:]]
                  for sec in b.find_elements(By.CSS_SELECTOR, "section.window")]
    assert shown == [[g["doc_id"] for g in w["segments"]] for w in lib["windows"]]
    assert b.execute_script("return window.PWNED") is None
    b = _open(browser, paged_site_dir, f"step-{STEPS}-stats.html")
    assert "unique-token ratio" in b.find_element(By.TAG_NAME, "main").text


def test_search_reads_text_from_several_files(browser, tmp_path):
    from selenium.webdriver.common.by import By

    texts = ["alpha " * 40, "beta <b>" * 30, "gamma", "delta " * 30]
    chunks = static.search_chunks(texts, 300)
    assert len(chunks) == 3                  # [alpha], [beta], [gamma, delta]: a lookup to test
    meta = {"last_step": 1, "written": [1], "seq_tokens": 4, "total_windows": 8,
            "runs": [[1, 2, 4, 0]], "text_chunks": [first for first, _ in chunks],
            "docs": [{"key": f"0-0-{i}", "id": f"doc{i}", "source": "s", "steps": [1]}
                     for i in range(len(texts))]}
    (tmp_path / "data").mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "explorer.js").write_bytes(static.asset("explorer.js"))
    (tmp_path / "search.html").write_text(render.search_page(None, bool, bool))
    (tmp_path / "data" / "search.js").write_text(render.data_script("OPEN1B_SEARCH", meta))
    for i, (_, part) in enumerate(chunks):
        (tmp_path / "data" / f"search-text-{i}.js").write_text(
            render.data_script("OPEN1B_SEARCH_TEXT", part, i))
    for q, want in (("beta <b>", ["doc1"]), ("delta", ["doc3"]), ("a", ["doc0", "doc1",
                                                                      "doc2", "doc3"])):
        b = _searched(browser, str(tmp_path), q)
        assert [h.find_element(By.TAG_NAME, "a").text
                for h in b.find_elements(By.CSS_SELECTOR, "#results p.doc")] == want


def test_search_finds_a_phrases_steps(browser, site_run, site_dir):
    from selenium.webdriver.common.by import By

    ex = Explorer.open(site_run.run, site_run.mix)
    phrase = "PWNED=1"
    lib = provenance.report(site_run.mix, phrase=phrase, steps=(1, STEPS), world=ex.world,
                            seed=ex.plan.seed)["documents"]
    assert lib
    b = _searched(browser, site_dir, phrase)
    hits = b.find_elements(By.CSS_SELECTOR, "#results p.doc")
    got = {h.find_element(By.TAG_NAME, "a").text: h.text.split("steps ")[1] for h in hits}
    assert got == {d["doc_id"]: ", ".join(map(str, d["steps"])) for d in lib}
    b = _searched(browser, site_dir, "3")
    assert b.find_element(By.CSS_SELECTOR, "#results a[href='step-3.html']")


def test_coverage_map_shows_the_certified_step(browser, site_dir):
    from selenium.webdriver.common.by import By

    b = _open(browser, site_dir, "coverage.html")
    certified = [(int(r.get_attribute("data-first")), int(r.get_attribute("data-last")))
                 for r in b.find_elements(By.CSS_SELECTOR, "svg.coverage rect.c1")]
    assert certified == [(CERTIFIED_STEPS[0], CERTIFIED_STEPS[-1])]     # one run-length rect
    assert ([(int(r.get_attribute("data-first")), int(r.get_attribute("data-last")))
            for r in b.find_elements(By.CSS_SELECTOR, "svg.coverage rect.c0")] ==
        [(CERTIFIED_STEPS[-1] + 1, STEPS)])


def test_document_markup_is_text_and_never_runs(browser, site_dir):
    from selenium.webdriver.common.by import By

    page = next(p for p in sorted(os.listdir(site_dir)) if p.startswith("doc-")
                and "PWNED" in open(os.path.join(site_dir, p), encoding="utf-8").read())
    b = _open(browser, site_dir, page)
    assert b.execute_script("return typeof window.PWNED") == "undefined"
    assert b.find_element(By.ID, "text").text.startswith(ATTACK.split("<!--")[0])
    assert not b.find_elements(By.CSS_SELECTOR, "main img, main script")
    b = _searched(browser, site_dir, "PWNED")
    assert b.execute_script("return typeof window.PWNED") == "undefined"
    assert b.find_elements(By.CSS_SELECTOR, "#results p.doc")


def test_an_unpinned_site_says_so_where_it_shows_the_chain_and_the_counts(browser, site_dir):
    """``site_dir`` was written without --expect-run-hash and --trusted-keys: the run, step
    and coverage pages show both warnings, visibly, above what they qualify."""
    from selenium.webdriver.common.by import By

    for page in ("index.html", f"step-{CERTIFIED_STEPS[0]}.html", "coverage.html"):
        b = _open(browser, site_dir, page)
        box = b.find_element(By.CSS_SELECTOR, "main div.trust")
        assert box.is_displayed() and box.location["y"] < b.find_element(
            By.CSS_SELECTOR, "main table, main svg").location["y"], page
        assert "NOT PINNED" in box.text and "ANY KEY COUNTS" in box.text, page
