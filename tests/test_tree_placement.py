"""devices.tree_placement: where every leaf of a pytree sits, and what a jit over the whole tree
would meet. Each problem it names is checked against what JAX really does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import devices
from helpers._internal.jaxcompat import jax_version_tuple


@pytest.fixture()
def two():
    return jax.devices()[0], jax.devices()[1]


def add(t):
    return t["w"] + t["b"]


def test_one_row_per_leaf_with_bytes_by_place(two):
    d0, _ = two
    tree = {"w": jax.device_put(jnp.ones((3, 4)), d0), "b": jnp.ones(4), "lr": 0.1}
    t = devices.tree_placement(tree)
    assert [leaf.path for leaf in t.leaves] == ["['b']", "['lr']", "['w']"]
    w = t.leaves[2]
    assert (w.kind, w.shape, w.dtype, w.nbytes, w.devices, w.committed) == (
        "jax.Array", (3, 4), "float32", 48, ("cpu:0",), True)
    assert t.leaves[1].kind == "float" and t.leaves[1].nbytes == 0
    assert dict(t.bytes_by_place) == {"cpu:0": 48 + 16, "Python values": 0}
    assert t.problems == () and "no problem" in str(t)
    assert t.nbytes == 64 and "<table>" in t._repr_html_()


def test_committed_leaves_on_two_devices_are_flagged_as_jax_raises(two):
    d0, d1 = two
    tree = {"w": jax.device_put(jnp.ones(3), d0), "b": jax.device_put(jnp.ones(3), d1)}
    (problem,) = devices.tree_placement(tree).problems
    assert "incompatible devices" in problem and "jax.device_put(tree, device)" in problem
    with pytest.raises(ValueError, match="incompatible devices"):  # what the kit says
        jax.jit(add)(tree)
    fixed = jax.device_put(tree, d0)
    assert devices.tree_placement(fixed).problems == ()
    jax.jit(add)(fixed).block_until_ready()


def _mesh(order):
    from jax.sharding import Mesh

    return Mesh(np.array([jax.devices()[i] for i in order]), ("x",))


def test_levanter_635_meshes_of_one_device_set_in_other_orders_are_flagged_as_jax_raises():
    """levanter#635, jax#15903: two meshes over the same devices in different orders; the kit
    said 'no problem', comparing the sorted devices."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    a = jax.device_put(jnp.ones(8), NamedSharding(_mesh([0, 1, 2, 3]), P("x")))
    b = jax.device_put(jnp.ones(8), NamedSharding(_mesh([0, 2, 1, 3]), P("x")))
    tree = {"w": a, "b": b}
    (problem,) = devices.tree_placement(tree).problems
    assert "meshes of different device orders" in problem and "one Mesh" in problem
    with pytest.raises(ValueError, match="incompatible devices"):  # what the kit says
        jax.jit(add)(tree)
    fixed = {"w": a, "b": jax.device_put(b, NamedSharding(a.sharding.mesh, P("x")))}
    assert devices.tree_placement(fixed).problems == ()
    jax.jit(add)(fixed).block_until_ready()


def test_keras_18681_a_leaf_on_one_device_beside_a_mesh_is_put_on_the_mesh_replicated():
    """keras#18681: a variable made outside the distribution scope sits on one device beside
    the sharded ones; putting the whole tree on one device would gather them there."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh([0, 1, 2, 3])
    tree = {"w": jax.device_put(jnp.ones(8), NamedSharding(mesh, P("x"))),
            "b": jax.device_put(jnp.ones(8), jax.devices()[0])}
    (problem,) = devices.tree_placement(tree).problems
    assert "NamedSharding(mesh, P())" in problem and "jax.device_put(tree, device)" not in problem
    with pytest.raises(ValueError, match="incompatible devices"):
        jax.jit(add)(tree)
    fixed = {**tree, "b": jax.device_put(tree["b"], NamedSharding(mesh, P()))}  # the fix
    assert devices.tree_placement(fixed).problems == ()
    assert jax.jit(add)(fixed).sharding.mesh == mesh


def test_uncommitted_leaves_elsewhere_are_copied_on_every_call(two):
    _, d1 = two
    tree = {"w": jax.device_put(jnp.ones(3), d1), "b": jnp.ones(3)}  # b: uncommitted, cpu:0
    (problem,) = devices.tree_placement(tree).problems
    assert "uncommitted" in problem and "copies them to cpu:1" in problem
    assert jax.jit(add)(tree).devices() == {d1}  # JAX moved b: the copy the kit names


def test_numpy_leaves_are_copied_host_to_device(two):
    tree = {"w": jnp.ones(3), "b": np.ones(3, np.float32)}
    (problem,) = devices.tree_placement(tree).problems
    assert "1 leaf (['b']) is NumPy (12 B)" in problem and "every call" in problem
    assert dict(devices.tree_placement(tree).bytes_by_place)["host (NumPy)"] == 12


def test_donated_leaves_are_named_as_deleted(two):
    x = jnp.ones(3)
    jax.jit(lambda a: a * 2, donate_argnums=0)(x)
    t = devices.tree_placement({"x": x, "y": jnp.ones(3)})
    assert t.leaves[0].deleted and any("deleted" in p for p in t.problems)
    assert "deleted" in str(t)


def test_host_memory_leaves_beside_device_ones(two):
    d0, _ = two
    if "pinned_host" not in {m.kind for m in d0.addressable_memories()}:
        pytest.skip("this backend has no pinned_host memory")
    s = jax.sharding.SingleDeviceSharding(d0, memory_kind="pinned_host")
    tree = {"w": jax.device_put(jnp.ones(3), d0), "opt": jax.device_put(jnp.ones(3), s)}
    t = devices.tree_placement(tree)
    assert "cpu:0 (pinned_host)" in t.bytes_by_place
    assert any("host memory (pinned_host)" in p for p in t.problems)


def test_typed_prng_keys_are_placed_like_any_array():
    """A typed key's dtype (key<fry>) is no NumPy dtype: placement raised TypeError on it."""
    from jax.sharding import NamedSharding, PartitionSpec

    keys = jax.random.split(jax.random.key(0), 8)
    split = jax.device_put(keys, NamedSharding(jax.make_mesh((4,), ("x",)), PartitionSpec("x")))
    assert devices.placement(keys).nbytes == keys.nbytes
    assert sum(s.nbytes for s in devices.placement(split).shards) == keys.nbytes
    t = devices.tree_placement({"key": keys, "split": split})
    assert [leaf.nbytes for leaf in t.leaves] == [keys.nbytes] * 2


