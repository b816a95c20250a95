"""The operator's console in a real browser (headless Chromium, the example project).

The dashboard's numbers change while jobs are enqueued and run, without a reload; a
started worker appears in the registry and a killed one turns gone; search, the reason
filter, and the actions from the lists and from the object pages. Each screen is shot
at 1,280 and 1,920 px under artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser.conftest import ACTION_MESSAGE, shoot_widths
from tests.example import example_env, manage
from tests.spawn import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]


def log_in(driver: WebDriver, site: str) -> None:
    driver.get(f"{site}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys("browse-me")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(driver, 15).until(expected_conditions.title_contains("Site administration"))


def eventually(condition: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.25)


def text_of(driver: WebDriver, selector: str) -> str:
    """The text of an element, read in one step (the refresh replaces elements)."""
    script = "var e = document.querySelector(arguments[0]); return e ? e.textContent : '';"
    return str(driver.execute_script(script, selector)).strip()


def cell(driver: WebDriver, queue: str, field: str) -> str:
    return text_of(driver, f'#pgjobs-queues tr[data-queue="{queue}"] td.{field}')


def enqueue_digests(database: str, count: int) -> None:
    manage(
        database,
        "shell",
        "-c",
        "from example_project.demo.jobs import send_digest\n"
        f"for n in range({count}): send_digest.enqueue(user=f'u{{n}}@example.invalid')",
    )


@pytest.fixture
def worker_process(example_database: str) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runjobs", "--queue", "demo", "--concurrency", "2"],
            cwd=ROOT,
            env=example_env(example_database),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait(10)


def test_the_dashboard_follows_the_queue_and_the_workers_without_a_reload(
    site: str,
    browser: WebDriver,
    example_database: str,
    worker_process: Callable[[], subprocess.Popen[bytes]],
) -> None:
    driver = browser
    log_in(driver, site)
    assert "/admin/django_pgjobs/dashboard/" in driver.page_source  # linked from the index
    driver.get(f"{site}/admin/django_pgjobs/dashboard/")
    WebDriverWait(driver, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "pgjobs-dashboard"))
    )
    assert cell(driver, "demo", "runnable") == "0"
    driver.execute_script("window.pgjobsNotReloaded = true;")

    enqueue_digests(example_database, 30)
    eventually(lambda: cell(driver, "demo", "runnable") == "30", what="30 runnable shown")
    assert driver.execute_script("return window.pgjobsNotReloaded === true;")
    assert "Updated at" in text_of(driver, "#pgjobs-refreshed")
    shoot_widths(driver, "07-dashboard-backlog")
    driver.get(f"{site}/admin/django_pgjobs/job/?queue=demo")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 30
    # Issue 29: the first row is on the first screen (the glance folds to a line).
    top = driver.execute_script(
        "return document.querySelector('#result_list tbody tr').getBoundingClientRect().top;"
    )
    assert top < driver.execute_script("return window.innerHeight;"), top
    shoot_widths(driver, "15-jobs")
    driver.find_element(By.LINK_TEXT, "dashboard").click()
    WebDriverWait(driver, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "pgjobs-dashboard"))
    )
    driver.execute_script("window.pgjobsNotReloaded = true;")

    worker = worker_process()
    eventually(lambda: cell(driver, "demo", "runnable") == "0", what="the backlog drained")
    eventually(
        lambda: text_of(driver, ".pgjobs-live-count") == "1",
        what="one live worker",
    )
    assert driver.execute_script("return window.pgjobsNotReloaded === true;")
    assert "done: " in text_of(driver, "#pgjobs-chart-throughput")
    shoot_widths(driver, "08-dashboard")
    # The refresh control: off is kept across a reload, and stops the updates.
    Select(driver.find_element(By.ID, "pgjobs-every")).select_by_value("0")
    assert text_of(driver, "#pgjobs-refreshed") == "Refresh is off."
    driver.refresh()
    WebDriverWait(driver, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "pgjobs-every"))
    )
    assert Select(driver.find_element(By.ID, "pgjobs-every")).first_selected_option.text == "off"
    time.sleep(7)  # past the 5 s refresh it would have had: none came ("Updated at")
    assert text_of(driver, "#pgjobs-refreshed") == ""
    Select(driver.find_element(By.ID, "pgjobs-every")).select_by_value("5")

    # Issue 29, item 12: the span and the queue are chosen from selects; the page, its
    # charts and tables, and its refreshes follow them.
    eventually(
        lambda: bool(driver.find_elements(By.CSS_SELECTOR, "#pgjobs-latency-kinds .pgjobs-kind")),
        what="the worker's histograms written",
    )
    Select(driver.find_element(By.ID, "pgjobs-span")).select_by_value("week")
    WebDriverWait(driver, 15).until(expected_conditions.url_contains("span=week"))
    Select(driver.find_element(By.ID, "pgjobs-scope-queue")).select_by_value("demo")
    WebDriverWait(driver, 15).until(expected_conditions.url_contains("queue=demo"))
    assert "last 7 days" in text_of(driver, "#pgjobs-dashboard .pgjobs-dashboard-charts")
    lines = "#pgjobs-chart-latency polyline, #pgjobs-chart-latency circle"
    assert driver.find_elements(By.CSS_SELECTOR, lines)
    assert [
        row.get_attribute("data-queue")
        for row in driver.find_elements(By.CSS_SELECTOR, ".pgjobs-latency-queue")
    ] == ["demo"]
    eventually(lambda: "Updated at" in text_of(driver, "#pgjobs-refreshed"), what="a refresh")
    assert "jobs per hour, last 7 days" in (
        driver.find_element(By.CSS_SELECTOR, "#pgjobs-chart-throughput svg").get_attribute(
            "aria-label"
        )
    )
    assert driver.find_elements(By.CSS_SELECTOR, lines), "the refresh kept the span's chart"
    shoot_widths(driver, "18-dashboard-week")

    driver.get(f"{site}/admin/django_pgjobs/worker/")
    live = driver.find_elements(By.CSS_SELECTOR, "#result_list .pgjobs-worker-live")
    assert len(live) == 1
    shoot_widths(driver, "09-workers")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)

    def gone() -> bool:
        driver.refresh()
        return bool(driver.find_elements(By.CSS_SELECTOR, "#result_list .pgjobs-worker-gone"))

    eventually(gone, timeout=40, what="the killed worker shown gone")
    shoot_widths(driver, "10-workers-gone")


def test_search_filters_and_every_action_in_the_browser(site: str, browser: WebDriver) -> None:
    driver = browser
    wait = WebDriverWait(driver, 15)
    log_in(driver, site)

    def message() -> str:
        found = wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ACTION_MESSAGE))
        )
        return found.text

    def ids() -> list[str]:
        return [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#result_list th.field-id a")]

    # Search the dead letters by the start of a kind, then filter by reason category.
    driver.get(f"{site}/admin/django_pgjobs/deadjob/")
    box = driver.find_element(By.ID, "searchbar")
    box.send_keys("example_project.demo.jobs.rebuild")
    box.submit()
    wait.until(expected_conditions.url_contains("q=example_project.demo.jobs.rebuild"))
    rebuilds = ids()
    assert rebuilds and all(
        "rebuild" in kind.text
        for kind in driver.find_elements(By.CSS_SELECTOR, "#result_list td.field-kind_of")
    )
    shoot_widths(driver, "11-dead-search")
    driver.get(f"{site}/admin/django_pgjobs/deadjob/")
    driver.find_element(By.LINK_TEXT, "max attempts exceeded").click()
    wait.until(expected_conditions.url_contains("reason=max_attempts"))
    assert ids()
    # Issue 29: the chosen item's marker covered the end of the item before it.
    overlap = driver.execute_script(
        "const chosen = document.querySelector('#changelist-filter li.selected:not(:first-child)');"
        "const before = chosen.previousElementSibling.getBoundingClientRect();"
        "return before.right - chosen.getBoundingClientRect().left;"
    )
    assert overlap <= 0, overlap
    shoot_widths(driver, "12-dead-by-reason")

    # A dead letter's page leads with the error; its Requeue button.
    first, second = rebuilds[0], rebuilds[1]
    driver.get(f"{site}/admin/django_pgjobs/deadjob/{first}/change/")
    assert (
        "RuntimeError: shard" in driver.find_element(By.CSS_SELECTOR, "pre.pgjobs-traceback").text
    )
    # Issue 29, item 11: its timeline, from the enqueue to its death, each attempt.
    timeline = text_of(driver, "table.pgjobs-timeline")
    assert "enqueued" in timeline and "dead-lettered" in timeline, timeline
    assert "attempt 1" in timeline and "RuntimeError: shard" in timeline, timeline
    # Item 5: an object page's times are exact, to the second, with the time zone.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]", text_of(driver, "#content"))
    shoot_widths(driver, "13-dead-letter-page", height=1200)
    driver.find_element(By.NAME, "pgjobs-requeue").click()
    assert "requeued" in message()
    # Item 8: the requeue is in its timeline, with who did it.
    driver.get(f"{site}/admin/django_pgjobs/job/{first}/change/")
    assert "by admin" in text_of(driver, "table.pgjobs-timeline")

    # The requeued job's page: Run now is not offered to a runnable job... cancel it.
    shoot_widths(driver, "14-job-page")
    driver.find_element(By.NAME, "pgjobs-cancel").click()
    driver.switch_to.alert.accept()
    assert "cancelled (now a dead letter)" in message()

    # The other dead letter: Delete from its page.
    driver.get(f"{site}/admin/django_pgjobs/deadjob/{second}/change/")
    driver.find_element(By.NAME, "pgjobs-delete").click()
    driver.switch_to.alert.accept()
    assert "deleted" in message()

    # From the lists: requeue the cancelled one, run it now, then cancel it.
    driver.get(f"{site}/admin/django_pgjobs/deadjob/?q={first}")
    driver.find_element(By.CSS_SELECTOR, "#result_list input.action-select").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("requeue")
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    assert "1 job requeued" in message()
    driver.get(f"{site}/admin/django_pgjobs/job/?q={first}")
    assert ids() == [first]
    driver.find_element(By.CSS_SELECTOR, "#result_list input.action-select").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("run_now")
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    assert "1 job set to run now" in message()
    driver.find_element(By.CSS_SELECTOR, "#result_list input.action-select").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("cancel")
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    wait.until(expected_conditions.title_contains("Cancel jobs?"))
    driver.find_element(By.CSS_SELECTOR, "input[type=submit][value^='Yes']").click()
    assert "1 job cancelled" in message()
    driver.get(f"{site}/admin/django_pgjobs/deadjob/")
    # Item 5: a list's times are relative, the exact time on hover.
    died = driver.find_element(By.CSS_SELECTOR, "#result_list td.field-died time")
    assert "ago" in died.text and re.search(r":\d\d:\d\d ", died.get_attribute("title") or "")
    shoot_widths(driver, "16-dead-letters")
    driver.get(f"{site}/admin/django_pgjobs/schedule/")
    shoot_widths(driver, "17-schedules")
    # Item 7: the example's home page shows the counts as numbers.
    driver.get(f"{site}/")
    assert "Count(" not in driver.find_element(By.TAG_NAME, "body").text


SETUP = """
from django_pgjobs.batches import Callback, batch
from django_pgjobs.models import Worker
from example_project.demo.jobs import send_digest

