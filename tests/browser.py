"""Headless Chromium (Debian's `chromium` and `chromium-driver`) driven by Selenium, for the
pages sv draws: the trace report and the server's dashboard.

Without a browser the tests skip, saying so; under CI (CI=true) a missing browser fails them
instead, since .ci/run installs one and they must really run there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WINDOW = (1100, 900)
# When set, the screenshots also go there (the README's pictures: docs/).
SCREENSHOT_DIR_ENV = "SV_SCREENSHOT_DIR"


def find_browser() -> tuple[str, str]:
    """(browser, driver) paths, or skip (fail under CI) naming what is missing."""
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        missing = " and ".join(
            what for what, found in (("chromium", browser), ("chromedriver", driver)) if not found
        )
        reason = (
            f"no headless browser: {missing} not on PATH (apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must have one (.ci/run installs it)")
        pytest.skip(reason)
    return browser, driver


def open_browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = find_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    folder = os.environ.get(SCREENSHOT_DIR_ENV)
    if folder:
        shutil.copy(path, Path(folder) / name)
    return path