def test_optax_548_an_uncommitted_state_fed_back_through_the_step_is_copied_once():
    params = jax.device_put(jnp.ones((64, 64)), jax.devices()[1])
    opt_state = jnp.zeros((64, 64))  # optimizer.init's state: uncommitted, on the default device
    (problem,) = devices.tree_placement({"params": params, "opt": opt_state}).problems
    assert "copies them once" in problem and "on every call" not in problem
    assert "uncommitted on the default device (cpu:0)" in problem and "optax#548" in problem
    assert "jax.default_device(device)" in problem and "being cpu:1" in problem
    with jax.default_device(jax.devices()[1]):  # the fix it names
        made_there = jnp.zeros((64, 64))
    assert devices.tree_placement({"params": params, "opt": made_there}).problems == ()
    step = jax.jit(lambda p, o: (p - 0.1 * o, o * 0.9))
    p, o = step(params, opt_state)
    assert o.committed and o.devices() == {jax.devices()[1]}  # fed back: no copy again
    assert devices.tree_placement({"params": p, "opt": o}).problems == ()


def test_dm_haiku_118_a_tree_made_under_default_device_is_uncommitted_off_the_default():
    """google-deepmind/dm-haiku#118: parameters wanted on device 1. Made under
    `with jax.default_device(d1)` (the kit's own advice) they stay uncommitted, and a jit over
    them outside the block runs on the default device, copying them: tree_placement said "no
    problem" (a new user's trial). It names them now, and the fix commits them, so the jit runs
    on device 1."""
    d1 = jax.devices()[1]
    with jax.default_device(d1):
        params = {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)}
        assert devices.tree_placement(params).problems == ()  # inside the block: no copy
    (problem,) = devices.tree_placement(params).problems
    assert "2 leaves (['b'], ['w']) are uncommitted on cpu:1, not the default device (cpu:0)" \
        in problem and "dm-haiku#118" in problem and "the device being cpu:1" in problem
    step = jax.jit(lambda p: p["w"] * 2 + p["b"])
    assert step(params).devices() == {jax.devices()[0]}  # where the copy goes
    fixed = jax.device_put(params, d1)
    assert devices.tree_placement(fixed).problems == ()
    assert step(fixed).devices() == {d1}


