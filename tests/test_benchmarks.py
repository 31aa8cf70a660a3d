"""The benchmarks' own logic where it branches for a GPU, checked without one: the children's
answers are made up, the branching is real."""

import pytest

from helpers.measure import ALLOCATOR_PEAK, HOST_PEAK
from tests.conftest import benchmark_module

accuracy = benchmark_module("prediction_accuracy")


def _gpu_row(measured):
    return {"name": "cnn_b32", "predicted": 100, "measured_first_run": measured,
            "measured_later_run": None, "source": ALLOCATOR_PEAK, "note": ""}


def test_on_a_gpu_a_hidden_first_run_is_measured_again_from_the_cache(monkeypatch):
    # the 2026-11-26 H100 run: a small step's first run was hidden by compile-time autotuning
    answers = iter([_gpu_row(None), _gpu_row(104)])
    calls = []

    def child(*argv, env):
        calls.append((argv, env))
        return next(answers)

    monkeypatch.setattr(accuracy, "_child", child)
    env = {"JAX_COMPILATION_CACHE_DIR": "/a/cache"}
    row, warm = accuracy._measured("cnn_b32", env)
    assert row["measured_first_run"] == 104 and "compilation cache" in row["note"]
    assert warm == {}  # no run after another step: its mark would hide this one
    assert [argv for argv, _ in calls] == [("--one", "cnn_b32")] * 2
    assert all(e is env for _, e in calls)  # the same cache for both children


def test_on_a_gpu_a_measured_first_run_is_not_repeated(monkeypatch):
    calls = []
    monkeypatch.setattr(accuracy, "_child",
                        lambda *argv, env: calls.append(argv) or _gpu_row(98))
    row, warm = accuracy._measured("cnn_b32", {})
    assert row["measured_first_run"] == 98 and warm == {} and len(calls) == 1


def test_on_the_cpu_stand_in_the_step_is_also_measured_after_another(monkeypatch):
    calls = []
    monkeypatch.setattr(accuracy, "_child", lambda *argv, env: calls.append((argv, env)) or {
        "source": HOST_PEAK, "measured_first_run": 10})
    env = {"A": "1", **accuracy.compilation_cache_env("/a/cache")}
    accuracy._measured("cnn_b32", env)
    assert [argv for argv, _ in calls] == [("--one", "cnn_b32"),
                                           ("--one", "cnn_b32", "--after-another")]
    assert calls[1][1] == {"A": "1"}  # as before the cache: the second child compiles its step


def test_a_failed_child_is_a_named_row_and_no_second_child_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(accuracy, "_child", lambda *argv, env: calls.append(argv) or {
        "error": "INTERNAL: Failed to initialize BLASLT support"})
    row, warm = accuracy._measured("cnn_b32", {})
    assert row["name"] == "cnn_b32" and "BLASLT" in row["error"] and warm == {}
    assert len(calls) == 1


def test_where_the_two_batch_searches_disagree_the_needs_at_both_answers_are_kept(
        monkeypatch, tmp_path):
    # the H100 (2026-11-26): largest_batch answered lower than the bisection at three budgets,
    # and the log kept no needs to tell which is the boundary
    import types

    batch = benchmark_module("batch_search")
    monkeypatch.setattr(batch, "BUDGETS", {"40 MiB": 40 * 2**20})
    monkeypatch.setattr(batch, "bisection", lambda make, budget: (256, 18))
    monkeypatch.setattr(batch.sizing, "largest_batch", lambda *a, **k: types.SimpleNamespace(
        batch=128, compiles=13, method="bracket halved", padded_to=32, unaligned_batch=100))
    monkeypatch.setattr(batch, "need", lambda make, b: 1000 * b)
    workspace = types.SimpleNamespace(op="dot_general (cuBLAS workspace)", dtype="s8",
                                      shape=(33554432,), nbytes=2**25)

    def plan(fn, params, x, y):  # an odd batch has a workspace of its own (the H100's shape)
        b = x.shape[0]
        return types.SimpleNamespace(needed_bytes=1000 * b, temp_bytes=2**25 * (b % 2),
                                     largest_temporaries=(workspace,) * (b % 2))

    monkeypatch.setattr(batch.preflight, "preflight_step", plan)
    written = []
    monkeypatch.setattr(batch, "write", lambda name, payload: written.append(name) or name)
    row = batch.main(["--rounds", "1"])["budgets"]["40 MiB"]
    assert row["needs_at_answers"] == {"128": 128_000, "129": 129_000, "256": 256_000,
                                       "257": 257_000}
    assert not row["same_answer"] and written == ["batch_search"]
    assert (row["padded_to"], row["unaligned_batch"]) == (32, 100)  # the padding it searched past
    temps = row["temporaries_at_answers"]
    assert temps["128"] == {"temp_bytes": 0, "largest": []}
    assert temps["129"]["largest"] == [["dot_general (cuBLAS workspace)", "s8", [33554432],
                                        2**25]]
    monkeypatch.setattr(batch, "BUDGETS", {"40 MiB": 40 * 2**20, "8 GiB": 8 * 2**30})
    only = batch.main(["--rounds", "1", "--budgets", "40 MiB"])  # a subset: printed only
    assert list(only["budgets"]) == ["40 MiB"] and written == ["batch_search"]
    with pytest.raises(SystemExit):
        batch.main(["--budgets", "3 GiB"])
