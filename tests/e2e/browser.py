"""Headless Chromium for the dashboard tests: Debian's `chromium` and `chromium-driver`, driven
by Selenium. `make test` installs them when they are missing and apt is there (as root); when
they are still missing, the tests skip and say why."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)
# How long a page may take to show what a test waits for (a bound, never a measurement).
WAIT_S = 30.0


def find_chromium() -> tuple[str, str] | str:
    """(browser, driver) paths, or why there are none."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = next((p for p in map(shutil.which, DRIVERS) if p), None)
    if browser and driver:
        return browser, driver
    missing = [name for name, found in (("chromium", browser), ("chromium-driver", driver))
               if not found]  # fmt: skip
    how = "`make test` installs them with apt as root" if shutil.which("apt-get") else "no apt"
    return (
        f"no {' and no '.join(missing)} on PATH ({how}; apt-get install chromium chromium-driver)"
    )


def start_chromium(
    browser: str, driver: str, *, width: int = 1280, height: int = 900
) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--force-device-scale-factor=1",
                "--disable-extensions", "--no-first-run", "--lang=en-US"):  # fmt: skip
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium refuses to run its sandbox as root
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def wait_for(driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], object]) -> object:
    # The live page replaces its elements while it refreshes: a stale one is looked up again.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=ignored).until(
        condition
    )


def screenshot(driver: webdriver.Chrome, path: Path, *, width: int = 1280) -> Path:
    """The whole page, at `width` CSS pixels (a phone: 390)."""
    driver.set_window_size(width, 900)
    time.sleep(0.2)  # let the layout settle at the new width before measuring it
    height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
    )
    driver.set_window_size(width, min(int(height) + 120, 6000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)
    return path


# What a person could not read at the window's width: an element cut off past the right edge
# (also inside a scrolling box), a chart label drawn smaller than MIN_LABEL_PX, or two of a
# chart's time labels on top of each other.
LAYOUT_PROBLEMS = """
const width = document.documentElement.clientWidth, minPx = arguments[0], problems = [];
const shown = (e) => { const r = e.getBoundingClientRect(); return r.width > 1 && r.height > 1; };
for (const e of document.querySelectorAll("main *")) {
  if (!shown(e) || e.closest("svg") && e.tagName.toLowerCase() !== "svg") continue;
  const r = e.getBoundingClientRect();
  const name = `${e.tagName.toLowerCase()}.${e.className.baseVal ?? e.className}`;
  if (r.right > width + 1) problems.push(`${name} ends at ${Math.round(r.right)} px`);
}
for (const chart of document.querySelectorAll("svg.plot")) {
  const labels = [...chart.querySelectorAll("text.axis")].filter(shown);
  for (const t of labels) {
    const h = t.getBoundingClientRect().height;
    if (h < minPx) problems.push(`${chart.id} label "${t.textContent}" is ${h.toFixed(1)} px high`);
  }
  const xs = labels.filter((t) => t.getAttribute("text-anchor") === "middle")
    .map((t) => t.getBoundingClientRect()).sort((a, b) => a.left - b.left);
  for (let i = 1; i < xs.length; i++) {
    if (xs[i].left < xs[i - 1].right) problems.push(`${chart.id}: time labels overlap`);
  }
}
return problems;
"""
MIN_LABEL_PX = 10.0


def layout_problems(driver: webdriver.Chrome, *, width: int) -> list[str]:
    """`LAYOUT_PROBLEMS` of the current page at `width` CSS pixels (a phone: 390)."""
    driver.set_window_size(width, 900)
    time.sleep(0.2)  # let the layout settle at the new width before measuring it
    problems: list[str] = driver.execute_script(LAYOUT_PROBLEMS, MIN_LABEL_PX)
    driver.set_window_size(1280, 900)
    return problems