def test_marin_8515_the_stray_device_leaf_of_an_offloaded_state_is_named_not_the_state(two):
    """Before: the offloaded majority was flagged, with a fix that undoes the offload
    (with_memory_kind('device')), and the stray count went unnamed."""
    d0, _ = two
    if "pinned_host" not in {m.kind for m in d0.addressable_memories()}:
        pytest.skip("this backend has no pinned_host memory")
    dev = jax.sharding.SingleDeviceSharding(d0)
    host = dev.with_memory_kind("pinned_host")

    def init(count_sharding):
        params = jax.device_put(jnp.ones((64, 64)), dev)
        opt = {"mu": jax.device_put(jnp.zeros((64, 64)), host),
               "nu": jax.device_put(jnp.zeros((64, 64)), host),
               "count": jax.device_put(jnp.zeros((), jnp.int32), count_sharding)}
        return params, opt

    params, opt = init(dev)  # the thread's bug: Adam's count initialized on the device
    for tree, where in ((opt, "the tree"), ({"params": params, "opt": opt}, "['opt']")):
        (problem,) = devices.tree_placement(tree).problems
        assert problem.startswith("1 leaf (")
        assert "['count']) is in device memory while the rest of " + where in problem
        assert "['mu'], " in problem and "['nu'], 32,768 B) is in pinned_host" in problem
        assert "with_memory_kind('pinned_host')" in problem
        assert "with_memory_kind('device')" not in problem
        assert "marin-community/marin#8515" in problem
    # params on the device beside a state all offloaded: placed so on purpose, no stray
    fixed = init(host)
    (problem,) = devices.tree_placement({"params": fixed[0], "opt": fixed[1]}).problems
    assert "in host memory (pinned_host) beside device-memory leaves" in problem
    assert "an operation on both raises" in problem and "jax.memory.Space.Device" in problem
    assert "where they are not meant to be offloaded" in problem  # no bare undoing of it
    if jax_version_tuple() < (0, 10):  # XLA:CPU 0.8.0 cannot return a value to pinned_host
        return

    for state, compiles in ((init(dev), 2), (init(host), 1)):  # as written; the kit's fix
        def step(params, opt):  # (a new function each time: its own cache)
            o = jax.device_put(opt, dev)
            return params - o["mu"], {"mu": o["mu"], "nu": o["nu"], "count": o["count"] + 1}

        jstep = jax.jit(step, out_shardings=(dev, {"mu": host, "nu": host, "count": host}))
        p, o = state
        for _ in range(3):
            p, o = jstep(p, o)
        assert jstep._cache_size() == compiles


