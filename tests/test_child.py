"""The one child-process runner (helpers._child): answers, failures, timeouts, chatty children."""

import os
import textwrap

import pytest

from helpers import _child
from helpers.errors import ChildProcessFailed


@pytest.fixture()
def module(tmp_path):
    """Write a child module `kidN` into tmp_path; returns (name, env with PYTHONPATH)."""
    count = iter(range(100))

    def make(body: str):
        name = f"kid{next(count)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        env = _child.child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}"
                                + os.environ.get("PYTHONPATH", "")})
        return name, env
    return make


def test_run_json_skips_stray_lines_and_broken_json(module):
    name, env = module("""
        print("hello from a library")
        print('{"answer": 1}')
        print("{not json")
    """)
    r = _child.run_json(name, env=env, timeout=60)
    assert r.data == {"answer": 1} and r.returncode == 0


def test_run_json_reports_a_crash_with_its_stderr(module):
    name, env = module("""
        import sys
        print("the reason it failed", file=sys.stderr)
        sys.exit(3)
    """)
    r = _child.run_json(name, env=env, timeout=60)
    assert r.data is None and r.returncode == 3
    assert "exited with 3" in r.describe_failure() and "the reason it failed" in r.stderr_tail
    with pytest.raises(ChildProcessFailed, match="measuring: the child process exited"):
        r.require("measuring")


def test_run_json_kills_a_child_that_hangs(module):
    name, env = module("""
        import time
        print('{"early": true}', flush=True)
        time.sleep(60)
    """)
    r = _child.run_json(name, env=env, timeout=3)
    assert r.timed_out and "did not finish in time" in r.describe_failure()
    assert r.data == {"early": True}  # what it said before hanging is kept


def test_an_abort_is_named(module):
    name, env = module("""
        import os
        os.abort()
    """)
    r = _child.run_json(name, env=env, timeout=60)
    assert r.returncode < 0 and "SIGABRT" in r.describe_failure()


def test_start_json_survives_a_chatty_child_and_finishes_it(module):
    name, env = module("""
        import sys
        sys.stderr.write("x" * 300_000)  # more than a pipe holds: must not block the child
        sys.stderr.flush()
        print("not json")
        print('{"ready": 1}', flush=True)
        sys.stdin.readline()
    """)
    proc = _child.start_json(name, env=env)
    r = _child.read_answer(proc, timeout=60)
    assert r.data == {"ready": 1} and proc.poll() is None  # still running, holding its state
    _child.finish(proc, timeout=30)
    assert proc.returncode == 0


def test_read_answer_gives_up_on_a_silent_child(module):
    name, env = module("""
        import time
        time.sleep(60)
    """)
    proc = _child.start_json(name, env=env)
    r = _child.read_answer(proc, timeout=2)
    assert r.timed_out and r.data is None and proc.poll() is not None  # killed and reaped
    _child.finish(proc)


def test_read_answer_reports_a_child_that_exits_silently(module):
    name, env = module("""
        import sys
        print("boom", file=sys.stderr)
        sys.exit(4)
    """)
    proc = _child.start_json(name, env=env)
    r = _child.read_answer(proc, timeout=60)
    assert r.data is None and r.returncode == 4 and "boom" in r.stderr
    _child.finish(proc)
