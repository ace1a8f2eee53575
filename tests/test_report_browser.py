"""A real browser opens a report of a real run: headless Chromium (Debian `chromium` + `chromium-driver`,
installed by `make test`) driven by Selenium. The run: GSM8K tasks, the embedded SmolLM2 as the agent in
the bubblewrap sandbox, one round whose spec is scripted (so a candidate and its diff exist)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BOXED_SPEC

from ecdysis.harness.manifest import set_manifest_value

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SCREENSHOT_DIR = Path(shots) if (shots := os.environ.get("ECDYSIS_SCREENSHOT_DIR")) else None


def cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    made = cli("init", str(tmp / "proj"), "--env", "gsm8k", cwd=tmp)
    assert made.returncode == 0, made.stdout + made.stderr
    manifest = tmp / "proj" / "harness" / "harness.toml"
    manifest.write_text(set_manifest_value(manifest.read_text(), "generation", "max_tokens", 96))
    out = cli("train", "-c", "proj/ecdysis.toml", "--model", "local:smollm2-135m", "--roles-model",
              f"scripted:{json.dumps(BOXED_SPEC)}", "--data-dir", str(data_dir), "--rounds", "1", "--arm", "ecdysis",
              "--set", "train.train_limit=6", "--set", "train.test_limit=4", "--set", 'train.accept_on="train"',
              "--run-dir", "run", cwd=tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = json.loads(cli("runs", "list", "--run-dir", "run", "--json", cwd=tmp).stdout)
    report = tmp / "report.html"
    done = cli("report", runs[0]["id"], "--run-dir", "run", "-o", str(report), cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return report


def test_report_of_a_real_run_renders_in_chromium(real_report: Path, tmp_path: Path) -> None:
    assert CHROMIUM and DRIVER, "chromium and chromedriver are needed (Debian packages chromium, chromium-driver; " \
                                "`make test` installs them)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,2200"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        driver.get(real_report.as_uri())
        assert driver.title.startswith("Ecdysis report")
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        plots = driver.find_elements(By.CSS_SELECTOR, ".plot svg")
        assert len(plots) == 4
        for svg in plots:  # each plot laid out with a size and drawn (matplotlib paths inside)
            assert svg.size["width"] > 200 and svg.size["height"] > 100
            assert len(svg.find_elements(By.CSS_SELECTOR, "path")) > 10
        assert driver.find_elements(By.ID, "round-1")
        assert driver.find_elements(By.CSS_SELECTOR, ".diff .add"), "the round's harness diff is shown"
        links = driver.find_elements(By.CSS_SELECTOR, "a.traj-link")
        assert links, "pattern evidence links to its trajectory"
        target = driver.find_element(By.ID, links[0].get_attribute("href").split("#")[1])
        assert target.get_attribute("open") is None
        driver.execute_script("arguments[0].closest('details').open = true;", links[0])
        links[0].click()
        assert target.get_attribute("open") is not None  # the trajectory opened, turn by turn
        assert target.find_elements(By.CSS_SELECTOR, ".ev-model")
        shot = (SCREENSHOT_DIR or tmp_path) / "report.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.execute_script("window.scrollTo(0, 0)")
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    finally:
        driver.quit()
