"""devices.placement on arrays over several devices: the sharding, each device's piece (index,
shape, bytes), committed, memory kind; for 1, 2 and 8 devices and a replicated array.

The test session has 4 simulated CPU devices (conftest), so 1 and 2 devices are meshes over some
of them, and 8 devices run in a child process started with 8.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from helpers import devices, render
from helpers.devices import Shard
from tests.conftest import N_SIMULATED, run_python


def mesh_of(n: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("data",))


def test_one_device_mesh_is_one_shard_holding_everything():
    x = jax.device_put(np.arange(16, dtype=np.float32).reshape(4, 4),
                       NamedSharding(mesh_of(1), P("data")))
    p = devices.placement(x)
    assert p.devices == ("cpu:0",) and p.committed is True and p.memory_kind == "device"
    assert p.shards == (Shard("cpu:0", "[:, :]", (4, 4), 64),)
    assert p.sharding == "NamedSharding(mesh={'data': 1}, spec=P('data'))"
    assert p.device_bytes == p.nbytes == 64 and not p.replicated
    assert "sharding:" in str(p)  # a NamedSharding is named even on one device


def test_two_devices_split_the_rows():
    x = jax.device_put(np.arange(32, dtype=np.uint16).reshape(8, 4),
                       NamedSharding(mesh_of(2), P("data")))
    p = devices.placement(x)
    assert p.devices == ("cpu:0", "cpu:1")
    assert [(s.device, s.index, s.shape, s.nbytes) for s in p.shards] == [
        ("cpu:0", "[0:4, :]", (4, 4), 32), ("cpu:1", "[4:8, :]", (4, 4), 32)]
    assert p.device_bytes == x.nbytes and not p.replicated
    assert "Sharded" in p.explanation and "jax.default_device" in p.explanation
    # the shard table agrees with JAX's own view of the shards
    by_device = {devices.device_name(s.device): s for s in x.addressable_shards}
    for s in p.shards:
        assert by_device[s.device].data.shape == s.shape


def test_second_axis_and_two_dimensional_mesh():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    x = jax.device_put(np.ones((4, 6), np.float32), NamedSharding(mesh, P("a", "b")))
    p = devices.placement(x)
    assert [s.index for s in p.shards] == ["[0:2, 0:3]", "[0:2, 3:6]", "[2:4, 0:3]",
                                           "[2:4, 3:6]"]
    assert p.sharding == "NamedSharding(mesh={'a': 2, 'b': 2}, spec=P('a', 'b'))"
    assert p.device_bytes == x.nbytes


def test_replicated_costs_n_times():
    x = jax.device_put(np.ones((3, 5), np.float32), NamedSharding(mesh_of(N_SIMULATED), P()))
    p = devices.placement(x)
    assert p.replicated and len(p.shards) == N_SIMULATED
    assert all(s.shape == (3, 5) and s.index == "[:, :]" for s in p.shards)
    assert p.device_bytes == N_SIMULATED * x.nbytes
    assert "Replicated" in p.explanation and f"{N_SIMULATED} x 60 B" in p.explanation
    assert f"({N_SIMULATED:g} x the array)" in str(p)


def test_single_device_array_renders_as_before():
    p = devices.placement(jax.device_put(jnp.ones(3), jax.devices()[2]))
    assert p.shards == (Shard("cpu:2", "[:]", (3,), 12),) and p.sharding == "SingleDeviceSharding"
    assert "sharding:" not in str(p) and "shards:" not in str(p)
    scalar = devices.placement(jnp.float32(2.0))
    assert scalar.shards[0].index == "[]" and scalar.shards[0].nbytes == 4


def test_host_memory_kind_is_explained():
    x = jax.device_put(np.ones(8, np.uint16),
                       SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host"))
    p = devices.placement(x)
    assert p.memory_kind == "pinned_host" and p.committed and p.devices == ("cpu:0",)
    assert "pinned_host memory" in p.explanation and "with_memory_kind('device')" in p.explanation
    sharded = jax.device_put(np.ones((4, 2)), NamedSharding(mesh_of(2), P("data"),
                                                            memory_kind="pinned_host"))
    assert devices.placement(sharded).memory_kind == "pinned_host"


def test_sharded_placement_renders_text_and_html():
    x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh_of(2), P("data")))
    p = devices.placement(x)
    text, html = str(p), p._repr_html_()
    assert "shards:      2 (sharded), 32 B on devices in all (1 x the array)" in text
    assert "cpu:1  [4:8]" in text
    assert html.count("<tr><td>cpu:") == 2 and "<code>[4:8]</code>" in html
    assert render.placement_html(p) == html  # deterministic


EIGHT = """
import json, jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from helpers import devices
mesh = jax.make_mesh((8,), ("data",))
x = jax.device_put(np.arange(64, dtype=np.float32).reshape(16, 4), NamedSharding(mesh, P("data")))
r = jax.device_put(np.ones(10, np.float32), NamedSharding(mesh, P()))
out = {}
for name, a in (("sharded", x), ("replicated", r)):
    p = devices.placement(a)
    out[name] = {"devices": p.devices, "shards": [[s.device, s.index, list(s.shape), s.nbytes]
                 for s in p.shards], "device_bytes": p.device_bytes, "replicated": p.replicated,
                 "committed": p.committed, "memory_kind": p.memory_kind, "text": str(p)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def eight():
    proc = run_python(EIGHT, env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": None,
                                  "JAX_NUM_CPU_DEVICES": None})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eight_devices_one_piece_each(eight):
    s = eight["sharded"]
    assert s["devices"] == [f"cpu:{i}" for i in range(8)]
    assert s["shards"] == [[f"cpu:{i}", f"[{2 * i}:{2 * i + 2}, :]", [2, 4], 32] for i in range(8)]
    assert s["device_bytes"] == 256 and not s["replicated"]
    assert s["committed"] is True and s["memory_kind"] == "device"
    assert "sharding:    NamedSharding(mesh={'data': 8}, spec=P('data'))" in s["text"]


def test_eight_devices_replicated(eight):
    r = eight["replicated"]
    assert r["replicated"] and r["device_bytes"] == 8 * 40
    assert all(sh[1:] == ["[:]", [10], 40] for sh in r["shards"])
    assert "(8 x the array)" in r["text"]
