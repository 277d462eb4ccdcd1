"""Headless Chromium driven through WebDriver (selenium + Debian's chromium
and chromium-driver, which test.sh installs), for the console tests and the
console benchmark."""

import os
import shutil
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Screenshots of the console tests (ignored by git; the README shows copies).
SCREENSHOTS = Path(os.environ.get("ONCELOG_SCREENSHOTS", REPO_ROOT / "target" / "console-screenshots"))


def chromium_paths():
    """(browser, driver) from PATH; raises with the install command if absent."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        raise RuntimeError("headless Chromium is missing: apt-get install chromium chromium-driver "
                           "(test.sh installs them)")
    return browser, driver


def start_chromium(width=1500, height=1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    browser, driver = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--disable-extensions", "--no-first-run",
              "--disable-background-networking", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(30)
    d.set_script_timeout(30)
    return d


def wait_for(driver, predicate, timeout=20.0, what="condition", interval=0.1):
    """Polls predicate(driver) until truthy; raises AssertionError with the
    page's text and console errors when it does not come."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = predicate(driver)
            if v:
                return v
        except Exception as e:  # the element is being replaced by a refresh
            last_exc = e
        time.sleep(interval)
    body = driver.find_element("tag name", "body").text[:3000]
    raise AssertionError(f"timed out after {timeout}s waiting for {what} "
                         f"(last error: {last_exc!r})\nconsole: {browser_errors(driver)}\npage:\n{body}")


def click(driver, css, what="the element"):
    """Finds and clicks `css`, again when a refresh replaced the element
    between the two (a stale element)."""
    def once(d):
        d.find_element("css selector", css).click()
        return True
    wait_for(driver, once, what=f"a click on {what}")


def text_of(driver, css):
    els = driver.find_elements("css selector", css)
    return "\n".join(e.text for e in els)


def browser_errors(driver):
    try:
        return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    except Exception:
        return []


def screenshot(driver, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
