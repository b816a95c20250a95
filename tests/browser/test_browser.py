"""The admin in a real browser: headless Chromium drives the example project's runserver.

Log in, open the dead letters, requeue one, find it pending in the jobs list, and see the
counts change. A screenshot of each page is saved under artifacts/screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser.conftest import ACTION_MESSAGE, SCREENSHOTS, shoot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]


def open_glance(driver: WebDriver) -> None:
    """Unfold the glance above a list, as a person does: a click on its line."""
    glance = driver.find_element(By.ID, "pgjobs-glance")
    if glance.get_attribute("open") is None:
        glance.find_element(By.CSS_SELECTOR, "summary strong").click()


def dead_count(driver: WebDriver, queue: str) -> int:
    open_glance(driver)
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
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ACTION_MESSAGE))
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
    open_glance(driver)
    row = driver.find_element(By.CSS_SELECTOR, 'tr.pgjobs-queue[data-queue="demo"]')
    assert int(row.find_element(By.CSS_SELECTOR, "td.runnable").text) == 1
    shoot(driver, "05-jobs-pending")

    driver.get(f"{site}/admin/django_pgjobs/job/{job_id}/change/")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "content")))
    assert Path(SCREENSHOTS).exists()
    shoot(driver, "06-job-detail")
