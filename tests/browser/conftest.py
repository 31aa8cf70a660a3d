"""Browser tests: JupyterLab 4 in headless Chromium, run by `make test-browser`.

`make test` does not collect this folder (tests/conftest.py lists it in ``collect_ignore``):
these tests need Chromium, a system package, and Playwright, which `make test` does not
install. Without either they stop with the way to get it, never with a skip.

One JupyterLab server and one Chromium serve the whole session (fixtures ``lab`` and
``browser_page``); each test gets the page with no notebook open and leaves it so (``page``):
its kernels shut down, its tabs closed, a screenshot in tests/artifacts/ when it failed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest

from tests.browser import ARTIFACTS, NOTEBOOKS, driver
from tests.browser.lab import Lab, copy_notebooks

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
RUN_ALL_TIMEOUT_S = 300.0  # per notebook; 3-45 s each on a busy 2-core machine
TIMINGS: dict[str, float] = {}  # what each Restart & Run All took, for the summary
KILLED: list[str] = []  # processes the teardown had to kill after the server's own shutdown

HOW_TO_CHROMIUM = (
    f"Chromium not found at {CHROMIUM}. The browser tests drive the system Chromium "
    "(Playwright's own browser download is not used). Install it with "
    "`apt-get install chromium` (Debian, as root), or set CHROMIUM=/path/to/chromium.")


def pytest_configure(config):
    # A CI time limit sends SIGTERM: make it a KeyboardInterrupt, so that the fixtures' teardown
    # still stops JupyterLab, its kernels and Chromium.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if not os.access(CHROMIUM, os.X_OK):
        raise pytest.UsageError(HOW_TO_CHROMIUM)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        raise pytest.UsageError(
            f"Playwright is missing ({err}): `.venv/bin/pip install -e '.[browser]'` "
            "(make test-browser does it).") from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call":
        item.rep_call = report


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("Restart & Run All in JupyterLab (s)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{seconds:6.1f}  {name}")
    if KILLED:
        terminalreporter.section("killed after JupyterLab's shutdown")
        for line in KILLED:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def lab():
    """A JupyterLab server on copies of notebooks/*.ipynb in a temporary root."""
    server = Lab(Path(tempfile.mkdtemp(prefix="jdk-browser-")), ARTIFACTS / "jupyterlab.log")
    copy_notebooks(sorted(NOTEBOOKS.glob("*.ipynb")), server.notebooks)
    try:
        yield server.start()
    finally:
        KILLED.extend(server.stop())
        left = server.leftovers()
        for p in left:
            p.kill()
        server.remove()
        if left:
            pytest.fail(f"processes still running after the teardown: {left}")


@pytest.fixture(scope="session")
def browser_page(lab):
    """Headless Chromium with JupyterLab loaded; closed at the end of the session."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    context = None
    try:
        context, page = driver.launch(playwright, CHROMIUM, lab.root / "chromium-profile")
        page.set_default_timeout(60_000)
        page.errors = []  # uncaught exceptions in the page, for failure messages
        page.on("pageerror", lambda err: page.errors.append(str(err)))
        driver.open_lab(page, lab.url())
        yield page
    finally:  # after a Ctrl+C Playwright's driver is gone too; lab's teardown checks the rest
        if context is not None:
            with contextlib.suppress(PlaywrightError):
                context.close()
        with contextlib.suppress(Exception):  # "Connection closed while reading from the driver"
            playwright.stop()


@pytest.fixture
def page(browser_page, request):
    from playwright.sync_api import Error as PlaywrightError

    browser_page.errors.clear()
    yield browser_page
    report = getattr(request.node, "rep_call", None)
    try:
        if report is not None and report.failed:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            driver.show_first_error(browser_page)
            browser_page.screenshot(path=str(ARTIFACTS / f"failed-{name}.png"))
        driver.close_all(browser_page)
    except PlaywrightError:  # the browser is gone (Ctrl+C reaches Playwright's driver too);
        pass  # lab's teardown still stops the kernels


@pytest.fixture
def run(page, lab):
    """run(path) → (problems, seconds): Restart & Run All of a notebook under the lab root."""
    def run_one(path: str):
        found, seconds = driver.run_notebook(page, lab.notebooks, path, RUN_ALL_TIMEOUT_S)
        TIMINGS[path] = seconds
        return found + [f"uncaught error in the page: {e}" for e in page.errors], seconds
    return run_one
