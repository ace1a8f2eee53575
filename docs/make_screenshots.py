"""Regenerate the README's screenshots from a stored training run.

    .venv/bin/python docs/make_screenshots.py RUN_DIR RUN_ID
writes docs/report.png (the HTML report in headless Chromium) and docs/show.svg (`ecdysis show`).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rich.console import Console
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from ecdysis.cli import views
from ecdysis.report.data import load_run
from ecdysis.report.html import write_report
from ecdysis.store import RunStore

HERE = Path(__file__).parent


def main(run_dir: str, run_id: str) -> None:
    store = RunStore(run_dir)
    report = write_report(store, run_id, Path(tempfile.mkdtemp()) / "report.html")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1500"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(report.as_uri())
        driver.save_screenshot(str(HERE / "report.png"))
    finally:
        driver.quit()
    console = Console(record=True, width=140, file=open("/dev/null", "w"))  # noqa: SIM115
    views.training_overview(console, load_run(store, run_id))
    console.save_svg(str(HERE / "show.svg"), title=f"ecdysis show {run_id}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