def _data_mesh():
    return jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def test_keras_20007_a_batch_beside_replicated_params_is_split_over_the_mesh_not_replicated():
    """keras#20007: batches made jax.Arrays (jnp.asarray) land whole on the first device beside
    replicated params. The kit said "an optimizer's init" (optax#548) and advised
    device_put(leaf, other.sharding) or P(): followed, each of 4 devices held the whole 8 MiB
    batch instead of 2 MiB, and 20 steps took 9.21 s against 0.69 s (datafeed helper, jax
    0.10.2 CPU)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import transfers

    mesh = _data_mesh()
    w = jax.device_put(np.ones((64, 64), np.float32), NamedSharding(mesh, P()))
    host = np.ones((256, 64), np.float32)
    batch = jnp.asarray(host)  # the thread's adapter: whole on cpu:0, uncommitted
    (problem,) = devices.tree_placement((w, batch)).problems
    assert "shaped like none of the leaves committed to 4 devices, as a batch is" in problem
    assert "copies it whole to each of the 4 devices at each call" in problem
    assert "jax.device_put(np_batch, NamedSharding(mesh, P('data')))" in problem
    assert "keras-team/keras#20007" in problem and "data parallelism" in problem
    assert "optax#548" not in problem and "other.sharding)" not in problem
    step = jax.jit(lambda w, x: (x @ w).sum())
    step(w, batch).block_until_ready()
    with transfers.trace() as log:  # what the kit says a jit does with it
        step(w, batch).block_until_ready()
    assert [t.nbytes for t in log.select("device->device")] == [host.nbytes] * 4
    replicated = jax.device_put(batch, w.sharding)  # the old advice
    assert {s.nbytes for s in devices.placement(replicated).shards} == {host.nbytes}
    split = jax.device_put(host, NamedSharding(mesh, P("data")))  # the kit's fix
    assert {s.nbytes for s in devices.placement(split).shards} == {host.nbytes // 4}
    assert devices.tree_placement((w, split)).problems == ()  # data parallelism: no problem
    assert float(step(w, split)) == float(step(w, batch))
    # optax#548 on a mesh is still named so: a state of the params' shape, made on cpu:0
    (state,) = devices.tree_placement({"w": w, "mu": jnp.zeros((64, 64))}).problems
    assert "optax#548" in state and "NamedSharding(other.sharding.mesh, P())" not in state
    assert "jax.device_put(leaf, other.sharding)" in state


def test_jax_16905_numpy_batch_leaves_are_copied_once_a_step_not_put_on_the_device_once():
    """jax#16905: a new tree of 8 small NumPy arrays each step. The kit said "jax.device_put(tree)
    once": a batch new each step cannot be put once, and device_put each step was slower, 25
    against 150 us a step here (jax 0.10.2 and 0.8.0, CPU; 30 against 330 in the datafeed
    helper's runs), for the same 8 copies."""
    from helpers import transfers

    rng = np.random.default_rng(0)
    batches = [{f"k{i}": rng.standard_normal((16, 8), dtype=np.float32) for i in range(8)}
               for _ in range(3)]
    (problem,) = devices.tree_placement(batches[0]).problems
    assert "8 leaves" in problem and "on every call they are passed to" in problem
    assert "the one copy a batch new each step needs: pass it as NumPy" in problem
    assert "jax-ml/jax#16905" in problem and "prefetch_to_device" in problem
    assert "Only data passed again unchanged gains from jax.device_put(tree) once" in problem
    step = jax.jit(lambda b: sum(jnp.sum(v) for v in b.values()))
    step(batches[0]).block_until_ready()
    step(jax.device_put(batches[0])).block_until_ready()
    with transfers.trace() as straight:
        step(batches[1]).block_until_ready()
    with transfers.trace() as put_first:  # the old advice, each step
        step(jax.device_put(batches[2])).block_until_ready()
    assert straight.count("host->device") == put_first.count("host->device") == 8
    kept = jax.device_put(batches[0])  # data passed again unchanged: put once
    with transfers.trace() as again:
        step(kept).block_until_ready()
        step(kept).block_until_ready()
    assert again.count() == 0


def test_objax_163_a_state_replicated_for_pmap_is_named_one_copy_per_device():
    """objax#163: a checkpoint saved while the state is replicated for pmap held one copy per
    device (64 MiB for a 16 MiB model over 4 devices in the checkpoint helper's run; the kit
    said "no problem"). The fix, x[0] (flax's unreplicate), saves one copy."""
    import io

    n = 4
    state = {"w": jnp.ones((256, 256)), "step": jnp.zeros((), jnp.int32)}
    rstate = jax.pmap(lambda _: state)(jnp.arange(n))  # flax.jax_utils.replicate's layout
    (problem,) = devices.tree_placement(rstate).problems
    assert problem.startswith("2 leaves (['step'], ['w']) are one value copied per device")
    assert "a leading axis of 4 slices of equal checksums" in problem
    assert "google/objax#163" in problem
    assert "1,048,592 B for 262,148 B of values" in problem
    assert "jax.tree.map(lambda x: x[0], state)" in problem and "unreplicate" in problem

    def saved(tree):
        buf = io.BytesIO()
        np.savez(buf, **jax.device_get(tree))
        return len(buf.getvalue())

    fixed = jax.tree.map(lambda x: x[0], rstate)  # the fix it names
    assert saved(rstate) > 1_048_576 > 262_144 < saved(fixed) < 2 * 262_144
    assert devices.tree_placement(fixed).problems == ()
    # a pmap batch, one slice per device too: its slices differ, and nothing is said
    batch = jax.pmap(lambda i: jnp.full((256,), i))(jnp.arange(n))
    one_off = jax.pmap(lambda i: jnp.zeros((256,)).at[255].set(i == 3))(jnp.arange(n))
    assert devices.tree_placement({"x": batch, "y": one_off}).problems == ()
    if hasattr(jax, "device_put_replicated"):  # jax 0.8.0: a PmapSharding
        copied = jax.device_put_replicated({"w": jnp.ones((64, 64))}, jax.local_devices())
        (problem,) = devices.tree_placement(copied).problems
        assert "one value copied per device" in problem


def test_objax_163_arrays_split_over_a_mesh_of_the_users_are_not_pmap_copies():
    """objax#163's note fired on any array split one row per device over the user's own mesh
    with equal rows (code review, fp2.py): a zero-initialised FSDP-like state, an int32[4]
    counter, a padded int32[4,128] token batch. Its fix, save x[0], then loses the other rows
    once they differ. Only jax.pmap's own layout is named now."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _data_mesh()
    dat, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    small = {"w": jax.device_put(jnp.zeros((4, 1024)), dat),
             "count": jax.device_put(jnp.zeros((4,), jnp.int32), dat)}
    assert devices.tree_placement(small).problems == ()
    params = jax.device_put({"w": jnp.ones((128, 128))}, rep)
    tokens = jax.device_put(np.zeros((4, 128), np.int32), dat)
    assert devices.tree_placement({"params": params, "tokens": tokens}).problems == ()
    # the rows diverge after a step: the old fix, x[0], would have kept a quarter of the state
    stepped = jax.jit(lambda w: w + jnp.arange(4.0)[:, None])(small["w"])
    assert stepped.sharding.spec == P("data")
    assert not np.array_equal(np.asarray(stepped), np.broadcast_to(stepped[0], (4, 1024)))
    # pmap's own layout, from a jax.pmap over the same 4 devices, is still named
    rstate = jax.pmap(lambda _: {"w": jnp.zeros((1024,))})(jnp.arange(4))
    (problem,) = devices.tree_placement(rstate).problems
    assert "one value copied per device" in problem and "google/objax#163" in problem


def test_objax_163_the_kits_checksum_compile_is_left_out_of_compiles_watch():
    """The check for objax#163 compiles a small checksum jit; compiles.watch showed it as the
    user's, "jitted in a library's file" (code review, tpw.py). It is the kit's own now."""
    from helpers import compiles, render

    rstate = jax.pmap(lambda _: {"w": jnp.ones((8, 24)), "n": jnp.ones((3,), jnp.int16)})(
        jnp.arange(4))  # shapes no other test checks: the checksum compiles here
    with compiles.watch() as log:
        (problem,) = devices.tree_placement(rstate).problems
    assert "one value copied per device" in problem
    assert log.kit_compiles == 1 and log.compiles == 0
    assert [f.function for f in log.functions] == []
    text = render.compile_log_text(log)
    assert "_slice_checksums" not in text and "such as tree_placement, left out" in text


def _key_mesh():
    axis = jax.sharding.AxisType.Auto
    return jax.make_mesh((2, 2), ("data", "model"), axis_types=(axis, axis))


def test_jax_12253_an_uncommitted_prng_key_beside_mesh_params_is_replicated_not_split():
    """jax#12253: a PRNG key (uint32[2] or a typed key) and a step counter left uncommitted
    beside params on a (2,2) mesh were called "shaped like ... a batch", with advice to split
    them over 'data' (code review, key.py). They are state: the note says replicate them with
    device_put(leaf, other.sharding), and not device_put(leaf, device), which raises."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _key_mesh()
    params = jax.device_put({"w": jnp.ones((64, 64)), "b": jnp.ones((64,))},
                            NamedSharding(mesh, P()))

    def bits(k):
        return jax.random.key_data(k) if jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key) else k

    # the key is used (a jit drops unused arguments before it checks their devices)
    step = jax.jit(lambda t: t["params"]["w"].sum() + t["params"]["b"].sum()
                   + 0 * bits(t["key"]).sum())
    for key in (jax.random.PRNGKey(0), jax.random.split(jax.random.key(0), 4),
                jnp.zeros((2,), jnp.int32)):
        tree = {"params": params, "key": key}
        (problem,) = devices.tree_placement(tree).problems
        assert "as a batch is" not in problem and "P('data')" not in problem
        assert "jax.device_put(leaf, other.sharding)" in problem
        assert "Not jax.device_put(leaf, device)" in problem and "jax-ml/jax#12253" in problem
        with pytest.raises(ValueError, match="incompatible devices"):  # what it warns of
            step({**tree, "key": jax.device_put(key, jax.devices()[0])})
        fixed = {**tree, "key": jax.device_put(key, params["b"].sharding)}  # the fix
        assert devices.tree_placement(fixed).problems == ()
        assert float(step(fixed)) == 64 * 64 + 64
    # an integer batch of tokens (8 x 128 int32, 4,096 B) is still named as a batch
    tokens = jnp.asarray(np.zeros((8, 128), np.int32))
    (problem,) = devices.tree_placement({"params": params, "tokens": tokens}).problems
    assert "as a batch is" in problem and "P('data')" in problem


def test_placement_notes_ask_for_the_default_device_only_where_leaves_are_left_uncommitted():
    """`tree_placement`'s notes live in `placement_notes`, one function each; the default
    device is asked for lazily (a tree of NumPy leaves starts no backend for it)."""
    from helpers import placement_notes

    def no_device() -> str:
        raise AssertionError("asked for the default device")

    tree = {"a": np.zeros(4, np.float32), "b": 1.0}
    leaves = devices.tree_placement(tree).leaves
    assert all(isinstance(leaf, placement_notes.LeafPlacement) for leaf in leaves)
    notes = placement_notes.problems(leaves, list(tree.values()), default_device=no_device)
    assert len(notes) == 1 and "NumPy (16 B)" in notes[0]
    assert notes == (placement_notes.numpy_note(leaves),)


def test_llama_2_jax_10_an_accumulator_whole_on_one_device_beside_split_parameters_is_named():
    """Asked of the optimizer state alone (no parameter in the tree), the kit said "no problem"
    for an accumulator made outside jit with jnp.zeros(p.shape): whole on the default device
    while the parameters it mirrors are split over four (optax.MultiSteps' init)."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    params = {"w": jax.device_put(jnp.ones((1024, 256)), NamedSharding(mesh, PartitionSpec(
        "fsdp"))), "b": jax.device_put(jnp.ones(256), NamedSharding(mesh, PartitionSpec()))}
    acc = jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), params)
    assert not acc["w"].committed and len(acc["w"].devices()) == 1  # the thread's state
    (problem,) = devices.tree_placement({"acc": acc}).problems
    assert "1 leaf (['acc']['w']) is uncommitted, whole on cpu:0 (1,048,576 B)" in problem
    assert "each device holds 262,144 B of them" in problem and "llama-2-jax#10" in problem
    assert "jax.tree.map(jnp.zeros_like, params)" in problem and "out_shardings" in problem
    fixed = jax.tree.map(jnp.zeros_like, params)  # the first fix: each leaf keeps its sharding
    assert fixed["w"].sharding == params["w"].sharding
    assert devices.tree_placement({"acc": fixed}).problems == ()
    init = jax.jit(lambda p: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), p),
                   out_shardings=jax.tree.map(lambda x: x.sharding, params))
    made = init(params)  # the second fix
    assert made["w"].addressable_shards[0].data.nbytes == 262_144
    assert devices.tree_placement({"acc": made}).problems == ()
    # a small state, or one shaped like nothing split, says nothing
    assert devices.tree_placement({"acc": jnp.zeros((8, 256))}).problems == ()
    assert devices.tree_placement({"acc": jnp.zeros((512, 1024))}).problems == ()
    # with the parameters in the tree, the note for leaves beside committed ones speaks instead
    (both,) = devices.tree_placement({"p": params, "acc": acc}).problems
    assert "optax#548" in both and "llama-2-jax#10" not in both


