"""The operator's dashboard in Debian's headless chromium, driven by selenium: one browser per
test module, and ``Page``, the browser as an async test sees it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 10.0  # the page polls every second
TOKEN = "dash-s3cret"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """One headless chromium for the module (starting one takes about a second)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the dashboard test needs Debian's chromium and "
                    "chromium-driver (run scripts/system-deps.sh as root)", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # given, so that selenium-manager never looks for one
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1400,1100",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The browser seen from an async test: selenium blocks, and the gateway serving the page
    runs on this event loop, so every browser call goes through a thread."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver = driver
        self.base = base

    async def open(self, path: str) -> str:
        await asyncio.to_thread(self.driver.get, self.base + path)
        return self.driver.current_url

    def _text(self, css: str) -> str | None:
        # read in one script: the page rebuilds its tables every second (no stale elements)
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css)

    async def text(self, css: str) -> str | None:
        return await asyncio.to_thread(self._text, css)

    async def shown(self, css: str) -> bool:
        return await asyncio.to_thread(self.driver.execute_script,
                                       "const e = document.querySelector(arguments[0]); return !!e && !e.hidden;", css)

    async def texts(self, css: str) -> list[str]:
        return await asyncio.to_thread(self.driver.execute_script,
                                       "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);",
                                       css)

    async def until(self, css: str, check: Callable[[str], bool], what: str) -> str:
        """Wait (bounded) until the text of ``css`` passes ``check``; that text."""
        def condition(_driver: WebDriver) -> str | bool:
            text = self._text(css)
            return text if text is not None and check(text) else False

        try:
            return await asyncio.to_thread(WebDriverWait(self.driver, WAIT_S, poll_frequency=0.1).until, condition)
        except TimeoutException:
            raise AssertionError(f"after {WAIT_S} s the page does not show {what}: {css} is {self._text(css)!r} "
                                 f"(status: {self._text('#status')!r})") from None

    async def until_text(self, css: str, expected: str) -> str:
        return await self.until(css, lambda text: text == expected, repr(expected))

    async def fill(self, values: dict[str, str]) -> None:
        def _fill() -> None:
            for css, value in values.items():
                field = self.driver.find_element("css selector", css)
                field.clear()
                if value:
                    field.send_keys(value)
        await asyncio.to_thread(_fill)

    async def click(self, css: str) -> None:
        await asyncio.to_thread(lambda: self.driver.find_element("css selector", css).click())
