"""Screenshots of the run explorer's pages (docs/explorer/*.png) from a written site.

    python scripts/explorer_screenshots.py build/site docs/explorer [--step N] [--phrase P]

Headless Chromium (Debian's chromium + chromium-driver) through Selenium; each page at
1000 px wide, cut to its first 1200 px, as PNG.
"""
from __future__ import annotations

import argparse
import os
import urllib.parse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("site")
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--phrase", default="Coulomb")
    a = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for x in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,1200",
              "--hide-scrollbars"):
        opts.add_argument(x)
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    site = os.path.abspath(a.site)
    doc = sorted(p for p in os.listdir(site) if p.startswith("doc-"))[0]
    pages = {"run": "index.html", "step": f"step-{a.step}.html", "document": doc,
             "coverage": "coverage.html", "mix": "mix.html",
             "search": "search.html?q=" + urllib.parse.quote(a.phrase)}
    os.makedirs(a.out, exist_ok=True)
    try:
        for name, page in pages.items():
            drv.get("file://" + os.path.join(site, page))
            if name == "search":        # answered once the text files have loaded
                WebDriverWait(drv, 30).until(lambda d: d.find_element(
                    By.ID, "results").get_attribute("data-done") == "1")
            drv.save_screenshot(os.path.join(a.out, f"{name}.png"))
            print(f"wrote {a.out}/{name}.png")
    finally:
        drv.quit()


if __name__ == "__main__":
    main()
