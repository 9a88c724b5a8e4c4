"""The run explorer in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) through Selenium, loading the static site from disk (file://).

Curves render as SVG paths with points; a step page lists the library's documents; the
static search finds a phrase's steps as ``provenance`` does; the coverage map shows the
certified step; a document holding ``<script>`` and an ``onerror`` image shows them as text
and runs neither. Skipped when no Chromium (or Selenium) is installed; ``make test``'s setup
installs both.
"""
from __future__ import annotations

import os
import shutil
import urllib.parse

import pytest

from open1b_audit.site.data import Explorer
from open1b_data.stream import inspect, provenance
from tests.fixtures.sitefixture import ATTACK, CERTIFIED_STEPS, STEPS

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
    b.implicitly_wait(5)
    loss = b.find_element(By.CSS_SELECTOR, "figure[data-series=loss] path.curve")
    assert loss.get_attribute("data-points") == "2"


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


def test_search_finds_a_phrases_steps(browser, site_run, site_dir):
    from selenium.webdriver.common.by import By

    ex = Explorer.open(site_run.run, site_run.mix)
    phrase = "PWNED=1"
    lib = provenance.report(site_run.mix, phrase=phrase, steps=(1, STEPS), world=ex.world,
                            seed=ex.plan.seed)["documents"]
    assert lib
    b = _open(browser, site_dir, "search.html?q=" + urllib.parse.quote(phrase))
    hits = b.find_elements(By.CSS_SELECTOR, "#results p.doc")
    got = {h.find_element(By.TAG_NAME, "a").text: h.text.split("steps ")[1] for h in hits}
    assert got == {d["doc_id"]: ", ".join(map(str, d["steps"])) for d in lib}
    b = _open(browser, site_dir, "search.html?q=3")
    assert b.find_element(By.CSS_SELECTOR, "#results a[href='step-3.html']")


def test_coverage_map_shows_the_certified_step(browser, site_dir):
    from selenium.webdriver.common.by import By

    b = _open(browser, site_dir, "coverage.html")
    certified = [(int(r.get_attribute("data-first")), int(r.get_attribute("data-last")))
                 for r in b.find_elements(By.CSS_SELECTOR, "svg.coverage rect.c1")]
    assert certified == [(CERTIFIED_STEPS[0], CERTIFIED_STEPS[-1])]     # one run-length rect
    assert [(int(r.get_attribute("data-first")), int(r.get_attribute("data-last")))
            for r in b.find_elements(By.CSS_SELECTOR, "svg.coverage rect.c0")] == \
        [(CERTIFIED_STEPS[-1] + 1, STEPS)]


def test_document_markup_is_text_and_never_runs(browser, site_dir):
    from selenium.webdriver.common.by import By

    page = next(p for p in sorted(os.listdir(site_dir)) if p.startswith("doc-")
                and "PWNED" in open(os.path.join(site_dir, p), encoding="utf-8").read())
    b = _open(browser, site_dir, page)
    assert b.execute_script("return typeof window.PWNED") == "undefined"
    assert b.find_element(By.ID, "text").text.startswith(ATTACK.split("<!--")[0])
    assert not b.find_elements(By.CSS_SELECTOR, "main img, main script")
    b = _open(browser, site_dir, "search.html?q=PWNED")
    assert b.execute_script("return typeof window.PWNED") == "undefined"
    assert b.find_elements(By.CSS_SELECTOR, "#results p.doc")
