"""One way to run the kit's child processes, and one way for a child to answer.

The kit runs several things in a fresh process: settings JAX reads only at start (doctor in a
child, the allocator settings), loads that may run out of memory (the OOM reproduction), loads
measured one at a time (helpers.loading). They all go through here:

- the parent builds the child's environment with :func:`child_env` (this process's, with
  overrides; ``None`` removes a variable) and runs ``python -m <module> <args>`` with
  :func:`run_json` (or :func:`start_json` for a child that keeps running);
- the child prints its answer as one JSON line with :func:`answer`; it is the last line of
  its stdout that starts with ``{`` or ``[``, so stray prints before it do no harm;
- a child that dies (a crash, a kill, an abort) is a :class:`ChildResult` with ``data=None``
  and the end of its stderr, never an exception in the parent unless asked for.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from helpers.errors import ChildProcessFailed

__all__ = ["ChildResult", "answer", "child_env", "finish", "read_answer", "run_json",
           "start_json"]

TAIL_LINES = 12


def child_env(overrides: Mapping[str, str | None] | None = None, *,
              drop: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment without ``drop``, with ``overrides`` (None removes)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


@dataclass(frozen=True)
class ChildResult:
    data: dict | list | None  # the child's JSON answer; None when it gave none
    returncode: int  # negative: killed by that signal (-6 abort, -9 kill); None never
    stderr: str
    timed_out: bool = False

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-TAIL_LINES:])

    def describe_failure(self) -> str:
        """One paragraph: how the child ended and the end of its stderr."""
        if self.timed_out:
            how = "did not finish in time and was killed"
        elif self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            how = f"was killed by {name}"
        else:
            how = f"exited with {self.returncode}"
        tail = self.stderr_tail
        return f"the child process {how}" + (f"; its stderr ends with:\n{tail}" if tail else "")

    def require(self, what: str):
        """The answer, or ChildProcessFailed saying ``what`` failed and how."""
        if self.data is None:
            raise ChildProcessFailed(f"{what}: {self.describe_failure()}")
        return self.data


def _parse(stdout: str):
    """The last line that is a JSON object or list (earlier stray prints are skipped)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _command(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_json(module: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
             timeout: float = 300) -> ChildResult:
    """Run ``python -m module args`` in a fresh process and return its JSON answer. Never
    raises for what the child does; a child that cannot even be started (no memory to fork)
    is a failed result too."""
    try:
        proc = subprocess.run(_command(module, args),
                              env=dict(os.environ if env is None else env),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:  # killed and reaped by subprocess.run
        return ChildResult(_parse(_text(err.stdout)), -signal.SIGKILL, _text(err.stderr),
                           timed_out=True)
    except OSError as err:
        return ChildResult(None, -1, f"could not start the child process: {err}")
    return ChildResult(_parse(proc.stdout), proc.returncode, proc.stderr)


def start_json(module: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None
               ) -> subprocess.Popen:
    """Start ``python -m module args`` and leave it running (it answers on stdout, then waits
    for a line on stdin); read the answer with :func:`read_answer`. Its stderr goes to a
    temporary file, so a chatty child can never block on a full pipe."""
    stderr = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(_command(module, args), env=dict(os.environ if env is None else env),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            bufsize=0)  # unbuffered bytes: select() then sees every line
    proc.kit_stderr = stderr  # read by read_answer / finish
    return proc


def _stderr_of(proc: subprocess.Popen) -> str:
    f = getattr(proc, "kit_stderr", None)
    if f is None:
        return ""
    f.flush()
    f.seek(0)
    return f.read()


def read_answer(proc: subprocess.Popen, *, timeout: float = 300) -> ChildResult:
    """The first JSON line a :func:`start_json` child prints (stray lines before it are
    skipped); the child keeps running. A child that exits or stays silent for ``timeout``
    seconds is killed and reported, never waited on forever."""
    deadline = time.monotonic() + timeout
    pending = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                data = _parse(line.decode(errors="replace"))
                if data is not None:
                    return ChildResult(data, 0, "")
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                proc.kill()
                proc.wait()
                return ChildResult(None, -signal.SIGKILL, _stderr_of(proc), timed_out=True)
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:  # EOF: the child ended without an answer
                proc.wait()
                return ChildResult(_parse(pending.decode(errors="replace")), proc.returncode,
                                   _stderr_of(proc))
            pending += chunk


def finish(proc: subprocess.Popen, *, timeout: float = 60) -> None:
    """Tell a :func:`start_json` child to end (a line on stdin) and reap it; kill it if it
    does not end within ``timeout`` seconds."""
    try:
        proc.communicate(b"\n", timeout=timeout)
    except (subprocess.TimeoutExpired, BrokenPipeError, ValueError):
        proc.kill()
        proc.wait()
    finally:
        f = getattr(proc, "kit_stderr", None)
        if f is not None:
            f.close()


def answer(data) -> None:
    """In a child: print the answer as one JSON line and flush."""
    print(json.dumps(data), flush=True)