def test_llama_2_jax_10_an_eval_batch_shaped_like_a_split_training_batch_gets_the_batch_fix():
    """A review's repro: an eval batch made with jnp.ones, shaped like the training batch split
    P("data"), was told only llama-2-jax#10's state cause and its jnp.zeros_like(params) fix.
    Split along its first dimension alone, with no sibling mirroring a replicated array, it may
    be either: the note gives the batch's cause and fix first, then the state's."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    params = {"w": jnp.ones((512, 512))}
    x = jax.device_put(jnp.ones((1024, 512)), NamedSharding(mesh, PartitionSpec("data")))
    x_eval = jnp.ones((1024, 512))  # the user's eval batch: uncommitted, whole on cpu:0
    for tree in ({"params": params, "x": x_eval}, x_eval):
        (said,) = devices.tree_placement(tree).problems
        assert "split over a mesh ({'data': 4}, 4 devices) along their first dimension only, " \
            "as a batch is, where each device holds 524,288 B" in said
        assert "if it is an eval batch made like the training one" in said
        assert "jax.device_put(np_batch, NamedSharding(mesh, P('data')))" in said
        assert said.index("np_batch") < said.index("If it is a state:") < said.index(
            "jax.tree.map(jnp.zeros_like, params)")
    step = jax.jit(lambda p, b: b @ p["w"])
    assert len(step(params, x_eval).sharding.device_set) == 1  # the cause: runs on one device
    replicated = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    assert step(replicated, x_eval).sharding.is_fully_replicated  # or each device does it all
    fixed = jax.device_put(np.ones((1024, 512), np.float32),
                           NamedSharding(x.sharding.mesh, PartitionSpec("data")))  # the fix
    assert fixed.addressable_shards[0].data.nbytes == 524_288
    assert step(replicated, fixed).sharding.spec == PartitionSpec("data")
    assert devices.tree_placement(fixed).problems == ()
    # a state split on another dimension, or mirroring a replicated bias beside it, is a state
    b = jax.device_put(jnp.ones(256), NamedSharding(mesh, PartitionSpec()))
    for_b = {"w": jnp.zeros((1024, 512)), "b": jnp.zeros(256)}
    (state,) = devices.tree_placement({"acc": for_b}).problems
    assert "as a batch is" not in state and "np_batch" not in state
    assert "a state made outside jit" in state and "jnp.zeros_like" in state
    cols = jax.device_put(jnp.ones((512, 1024)), NamedSharding(mesh, PartitionSpec(None, "data")))
    (state,) = devices.tree_placement({"acc": jnp.zeros((512, 1024))}).problems
    assert "np_batch" not in state and "a state made outside jit" in state
    del b, cols


_KERAS_21634 = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from helpers import devices
mesh = Mesh(np.array(jax.devices()), ("model",))
shapes = {"embed": (4096, 512), "w1": (512, 2048), "w2": (2048, 512)}  # 16 MiB of float32
spec = {"embed": P("model", None), "w1": P(None, "model"), "w2": P("model", None)}
sh = {k: NamedSharding(mesh, spec[k]) for k in shapes}


def init(key):
    ks = jax.random.split(key, len(shapes))
    return {k: jax.random.normal(kk, s) * 0.02 for kk, (k, s) in zip(ks, shapes.items())}
"""


