"""The one child-process runner and protocol (helpers._internal.child): typed requests and
answers, failures, timeouts, chatty children."""

import os
import textwrap
from dataclasses import dataclass

import pytest

from helpers._internal import child as _child
from helpers._internal.records import Record
from helpers.errors import ChildProcessFailed


@pytest.fixture()
def module(tmp_path):
    """Write a child module `kidN` whose function `main` runs ``body``; returns
    ("kidN:main", env with PYTHONPATH)."""
    count = iter(range(100))

    def make(body: str):
        name = f"kid{next(count)}"
        code = "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ")
        (tmp_path / f"{name}.py").write_text(code)
        env = _child.child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}"
                                + os.environ.get("PYTHONPATH", "")})
        return f"{name}:main", env
    return make


def test_run_skips_stray_lines_and_broken_json(module):
    name, env = module("""
        print("hello from a library")
        print('{"answer": 1}')
        print("{not json")
    """)
    r = _child.run(name, env=env, timeout=60)
    assert r.data == {"answer": 1} and r.returncode == 0


def test_run_reports_a_crash_with_its_stderr(module):
    name, env = module("""
        import sys
        print("the reason it failed", file=sys.stderr)
        sys.exit(3)
    """)
    r = _child.run(name, env=env, timeout=60)
    assert r.data is None and r.returncode == 3
    assert "exited with 3" in r.describe_failure() and "the reason it failed" in r.stderr_tail
    with pytest.raises(ChildProcessFailed, match="measuring: the child process exited"):
        r.require("measuring")


def test_run_kills_a_child_that_hangs(module):
    name, env = module("""
        import time
        print('{"early": true}', flush=True)
        time.sleep(60)
    """)
    r = _child.run(name, env=env, timeout=3)
    assert r.timed_out and "did not finish in time" in r.describe_failure()
    assert r.data == {"early": True}  # what it said before hanging is kept


def test_an_abort_is_named(module):
    name, env = module("""
        import os
        os.abort()
    """)
    r = _child.run(name, env=env, timeout=60)
    assert r.returncode < 0 and "SIGABRT" in r.describe_failure()


def test_start_survives_a_chatty_child_and_finishes_it(module):
    name, env = module("""
        import sys
        sys.stderr.write("x" * 300_000)  # more than a pipe holds: must not block the child
        sys.stderr.flush()
        print("not json")
        print('{"ready": 1}', flush=True)
        sys.stdin.readline()
    """)
    proc = _child.start(name, env=env)
    r = _child.read_answer(proc, timeout=60)
    assert r.data == {"ready": 1} and proc.poll() is None  # still running, holding its state
    _child.finish(proc, timeout=30)
    assert proc.returncode == 0


def test_read_answer_gives_up_on_a_silent_child(module):
    name, env = module("""
        import time
        time.sleep(60)
    """)
    proc = _child.start(name, env=env)
    r = _child.read_answer(proc, timeout=2)
    assert r.timed_out and r.data is None and proc.poll() is not None  # killed and reaped
    _child.finish(proc)


def test_read_answer_reports_a_child_that_exits_silently(module):
    name, env = module("""
        import sys
        print("boom", file=sys.stderr)
        sys.exit(4)
    """)
    proc = _child.start(name, env=env)
    r = _child.read_answer(proc, timeout=60)
    assert r.data is None and r.returncode == 4 and "boom" in r.stderr
    _child.finish(proc)


@dataclass(frozen=True)
class Ask(Record):
    n: int
    label: str | None


@dataclass(frozen=True)
class Told(Record):
    doubled: int
    label: str | None


def test_a_typed_request_and_answer_cross_the_process_boundary(tmp_path):
    (tmp_path / "kid_typed.py").write_text(textwrap.dedent("""
        from tests.test_child import Ask, Told

        def double(request: Ask) -> Told:
            assert isinstance(request, Ask), type(request)
            return Told(2 * request.n, request.label)
    """))
    root = os.path.dirname(os.path.dirname(__file__))
    env = _child.child_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), root])})
    r = _child.run("kid_typed:double", Ask(21, None), env=env, timeout=60)
    assert r.answer(Told, "doubling") == Told(42, None)
    with pytest.raises(ChildProcessFailed, match="not a Ask"):
        r.answer(Ask, "doubling")  # an answer of another shape is a failed child too


