"""One way to run the kit's child processes, one protocol for what they say.

The kit runs several things in a fresh process: settings JAX reads only at start (the doctor's
probe, the allocator settings), loads that may run out of memory (the OOM reproduction), loads
and steps measured one at a time, the host-memory sampler. They all go through here:

- a child is a function that lives beside its parent, named ``"module:function"``; it takes one
  typed request (a :class:`~helpers._internal.records.Record`, or nothing) and returns one typed
  answer (a record, or a :class:`Reply` with an exit code);
- the parent builds the child's environment with :func:`child_env` (this process's, with
  overrides; ``None`` removes a variable) and runs the function with :func:`run` (or
  :func:`start` for a child that keeps running: it answers, then waits for a line on stdin);
- :func:`main` is the one entry point, ``python -m helpers._internal.child module:function
  REQUEST_JSON``: it rebuilds the request record from the function's annotation, calls it and
  prints the answer as one JSON line (the last line of stdout that starts with ``{`` or ``[``,
  so stray prints before it do no harm);
- :func:`run_group` runs several children at once that need each other (the processes of one
  ``jax.distributed`` job): when one fails, or the time is up, every other is killed too, since
  the rest would wait for it;
- a child that dies, hangs or gives no answer (a crash, a kill, an XLA abort) is a
  :class:`ChildResult` with ``data=None`` and the end of its stderr; :meth:`ChildResult.answer`
  turns that into :class:`~helpers.errors.ChildProcessFailed` (how it ended: exit code or
  signal, and the stderr tail), the one way a parent learns that its child failed.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from helpers._internal.records import from_dict, to_json_value
from helpers.errors import BadInputError, ChildProcessFailed

__all__ = ["ChildResult", "Reply", "answer", "call", "child_env", "finish", "main", "read_answer",
           "request_type", "resolve", "run", "run_group", "start"]

R = TypeVar("R")
ENTRY = "helpers._internal.child"

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
    """How a child ended: its JSON answer (None when it gave none), exit code, stderr."""

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

    def require(self, what: str) -> dict | list:
        """The answer as plain data, or ChildProcessFailed saying ``what`` failed and how."""
        if self.data is None:
            raise ChildProcessFailed(f"{what}: {self.describe_failure()}", result=self)
        return self.data

    def answer(self, cls: type[R], what: str) -> R:
        """The answer as a record of ``cls``, or ChildProcessFailed saying ``what`` failed and
        how (also for an answer that is not a ``cls``)."""
        data = self.require(what)
        try:
            return from_dict(cls, data)
        except (TypeError, KeyError, ValueError) as err:
            raise ChildProcessFailed(f"{what}: the child's answer is not a {cls.__name__} "
                                     f"({type(err).__name__}: {err})", result=self) from None


def _parse(stdout: str):
    """The last line that is a JSON object or list (earlier stray prints are skipped)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _command(target: str, request: Any) -> list[str]:
    if ":" not in target:
        raise BadInputError(f"a child is named 'module:function', got {target!r}")
    return [sys.executable, "-m", ENTRY, target, json.dumps(to_json_value(request))]


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run(target: str, request: Any = None, *, env: Mapping[str, str] | None = None,
        timeout: float = 300) -> ChildResult:
    """Run the child function ``target`` ("module:function") on ``request`` in a fresh process
    and return its answer. Never raises for what the child does; a child that cannot even be
    started (no memory to fork) is a failed result too."""
    try:
        proc = subprocess.run(_command(target, request),
                              env=dict(os.environ if env is None else env),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:  # killed and reaped by subprocess.run
        return ChildResult(_parse(_text(err.stdout)), -signal.SIGKILL, _text(err.stderr),
                           timed_out=True)
    except OSError as err:
        return ChildResult(None, -1, f"could not start the child process: {err}")
    return ChildResult(_parse(proc.stdout), proc.returncode, proc.stderr)


def run_group(target: str, requests: Sequence[Any], *, envs: Sequence[Mapping[str, str]],
              timeout: float = 120, poll: float = 0.05) -> list[ChildResult]:
    """Run one child per request, all at once, and return their results in order. The
    children need each other: when one ends without an answer, or after ``timeout`` seconds,
    the others are killed (reported as killed by SIGKILL, ``timed_out`` when time ran out).
    Every child is reaped and its files closed before this returns, also when the caller is
    interrupted. Output goes to temporary files, so no child can block on a full pipe."""
    if len(requests) != len(envs):
        raise BadInputError(f"one environment per request: {len(requests)} requests, "
                            f"{len(envs)} environments")
    procs: list = []  # a Popen, or the OSError that stopped one from starting
    files: list = []
    timed_out = False
    try:
        for request, env in zip(requests, envs, strict=True):
            out = tempfile.TemporaryFile("w+", errors="replace")
            err = tempfile.TemporaryFile("w+", errors="replace")
            files.append((out, err))
            try:
                procs.append(subprocess.Popen(_command(target, request), env=dict(env),
                                              stdin=subprocess.DEVNULL, stdout=out, stderr=err))
            except OSError as error:
                procs.append(error)
                break
        deadline = time.monotonic() + timeout
        while len(procs) == len(requests) and all(isinstance(p, subprocess.Popen) for p in procs):
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(poll)
        _end(procs)
        results = []
        for i in range(len(requests)):
            p = procs[i] if i < len(procs) else None
            if not isinstance(p, subprocess.Popen):
                why = (f"could not start the child process: {p}" if p is not None else
                       "not started: an earlier child of the group could not be started")
                results.append(ChildResult(None, -1, why))
                continue
            out, err = files[i]
            out.seek(0)
            err.seek(0)
            results.append(ChildResult(_parse(out.read()), p.returncode, err.read(),
                                       timed_out=timed_out and p.returncode == -signal.SIGKILL))
        return results
    finally:  # whatever happened above (an interrupt too): nothing of ours keeps running
        _end(procs)
        for pair in files:
            for f in pair:
                f.close()


def _end(procs: list) -> None:
    """Kill every child still running, then reap them all."""
    for p in procs:
        if isinstance(p, subprocess.Popen) and p.poll() is None:
            p.kill()
    for p in procs:
        if isinstance(p, subprocess.Popen):
            p.wait()


def start(target: str, request: Any = None, *, env: Mapping[str, str] | None = None
          ) -> subprocess.Popen:
    """Start the child function ``target`` on ``request`` and leave it running (it answers on
    stdout, then waits for a line on stdin); read the answer with :func:`read_answer`, end it
    with :func:`finish`. Its stderr goes to a temporary file, so a chatty child can never
    block on a full pipe."""
    stderr = tempfile.TemporaryFile("w+", errors="replace")
    proc = subprocess.Popen(_command(target, request), env=dict(os.environ if env is None else env),
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
    """The first JSON line a :func:`start` child prints (stray lines before it are
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
    """Tell a :func:`start` child to end (a line on stdin) and reap it; kill it if it
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


def answer(data: Any) -> None:
    """In a child: print the answer (a record or plain data) as one JSON line and flush."""
    print(json.dumps(to_json_value(data)), flush=True)


@dataclass(frozen=True)
class Reply:
    """A child's answer with the exit code its process should end with (default 0)."""

    answer: Any
    exit_code: int = 0


def request_type(fn) -> Any:
    """The type of ``fn``'s one parameter (its request), None when it takes none."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return None
    return typing.get_type_hints(fn).get(params[0].name, Any)


def resolve(target: str):
    """The function a child's name ``"module:function"`` names, imported."""
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def call(fn, data: Any) -> Any:
    """Call a child function on its request, rebuilt from plain ``data``: the record its one
    parameter is annotated with, else ``data`` as it is; with nothing when it takes nothing
    (a TypeError when it takes nothing and ``data`` is not None). A builtin, whose signature
    cannot be read, gets ``data``."""
    try:
        kind = request_type(fn)
    except (TypeError, ValueError):  # a builtin: no signature to read
        kind = Any
    if kind is None:
        if data is not None:
            raise TypeError(f"{fn.__name__} takes no request, got {data!r}")
        return fn()
    if isinstance(kind, type) and data is not None and hasattr(kind, "__dataclass_fields__"):
        data = from_dict(kind, data)
    return fn(data)


def main(argv: Sequence[str] | None = None) -> int:
    """The one entry point of every child: ``module:function REQUEST_JSON``."""
    target, payload = (sys.argv[1:] if argv is None else list(argv))[:2]
    out = call(resolve(target), json.loads(payload))
    reply = out if isinstance(out, Reply) else Reply(out)
    if reply.answer is not None:
        answer(reply.answer)
    return reply.exit_code


if __name__ == "__main__":  # run the module proper, so its classes (Reply) are the ones used
    from helpers._internal import child as _this

    sys.exit(_this.main())
