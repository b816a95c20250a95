"""The admin in a real browser: headless Chromium drives the example project's runserver.

Log in, open the dead letters, requeue one, find it pending in the jobs list, and see the
counts change. A screenshot of each page is saved under artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.example import example_env, manage
from tests.spawn import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):  # pragma: no cover
    pytest.skip("apt-get install chromium chromium-driver", allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def site(example_database: str) -> Iterator[str]:
    """The example project, migrated, with the demo's jobs worked, served by runserver."""
    environment = {
        **example_env(example_database),
        "DJANGO_SUPERUSER_PASSWORD": "browse-me",
        "DJANGO_DEBUG": "1",  # runserver serves the admin's static files
    }
    manage(example_database, "migrate", "--verbosity", "0")
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", "admin",
         "--email", "admin@example.invalid"],
        cwd=ROOT, env=environment, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    manage(example_database, "demo", "--timeout", "90")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/admin/login/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shoot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def dead_count(driver: WebDriver, queue: str) -> int:
    row = driver.find_element(By.CSS_SELECTOR, f'tr.pgjobs-queue[data-queue="{queue}"]')
    return int(row.find_element(By.CSS_SELECTOR, "td.dead").text.replace(",", ""))


def test_requeue_a_dead_letter_in_the_browser(site: str, browser: WebDriver) -> None:
    driver = browser
    wait = WebDriverWait(driver, 15)
    driver.get(f"{site}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys("browse-me")
    shoot(driver, "01-login")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(expected_conditions.title_contains("Site administration"))
    shoot(driver, "02-index")

    driver.get(f"{site}/admin/django_pgjobs/deadjob/?queue=demo")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "pgjobs-glance")))
    before = dead_count(driver, "demo")
    assert before == 4
    shoot(driver, "03-dead-letters")
    first = driver.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
    job_id = first.find_element(By.CSS_SELECTOR, "th a, td.field-id a").text
    first.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("requeue")
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".messagelist li"))
    )
    assert re.search(r"1 job requeued", message.text)
    assert dead_count(driver, "demo") == before - 1
    shoot(driver, "04-requeued")

    driver.get(f"{site}/admin/django_pgjobs/job/?state__exact=pending")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "result_list")))
    ids = [
        a.text
        for a in driver.find_elements(
            By.CSS_SELECTOR, "#result_list th a, #result_list td.field-id a"
        )
    ]
    assert job_id in ids
    row = driver.find_element(By.CSS_SELECTOR, 'tr.pgjobs-queue[data-queue="demo"]')
    assert int(row.find_element(By.CSS_SELECTOR, "td.runnable").text) == 1
    shoot(driver, "05-jobs-pending")

    driver.get(f"{site}/admin/django_pgjobs/job/{job_id}/change/")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "content")))
    assert Path(SCREENSHOTS).exists()
    shoot(driver, "06-job-detail")