def test_keras_21634_a_model_made_whole_on_one_device_beside_a_mesh_is_named_with_jit_init():
    """keras-team/keras#21634: Gemma2 9B with ModelParallel on 8 TPU chips ran out of memory
    while loading: each weight was made whole on one device, then sharded. tree_placement of
    the weights said "no problem for a jit over it" while a mesh of 4 was in use."""
    namespace: dict = {}
    exec(_KERAS_21634, namespace)  # the thread's model in miniature, on this process's devices
    init, sh, mesh = namespace["init"], namespace["sh"], namespace["mesh"]
    assert mesh.size == 4
    params = init(jax.random.key(0))  # the user's way: whole on the default device
    assert all(not w.committed and len(w.devices()) == 1 for w in params.values())
    # as Keras does, each variable is split once made: the first is, the rest wait whole
    embed = jax.device_put(params["embed"], sh["embed"])
    rest = {"w1": params["w1"], "w2": params["w2"]}  # 8 MiB
    (problem,) = devices.tree_placement(rest).problems
    assert "2 leaves (['w1'], ['w2']) are whole on cpu:0 (uncommitted, 8,388,608 B)" in problem
    assert "a mesh of 4 devices is in use ({'model': 4}, other live arrays split over it)" \
        in problem
    assert "made whole on one device and split afterwards" in problem
    assert "that device holds all of what the mesh would spread over 4" in problem
    assert "jax.jit(init, out_shardings=shardings)" in problem
    assert "about 2,097,152 B each" in problem and "keras-team/keras#21634" in problem
    del embed  # (its split copy would match params["embed"]: llama-2-jax#10's note)
    # under jax.set_mesh, the whole model says the same
    with (jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else jax.sharding.use_mesh(mesh)):
        (problem,) = devices.tree_placement(params).problems
    assert "3 leaves (['embed'], ['w1'], ['w2']) are whole on cpu:0 (uncommitted, " \
        "16,777,216 B)" in problem and "keras-team/keras#21634" in problem
    # the fix, run: each device makes only its quarter (16 MiB whole on cpu:0 the user's way)
    made = jax.jit(init, out_shardings=sh)(jax.random.key(0))
    on_0 = sum(s.data.nbytes for w in made.values() for s in w.addressable_shards
               if s.device == jax.devices()[0])
    assert on_0 == 4 * 2**20 and sum(w.nbytes for w in params.values()) == 16 * 2**20
    assert all(np.allclose(made[k], params[k]) for k in params)  # the same weights
    assert devices.tree_placement(made).problems == ()
    # and XLA's peak for it, per device, is a fraction of the whole-on-one-device init's
    from helpers import preflight

    split_peak = preflight.preflight_step(jax.jit(init, out_shardings=sh),
                                          jax.random.key(0)).peak_bytes
    assert split_peak * 3 < preflight.preflight_step(init, jax.random.key(0)).peak_bytes
    # a small tree whole on one device beside the mesh says nothing
    assert devices.tree_placement({"w": jnp.ones((512, 512))}).problems == ()
    # a 16 MiB batch is named as what it is too, with the data's fix (a review's repro: it was
    # called "a model made whole")
    batch = {"x": jnp.ones((2048, 1024)), "y": jnp.ones((2048, 1024))}
    (said,) = devices.tree_placement(batch).problems
    assert "a batch put on one device is copied from there to the others" in said
    assert "data or a loaded array with jax.device_put(np_array, sharding)" in said
    split = jax.device_put(np.ones((2048, 1024), np.float32),
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("model")))
    assert split.addressable_shards[0].data.nbytes == 2 * 2**20  # the data fix: a quarter each


