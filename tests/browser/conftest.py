"""The browser tests' fixtures: the example project served by runserver, headless
Chromium, and screenshots saved under artifacts/screenshots/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from django_pgjobs.testing.localdb import free_port
from tests.example import example_env, manage
from tests.spawn import ROOT

SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):  # pragma: no cover
    pytest.skip("apt-get install chromium chromium-driver", allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

#: The widths every console screenshot is taken at (the issue's 1,280 and 1,920 px).
WIDTHS = (1280, 1920)


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
    server, url = serve(environment)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(10)


def serve(environment: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """`runserver` on a free port, answering; on another port when the one picked was
    taken before the server bound it (another process of the CI picked it too)."""
    deadline = time.monotonic() + 90  # a loaded CI starts Django slowly
    while True:
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        while server.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/admin/login/", timeout=5)
                return server, url
            except OSError:
                if time.monotonic() > deadline:
                    server.terminate()
                    server.wait(10)
                    raise
                time.sleep(0.2)
        if time.monotonic() > deadline:
            raise RuntimeError(f"runserver exited with {server.returncode} on every port tried")


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
        "--hide-scrollbars",  # the screenshots go into the docs: the page, not the window
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


def shoot_widths(driver: WebDriver, name: str, height: int = 1000) -> None:
    """A screenshot of the page at each of WIDTHS, as name-1280.png and name-1920.png."""
    for width in WIDTHS:
        driver.set_window_size(width, height)
        time.sleep(0.3)  # let the layout settle
        shoot(driver, f"{name}-{width}")
    driver.set_window_size(1400, 1000)


#: What an action says, in Django's message list: not the console's warnings above a
#: list ("No live worker serves …"), which the page before the action showed too (a wait
#: for any message would find the old page's, then lose it as the new page loads).
ACTION_MESSAGE = "ul.messagelist:not(.pgjobs-warnings) li"
