"""A JupyterLab server for the browser tests: a private root, a free port, a fixed token, and a
stop() that leaves no process behind.

Everything lives under one temporary folder, ``root``: the notebooks JupyterLab serves (copies,
so the committed ones stay untouched), its config, runtime (kernel connection files), user
settings and workspaces, and Chromium's profile. Every process the tests start therefore has
``root`` on its command line, which is how stop() finds stragglers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil

TOKEN = "jax-device-kit-browser-tests"
JUPYTER = Path(sys.executable).with_name("jupyter")

# JupyterLab user settings: every cell in the DOM (JupyterLab 4 otherwise renders off-screen
# cells lazily), no news or update checks (the network is closed), no toasts over the widgets.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}


def copy_notebooks(sources, dest: Path) -> list[Path]:
    """Copy notebooks with outputs and execution counts cleared, so whatever the browser shows
    afterwards comes from this run. Returns the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    copies = []
    for src in sources:
        nb = nbformat.read(src, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, dest / Path(src).name)
        copies.append(dest / Path(src).name)
    return copies


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """``Lab(root).start()`` serves ``root/notebooks``; ``url(path)`` adds the token."""

    def __init__(self, root: Path, log_path: Path):
        self.root = Path(root)
        self.notebooks = self.root / "notebooks"
        self.log_path = Path(log_path)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, path: str = "lab") -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={TOKEN}"

    def start(self, timeout: float = 120) -> Lab:
        for name, values in SETTINGS.items():
            path = self.root / "user-settings" / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ,
                   JUPYTER_CONFIG_DIR=str(self.root / "config"),
                   JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(self.root / "user-settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.root / "workspaces"))
        cmd = [str(JUPYTER), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={self.notebooks}",
               "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp, for the commands
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            try:
                urllib.request.urlopen(self.url("api/status"), timeout=5).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s; "
                           f"see {self.log_path}")

    def leftovers(self) -> list[psutil.Process]:
        """Live processes with ``root`` on their command line (server, kernels, Chromium)."""
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and str(self.root) in " ".join(p.info["cmdline"] or ()):
                    found.append(p)
            except psutil.Error:
                pass
        return found

    def stop(self) -> list[str]:
        """Shut the server down (it stops its kernels), then kill whatever is still there.
        Returns a description of each process that had to be killed (empty when all went
        cleanly). Safe to call twice."""
        if self.proc is None:
            return []
        family = []
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            pass
        try:  # the server's own shutdown: kernels first, then itself
            req = urllib.request.Request(self.url("api/shutdown"), method="POST")
            urllib.request.urlopen(req, timeout=10).close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own process group
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        killed = []
        for p in {q.pid: q for q in family + self.leftovers()}.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    killed.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                    p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(family, timeout=10)
        self.proc = None
        return killed

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