def test_keras_21634_a_one_device_user_hears_nothing_of_a_mesh():
    """keras-team/keras#21634's note needs a mesh of several devices in use: on one device the
    same init, and a weight put on its one-device mesh, leave tree_placement quiet."""
    from tests.conftest import run_python

    out = run_python(_KERAS_21634 + """
params = init(jax.random.key(0))
embed = jax.device_put(params["embed"], sh["embed"])
print(len(jax.devices()), devices.tree_placement({"w1": params["w1"], "w2": params["w2"]})
      .problems, devices.tree_placement(params).problems)
""", env={"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "()", "()"], out.stdout


def test_a_replicated_leaf_of_another_process_is_not_read_as_split():
    """With several processes a replicated leaf holds here fewer bytes than a copy on each of
    its devices (2 of 4 devices are this process's), yet it is not split: the uncommitted
    leaves beside it may take its sharding (a review simulated the case; replication-first
    is for leaves beside all-split ones). The record keeps `replicated` from the sharding."""
    import dataclasses

    from jax.sharding import NamedSharding, PartitionSpec

    from helpers import placement_notes

    mesh = jax.make_mesh((4,), ("x",))
    tree = {"params": {"w": jax.device_put(jnp.ones((64, 64)), NamedSharding(
        mesh, PartitionSpec())), "b": jnp.ones((64, 32))}}
    leaves = devices.tree_placement(tree).leaves
    b, w = leaves
    assert w.replicated and not b.committed and w.local_bytes == 4 * w.nbytes
    here = dataclasses.replace(w, local_bytes=2 * w.nbytes)  # as on one of two processes
    (note,) = placement_notes.uncommitted_notes((b, here))
    assert "jax.device_put(leaf, other.sharding)" in note
    assert "other.sharding itself would split them" not in note
    split = dataclasses.replace(here, replicated=False)  # the same bytes, split: replicate
    (note,) = placement_notes.uncommitted_notes((b, split))
    assert "other.sharding itself would split them" in note


def _pmap_step(average: bool):
    def loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w"]) - y) ** 2)

    def step(p, x, y):
        g = jax.grad(loss)(p, x, y)
        if average:
            g = jax.lax.pmean(g, axis_name="devices")  # the thread's fix
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    return jax.pmap(step, axis_name="devices")


def test_nanodl_12_pmap_replicas_that_drift_apart_are_named_with_pmean():
    """HenryNdubuaku/nanodl#12 (a new user's trial): a jax.pmap trainer that never averages
    its gradients: the "replicated" parameters drift apart, silently; tree_placement said "no
    problem". And with axis_name='devices' (every step that calls pmean) pmap's outputs lie on
    a mesh of that name, which the kit did not take for pmap's: the objax#163 note was lost.
    Now the drift is named with pmean, which run leaves one value again."""
    n = 4
    w = jax.random.normal(jax.random.key(0), (64, 64)) * 0.05
    p = jax.pmap(lambda _: {"w": w})(jnp.arange(n))
    xs = jax.random.normal(jax.random.key(1), (n, 16, 64))
    ys = jax.random.normal(jax.random.key(2), (n, 16, 64))
    drifted = p
    for _ in range(3):
        drifted = _pmap_step(False)(drifted, xs, ys)
    (problem,) = devices.tree_placement(drifted).problems
    assert "nearly the same but not equal" in problem, problem
    assert "jax.lax.pmean(grads, axis_name)" in problem and "nanodl#12" in problem
    averaged = p
    for _ in range(3):
        averaged = _pmap_step(True)(averaged, xs, ys)
    assert averaged["w"].sharding.mesh.axis_names == ("devices",)
    (problem,) = devices.tree_placement(averaged).problems
    assert "one value copied per device" in problem and "google/objax#163" in problem
    assert "drifted" not in problem
    # per-device losses and a batch of similar values are no drifted copies (a review)
    losses = jax.pmap(lambda x: jnp.mean(x) + 1.0, axis_name="devices")(xs)
    temps = jax.pmap(lambda i: 290.0 + 3.0 * jnp.sin(jnp.arange(64.0) + i))(jnp.arange(n))
    assert devices.tree_placement({"loss": losses, "t": temps}).problems == ()


def _bn_step(sync: bool):  # a BatchNorm's running mean, updated from each device's shard
    def step(p, stats, x):
        def loss(p):
            h = x @ p["w"]
            return jnp.mean((h - jnp.mean(h)) ** 2), jnp.mean(h, axis=0)

        g, mean = jax.grad(loss, has_aux=True)(p)
        g = jax.lax.pmean(g, axis_name="devices")  # the gradients averaged, as in flax's example
        stats = {"mean": 0.9 * stats["mean"] + 0.1 * mean}
        if sync:
            stats = jax.lax.pmean(stats, axis_name="devices")  # the thread's fix
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), stats

    return jax.pmap(step, axis_name="devices")


def test_flax_877_batch_stats_apart_per_device_are_named_with_their_pmean_not_the_grads():
    """google/flax#877 (a new user's trial): BatchNorm statistics each device updates from its
    own shard differ per device, in a step whose gradients are averaged. The kit told such
    leaves "pmean the gradients" (WRONG: it changes nothing), or said nothing where they differ
    far, and its unreplicate fix kept device 0's alone. The statistics are named now, with
    their own pmean, which run leaves one value."""
    n = 4
    w = jax.random.normal(jax.random.key(0), (32, 32)) * 0.1
    p = jax.pmap(lambda _: {"w": w})(jnp.arange(n))
    stats = jax.pmap(lambda _: {"mean": jnp.zeros(32)})(jnp.arange(n))
    xs = jax.random.normal(jax.random.key(1), (n, 16, 32)) + jnp.linspace(-1, 1, n)[:, None, None]
    state = {"params": p, "batch_stats": stats}
    for _ in range(5):
        state["params"], state["batch_stats"] = _bn_step(False)(state["params"],
                                                                 state["batch_stats"], xs)
    (problem,) = devices.tree_placement(state).problems
    assert "1 leaf (['batch_stats']['mean']) is 4 slices, one per device, that differ" in problem
    assert "jax.lax.pmean(batch_stats, axis_name)" in problem and "flax#877" in problem
    assert "keeps device 0's alone" in problem and "pmean(grads" not in problem
    # the fix as written for outside the step, run (a review: pmean alone has no axis there)
    assert "jax.pmap(lambda s: jax.lax.pmean(s, 'i'), 'i')(batch_stats)" in problem
    synced_here = jax.pmap(lambda s: jax.lax.pmean(s, 'i'), 'i')(state["batch_stats"])
    assert (np.asarray(synced_here["mean"]) == np.asarray(synced_here["mean"])[:1]).all()
    # a value per device named like a statistic (a metric) is none (a review)
    running_loss = jax.pmap(lambda x: jnp.sum(x ** 2))(xs.reshape(n, -1))
    assert devices.tree_placement({"metrics": {"running_loss": running_loss}}).problems == ()
    synced = {"params": p, "batch_stats": stats}
    for _ in range(5):
        synced["params"], synced["batch_stats"] = _bn_step(True)(synced["params"],
                                                                  synced["batch_stats"], xs)
    (problem,) = devices.tree_placement(synced).problems
    assert "differ" not in problem and "one value copied per device" in problem
    means = np.asarray(synced["batch_stats"]["mean"])
    assert (means == means[:1]).all()