with batch(on_complete=Callback(send_digest, user="all@example.invalid")) as b:
    for n in range(60):
        b.add(send_digest, user=f"m{n}@example.invalid")
print("BATCH", b.id)
Worker.objects.heartbeat(
    "web-1:4242:ab12", host="web-1", pid=4242, queues=["demo", "maintenance"],
    concurrency=4, version="t", heartbeat_s=3600, running=0, succeeded=0, failed=0,
)
"""


def test_a_batchs_members_and_a_queue_paused_on_one_worker(
    site: str, browser: WebDriver, example_database: str
) -> None:
    """Issue 29, items 9 and 13: a batch's page lists its members, paged, each a link;
    a worker's page pauses one of its queues on it alone, and resumes it."""
    driver = browser
    wait = WebDriverWait(driver, 15)
    batch_id = manage(example_database, "shell", "-c", SETUP).split("BATCH ")[1].split()[0]
    log_in(driver, site)

    driver.get(f"{site}/admin/django_pgjobs/batch/")
    driver.find_element(By.LINK_TEXT, batch_id).click()
    wait.until(expected_conditions.presence_of_element_located((By.ID, "pgjobs-batch-members")))
    members = driver.find_elements(By.CSS_SELECTOR, "#pgjobs-batch-members tr.pgjobs-member")
    assert len(members) == 50
    assert members[0].find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/change/")
    shoot_widths(driver, "19-batch-page", height=1400)
    driver.find_element(By.CSS_SELECTOR, "#pgjobs-batch-members a.pgjobs-next").click()
    wait.until(expected_conditions.url_contains("after="))
    rest = driver.find_elements(By.CSS_SELECTOR, "#pgjobs-batch-members tr.pgjobs-member")
    assert len(rest) == 10
    rest[0].find_element(By.TAG_NAME, "a").click()  # a member's page links its batch
    wait.until(expected_conditions.presence_of_element_located((By.LINK_TEXT, f"#{batch_id}")))

    driver.get(f"{site}/admin/django_pgjobs/worker/")
    driver.find_element(By.PARTIAL_LINK_TEXT, "web-1:4242:ab12").click()  # the quoted id
    row = '#pgjobs-queues-here tr[data-queue="maintenance"]'
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, row)))
    assert "claiming" in text_of(driver, row)
    driver.find_element(By.CSS_SELECTOR, f"{row} button").click()
    found = wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ACTION_MESSAGE))
    )
    assert "Queue maintenance paused on worker web-1:4242:ab12 alone" in found.text
    assert "paused here by admin since" in text_of(driver, row)
    assert "claiming" in text_of(driver, '#pgjobs-queues-here tr[data-queue="demo"]')
    shoot_widths(driver, "20-worker-page", height=1200)
    driver.find_element(By.CSS_SELECTOR, f"{row} button").click()
    wait.until(lambda d: "claiming" in text_of(d, row))
    driver.get(f"{site}/admin/")  # the admin's log has both, under the worker's id
    assert "web-1:4242:ab12" in text_of(driver, "#recent-actions-module")
