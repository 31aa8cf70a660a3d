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
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from helpers.errors import ChildProcessFailed

__all__ = ["ChildResult", "answer", "child_env", "run_json", "start_json"]

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
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _command(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]


def run_json(module: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
             timeout: float = 300) -> ChildResult:
    """Run ``python -m module args`` in a fresh process and return its JSON answer."""
    try:
        proc = subprocess.run(_command(module, args), env=dict(env or os.environ),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (
            err.stderr or "")
        return ChildResult(None, -signal.SIGKILL, stderr, timed_out=True)
    return ChildResult(_parse(proc.stdout), proc.returncode, proc.stderr)


def start_json(module: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None
               ) -> subprocess.Popen:
    """Start ``python -m module args`` and leave it running (it answers on stdout and waits on
    stdin); read the answer with :func:`read_answer`."""
    return subprocess.Popen(_command(module, args), env=dict(env or os.environ),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def read_answer(proc: subprocess.Popen) -> ChildResult:
    """The first JSON line a :func:`start_json` child prints (the child keeps running)."""
    line = proc.stdout.readline()
    data = _parse(line) if line else None
    if data is None:
        proc.wait(timeout=30)
        return ChildResult(None, proc.returncode, proc.stderr.read())
    return ChildResult(data, 0, "")


def answer(data) -> None:
    """In a child: print the answer as one JSON line and flush."""
    print(json.dumps(data), flush=True)
