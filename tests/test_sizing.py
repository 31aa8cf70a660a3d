"""sizing.largest_batch: the same answer as bisection over compiles, in a few compiles."""

import jax
import pytest

from helpers import example_steps, preflight, sizing
from helpers.errors import BadInputError

PARAMS, X1, Y1 = example_steps.mlp_sgd_step_args(scale=1, batch=1)
PARAMS = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), PARAMS)


def make(batch):
    return (PARAMS, jax.ShapeDtypeStruct((batch, X1.shape[1]), X1.dtype),
            jax.ShapeDtypeStruct((batch, Y1.shape[1]), Y1.dtype))


def need(batch):
    return preflight.preflight_step(example_steps.mlp_sgd_step, *make(batch)).needed_bytes


def bisection(budget, g=1):
    """The slow, sure way: double, then halve the gap, in multiples of g."""
    lo, hi = 0, g
    while need(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > g:
        mid = (lo + hi) // 2 // g * g
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid)
    return lo


@pytest.mark.parametrize("budget, g", [(int(460.8 * 2**20), 1), (2 * 2**30, 8),
                                       (64 * 2**20, 1), (23 * 2**20, 4), (23 * 2**20, 1),
                                       (30 * 2**20, 1), (40 * 2**20, 1)])
def test_the_same_answer_as_bisection(budget, g):
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, granularity=g,
                                 max_batch=1 << 20)
    assert found.batch == bisection(budget, g)
    assert found.batch % g == 0 and found.needed_bytes == need(found.batch) <= budget
    assert found.next_needed_bytes > budget


@pytest.mark.parametrize("budget", [int(460.8 * 2**20), 2 * 2**30])
def test_three_compiles_where_the_need_is_linear_in_the_batch(budget):
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, max_batch=1 << 20)
    assert found.compiles == 3 and not found.next_compiled
    assert "checked by a third" in str(found) and "no run" in str(found)
    sure = sizing.largest_batch(example_steps.mlp_sgd_step, make, budget, max_batch=1 << 20,
                                verify=True)
    assert sure.compiles == 4 and sure.next_compiled and sure.batch == found.batch
    assert sure.next_needed_bytes == need(found.batch + 1) > budget


def test_a_line_through_the_compiles_nearest_the_answer_where_xla_changes_its_plan():
    # the MLP's need grows by 21,504 B per example near batch 2,144 and by 22,528 far above it:
    # the line through the largest batch is off there, the line through the two nearest is not
    assert need(2200) - need(2199) != need(1 << 20) - need((1 << 20) - 1)
    found = sizing.largest_batch(example_steps.mlp_sgd_step, make, 64 * 2**20, max_batch=1 << 20)
    assert need(found.batch) <= 64 * 2**20 < need(found.batch + 1)
    assert found.compiles == 4 and "nearest the answer" in found.method
    assert found.bytes_per_example == need(2145) - need(2144)


def test_when_nothing_fits_or_everything_fits():
    none = sizing.largest_batch(example_steps.mlp_sgd_step, make, "10 MiB", max_batch=1 << 20)
    assert none.batch == 0 and none.next_needed_bytes > none.budget_bytes == 10 * 2**20
    assert "no batch fits" in str(none)
    every = sizing.largest_batch(example_steps.mlp_sgd_step, make, "64 GiB", max_batch=4096)
    assert every.batch == 4096 and every.compiles <= 2


def test_bad_input_is_named():
    with pytest.raises(BadInputError, match="granularity"):
        sizing.largest_batch(example_steps.mlp_sgd_step, make, "1 GiB", granularity=0)
    with pytest.raises(ValueError):
        sizing.largest_batch(example_steps.mlp_sgd_step, make, "lots")
    with pytest.raises(BadInputError, match="tuple of the step's arguments"):
        sizing.largest_batch(example_steps.mlp_sgd_step, lambda b: None, "1 GiB")
    with pytest.raises(BadInputError, match="does not grow with the batch"):
        sizing.largest_batch(example_steps.mlp_sgd_step, lambda b: make(8), "19 MiB")
