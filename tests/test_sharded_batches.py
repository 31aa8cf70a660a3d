"""datasets.batches(..., sharding=...): each batch split over a mesh, one slice of rows per
device, equal to the single-device gather of the same window starts."""

import json

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import datasets, devices, feeding
from helpers.errors import BadInputError
from tests.conftest import N_SIMULATED, run_python

TOKENS = (np.arange(200_003) % 50257).astype(np.uint16)


def data_sharding(n: int = N_SIMULATED) -> NamedSharding:
    return NamedSharding(Mesh(np.array(jax.devices()[:n]), ("data",)), P("data"))


def check(batch, starts, sharding, seq_len):
    want = feeding.gather(TOKENS, starts, seq_len)
    assert np.array_equal(np.asarray(batch), want)  # the same windows as one device gets
    assert batch.sharding.is_equivalent_to(sharding, 2) and batch.committed
    rows = batch.shape[0] // len(sharding.device_set)
    for shard in batch.addressable_shards:  # one slice of rows per device, in mesh order
        i = sharding.mesh.devices.tolist().index(shard.device)
        assert shard.data.shape == (rows, seq_len)
        assert np.array_equal(np.asarray(shard.data), want[i * rows:(i + 1) * rows])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_each_batch_is_split_over_the_mesh(prefetch):
    sharding = data_sharding()
    with datasets.batches(TOKENS, 8, 32, sharding=sharding, steps=3, prefetch=prefetch,
                          seed=4) as it:
        got = list(it)
    assert len(got) == 3
    for batch, starts in zip(got, it.starts_used, strict=True):
        check(batch, starts, sharding, 32)


def test_same_seed_same_windows_as_one_device():
    with datasets.batches(TOKENS, 8, 16, device=jax.devices()[0], steps=2, seed=9) as one:
        single = [np.asarray(b) for b in one]
    with datasets.batches(TOKENS, 8, 16, sharding=data_sharding(), steps=2, seed=9) as many:
        sharded = [np.asarray(b) for b in many]
    assert all(np.array_equal(a, b) for a, b in zip(single, sharded, strict=True))


def test_two_devices_pinned_and_converted():
    sharding = data_sharding(2)
    with datasets.batches(TOKENS, 4, 16, sharding=sharding, steps=1, prefetch=0, pinned=True,
                          dtype="int32") as it:
        batch = next(it)
    assert batch.dtype == np.int32 and batch.sharding.memory_kind == "device"
    assert np.array_equal(np.asarray(batch), feeding.gather(TOKENS, it.starts_used[0], 16))
    p = devices.placement(batch)
    assert [s.shape for s in p.shards] == [(2, 16), (2, 16)] and p.device_bytes == batch.nbytes


def test_bad_shardings_say_what_to_do():
    with pytest.raises(BadInputError, match="not both"):
        datasets.batches(TOKENS, 8, 16, device=jax.devices()[0], sharding=data_sharding())
    with pytest.raises(TypeError, match="jax.sharding.Sharding"):
        datasets.batches(TOKENS, 8, 16, sharding="data")
    with pytest.raises(BadInputError, match="multiple of the number of devices"):
        datasets.batches(TOKENS, 6, 16, sharding=data_sharding())  # 6 rows over 4 devices


EIGHT = """
import json, jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from helpers import datasets, feeding
tokens = (np.arange(100_000) % 50257).astype(np.uint16)
mesh = jax.make_mesh((8,), ("data",))
with datasets.batches(tokens, 16, 64, sharding=NamedSharding(mesh, P("data")), steps=2) as it:
    got = list(it)
want = [feeding.gather(tokens, s, 64) for s in it.starts_used]
first = got[0]
print(json.dumps({
    "equal": [bool(np.array_equal(np.asarray(b), w)) for b, w in zip(got, want)],
    "shards": sorted((str(s.device), s.index[0].start, s.data.shape[0])
                     for s in first.addressable_shards),
    "per_device_equal": all(np.array_equal(np.asarray(s.data), w[s.index])
                            for b, w in zip(got, want) for s in b.addressable_shards)}))
"""


def test_eight_devices_in_a_child():
    proc = run_python(EIGHT, env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": None,
                                  "JAX_NUM_CPU_DEVICES": None})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["equal"] == [True, True] and out["per_device_equal"]
    assert len(out["shards"]) == 8 and {rows for _, _, rows in out["shards"]} == {2}
    assert sorted(start for _, start, _ in out["shards"]) == list(range(0, 16, 2))
