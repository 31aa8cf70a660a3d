"""JupyterLab in Chromium, driven the way a learner does it: open a notebook, Kernel → Restart
Kernel and Run All Cells…, accept the dialog, wait for the kernel to go idle, File → Save.

Opening, saving and closing go through JupyterLab's own commands (``window.jupyterapp``, exposed
with ``--LabApp.expose_app_in_browser``); Restart & Run All goes through the menu and the dialog.
The verdict is read from the file JupyterLab saved (``checks.problems``) and from the page
(widgets that failed to render).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat

from tests.browser import checks

# Chromium as root in a closed network: no sandbox, no GPU, no background connections (the
# network refuses them), a fresh profile (Playwright's persistent context gets one under root).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook in the current tab
WIDGET_FAILURES = ("Error displaying widget", "Loading widget...")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
SETTLE_S = 2.0  # kernel idle and nothing pending for this long: Run All has finished

_STATE_JS = """selector => {
  const panel = document.querySelector(selector);
  if (!panel) return null;
  const prompts = Array.from(panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt'),
                             e => e.textContent.trim());
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {status: indicator && indicator.getAttribute('data-status'),
          pending: prompts.filter(p => p.includes('*')).length,
          counted: prompts.filter(p => /\\d/.test(p)).length};
}"""

_CLOSE_ALL_JS = """async () => {
  const app = window.jupyterapp;
  for (const w of Array.from(app.shell.widgets('main'))) {
    if (w.sessionContext) { try { await w.sessionContext.shutdown(); } catch (e) {} }
    if (w.context) { w.context.model.dirty = false; }
    w.dispose();
  }
}"""


def launch(playwright, executable: str, profile: Path):
    """A headless Chromium context with its profile under ``profile``; returns (context, page)."""
    context = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 1000})
    page = context.pages[0] if context.pages else context.new_page()
    return context, page


def open_lab(page, url: str, timeout_s: float = 120) -> None:
    page.goto(url, timeout=timeout_s * 1000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=timeout_s * 1000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")
    page.wait_for_selector(".jp-DirListing-item", timeout=timeout_s * 1000)


def open_notebook(page, path: str, timeout_s: float = 120) -> None:
    """Open ``path`` (relative to JupyterLab's root) and wait for its kernel to be idle."""
    page.evaluate("async p => { await window.jupyterapp.commands.execute("
                  "'docmanager:open', {path: p}); }", path)
    page.wait_for_function(
        """p => { const w = window.jupyterapp.shell.currentWidget;
                  return !!(w && w.context && w.context.path === p && w.sessionContext
                            && w.sessionContext.session && w.sessionContext.session.kernel
                            && w.sessionContext.session.kernel.status === 'idle'); }""",
        arg=path, timeout=timeout_s * 1000)
    page.wait_for_selector(f"{NOTEBOOK} .jp-Notebook-ExecutionIndicator",
                           timeout=timeout_s * 1000)


def restart_and_run_all(page, timeout_s: float) -> float:
    """Kernel → Restart Kernel and Run All Cells…, accept, wait until every cell has run.
    Returns the seconds from the click on Restart to the kernel going idle for good."""
    page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Restart Kernel and Run All Cells")).click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    start = time.monotonic()
    deadline, quiet_since = start + timeout_s, None
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE_JS, NOTEBOOK)
        done = (state is not None and state["status"] == "idle" and state["pending"] == 0
                and state["counted"] > 0)
        now = time.monotonic()
        if not done:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= SETTLE_S:
            return quiet_since - start
        time.sleep(0.25)
    raise TimeoutError(f"Restart & Run All still running after {timeout_s:.0f} s "
                       f"(last state {state})")


def save(page) -> None:
    """File → Save Notebook, through its command (resolves once the file is written)."""
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")


def widget_failures(page) -> list[str]:
    """Widget outputs the page shows as failed (model not found, or never loaded)."""
    texts = page.locator(f"{NOTEBOOK} .jp-OutputArea-output").all_inner_texts()
    return [f"widget did not render: {t.strip()[:120]!r}" for t in texts
            if any(f in t for f in WIDGET_FAILURES)]


def run_notebook(page, root: Path, path: str, timeout_s: float) -> tuple[list[str], float]:
    """Open, Restart & Run All, save; returns (problems, seconds the run took)."""
    open_notebook(page, path)
    seconds = restart_and_run_all(page, timeout_s)
    save(page)
    found = checks.problems(nbformat.read(root / path, as_version=4))
    return found + widget_failures(page), seconds


def write_notebook(root: Path, name: str, cells) -> str:
    """A notebook in ``root/_checks/`` (never in notebooks/); cells: source or (source, tags).
    Returns its path relative to ``root``."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNELSPEC})
    for cell in cells:
        source, tags = (cell, []) if isinstance(cell, str) else cell
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    path = root / "_checks" / name
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, path)
    return f"_checks/{name}"


def show_first_error(page) -> None:
    """Scroll the first error or stderr output into view (for a failure's screenshot)."""
    first = page.locator(f"{NOTEBOOK} .jp-OutputArea-output"
                         '[data-mime-type="application/vnd.jupyter.stderr"]').first
    if first.count():
        first.scroll_into_view_if_needed(timeout=5000)


def close_all(page) -> None:
    """Dismiss any dialog, shut down every kernel the page started and close every tab."""
    for _ in range(5):
        if not page.locator(".jp-Dialog").count():
            break
        page.keyboard.press("Escape")
        time.sleep(0.2)
    page.evaluate(_CLOSE_ALL_JS)