def test_a_reply_sets_the_exit_code(module):
    name, env = module("""
        from helpers._internal.child import Reply
        return Reply({"ok": False}, exit_code=3)
    """)
    r = _child.run(name, env=env, timeout=60)
    assert r.data == {"ok": False} and r.returncode == 3


def test_a_dead_child_is_child_process_failed_with_its_result(module):
    name, env = module("""
        import os
        os.kill(os.getpid(), 9)
    """)
    r = _child.run(name, env=env, timeout=60)
    with pytest.raises(ChildProcessFailed, match="killed by SIGKILL") as info:
        r.answer(Told, "the kill test")
    assert info.value.result is r and info.value.result.returncode == -9


# --- run_group: children that need each other ---------------------------------------------------
def _children_now() -> frozenset:
    import psutil

    return frozenset(p.pid for p in psutil.Process().children(recursive=True))


def _children_left(before: frozenset = frozenset()) -> list:
    """This process's children still running, other than those in ``before`` (pids)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before
            and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _roles(env, *roles):
    return [{**env, "KID_ROLE": r} for r in roles]


def test_run_group_answers_in_order(module):
    target, env = module("""
        import os
        print('{"role": "%s"}' % os.environ["KID_ROLE"])
    """)
    before = _children_now()
    results = _child.run_group(target, [None, None, None], envs=_roles(env, "a", "b", "c"))
    assert [r.data for r in results] == [{"role": "a"}, {"role": "b"}, {"role": "c"}]
    assert all(r.returncode == 0 for r in results) and not _children_left(before)


def test_when_one_child_dies_the_others_are_killed_not_waited_for(module):

    target, env = module("""
        import os, sys, time
        if os.environ["KID_ROLE"] == "dies":
            sys.exit("this one failed")
        time.sleep(120)
    """)
    before = _children_now()
    results = _child.run_group(target, [None, None], envs=_roles(env, "dies", "waits"),
                               timeout=100)
    assert results[0].returncode == 1 and "this one failed" in results[0].stderr
    assert results[1].returncode < 0 and not results[1].timed_out  # killed, not timed out
    assert not _children_left(before)


def test_a_group_that_hangs_is_killed_at_the_deadline(module):
    target, env = module("""
        import time
        time.sleep(120)
    """)
    before = _children_now()
    results = _child.run_group(target, [None, None], envs=_roles(env, "a", "b"), timeout=3)
    assert all(r.timed_out and r.data is None for r in results)
    assert "did not finish in time" in results[0].describe_failure()
    assert not _children_left(before)


def test_an_interrupted_caller_leaves_no_child_running(module, monkeypatch):
    target, env = module("""
        import time
        time.sleep(120)
    """)

    def interrupt(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(_child.time, "sleep", interrupt)  # the caller's wait, interrupted
    before = _children_now()
    with pytest.raises(KeyboardInterrupt):
        _child.run_group(target, [None, None], envs=_roles(env, "a", "b"))
    assert not _children_left(before)


def test_run_group_needs_one_environment_per_request(module):
    target, env = module("print('{}')")
    with pytest.raises(Exception, match="one environment per request"):
        _child.run_group(target, [None, None], envs=[env])


def test_run_group_reads_a_child_that_writes_bytes_that_are_not_utf8(module):
    target, env = module("""
        import sys
        sys.stderr.buffer.write(b"bad byte \\xff here\\n")
        sys.stderr.flush()
        print('{"ok": true}')
    """)
    (result,) = _child.run_group(target, [None], envs=[env])
    assert result.data == {"ok": True} and "bad byte" in result.stderr
