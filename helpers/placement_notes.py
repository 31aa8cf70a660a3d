"""What a jit over a whole pytree meets, in words: one note for each problem of the leaves'
placement that :func:`helpers.devices.tree_placement` finds (deleted leaves, committed leaves on
different devices or meshes, leaves left behind beside a mesh, a batch whole on one device,
copies on simulated CPU devices, NumPy leaves, memory kinds mixed, a layout restored from a
checkpoint, a state replicated for jax.pmap), with its cause and its fix in one or two sentences
and the leaves' bytes. Each note takes the leaves (:class:`LeafPlacement`) and returns "" where
its problem is absent; :func:`problems` runs them all in their order."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers._internal import jaxcompat, own
from helpers._internal.records import Record

__all__ = ["LeafPlacement", "committed_apart_note", "context_mesh_note", "cpu_copies_note",
           "deleted_note", "memory_kinds_note", "mesh_order_note", "numpy_note",
           "off_default_note", "other_mesh_note", "pmap_copies_note", "problems", "split_mesh",
           "foreign_kind", "foreign_tensor_fix", "foreign_tensors_note", "uncommitted_notes",
           "unsupported_dtype_note", "unsupported_note",
           "whole_beside_split_note"]


@dataclass(frozen=True)
class LeafPlacement(Record):
    """One leaf of a pytree: its path, kind, devices, memory kind, committed or not, bytes."""

    path: str  # e.g. "['layer1']['w']"
    kind: str  # "jax.Array", "numpy.ndarray", or the Python type's name
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    devices: tuple[str, ...]  # () for NumPy and Python values
    memory_kind: str | None
    committed: bool | None  # None for NumPy and Python values
    deleted: bool = False
    #: the devices in its mesh's order, where its sharding has a mesh (two meshes over the same
    #: devices in other orders do not mix in a jit); () otherwise
    mesh_order: tuple[str, ...] = ()
    #: the bytes its shards hold on this process's devices together (as
    #: :attr:`Placement.local_bytes`): ``nbytes`` times the copies of a replicated leaf (0 for
    #: NumPy, Python values and deleted leaves)
    local_bytes: int = 0
    #: its mesh's axes and their sizes (("data", 4),), where its sharding has a mesh of the
    #: user's; () otherwise (and for jax.pmap's own mesh)
    mesh_axes: tuple[tuple[str, int], ...] = ()
    #: every device of its sharding holds all of it (``is_fully_replicated``): on several
    #: processes its bytes here are fewer than a copy on each of its devices, yet none is split
    replicated: bool = False
    #: another framework's tensor (a torch.Tensor: it has ``__dlpack__``), which JAX does not
    #: take as an array: its kind is "torch.Tensor", its shape, dtype and bytes its own
    foreign: bool = False

    @property
    def memory(self) -> str:
        """The memory its bytes are in: its memory kind, "device" where it says none."""
        return self.memory_kind or "device"



def problems(leaves: tuple[LeafPlacement, ...], arrays: list, paths: tuple[tuple, ...] = (), *,
             context_mesh: Any = None, default_device: Callable[[], str] | None = None
             ) -> tuple[str, ...]:
    """Every note that applies to the leaves of one tree, in this order: deleted leaves, leaves
    wholly on another process's devices, committed ones apart, leaves committed to one device under
    ``jax.set_mesh`` (its mesh given as ``context_mesh``), meshes of different device orders,
    uncommitted leaves beside committed ones (``default_device``: the default device's name,
    asked only then), a tree whole on one device shaped like arrays split elsewhere or beside a
    mesh in use, copies on simulated CPU devices, NumPy leaves of a dtype JAX refuses, NumPy
    leaves, memory kinds, a layout restored from a checkpoint, a state replicated for jax.pmap.
    ``arrays`` are the leaves themselves, ``paths`` their key paths."""
    here = tuple(leaf for leaf in leaves if not _elsewhere(leaf))
    notes = [deleted_note(leaves), other_process_note(leaves), committed_apart_note(leaves),
             context_mesh_note(leaves, context_mesh), mesh_order_note(leaves),
             # another process's leaves: their note's fix, not a put onto a device of theirs
             *uncommitted_notes(here, default_device), off_default_note(here, default_device),
             whole_beside_split_note(leaves, arrays, context_mesh, paths),
             cpu_copies_note(leaves),
             foreign_tensors_note(leaves), unsupported_note(leaves), numpy_note(leaves),
             memory_kinds_note(leaves, paths),
             other_mesh_note(arrays),
             pmap_copies_note(leaves, arrays)]
    return tuple(note for note in notes if note)


def deleted_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Leaves deleted (donated to a jit, or ``.delete()``): using the tree raises."""
    deleted = [leaf.path for leaf in leaves if leaf.deleted]
    if not deleted:
        return ""
    return (f"{_some(deleted)} deleted (donated to a jit, or .delete()): using the tree "
            "raises. Fix: use the outputs of the call that took them instead; or, where this "
            "tree was kept as a copy of what was donated (a best-parameters snapshot), it was "
            "the same buffers: best = params and jnp.asarray(p) copy nothing, so make it "
            "with jax.tree.map(jnp.copy, params) before the donating call (jax-ml/jax#3412).")


def other_process_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Leaves with no shard on this process's devices (a library's default device,
    ``jax.devices()[0]``, is process 0's in every process of a job: pytorch/xla#8667): this
    process can neither read them nor compute with them."""
    elsewhere = [leaf.path for leaf in leaves if _elsewhere(leaf)]
    if not elsewhere:
        return ""
    return (f"{_some(elsewhere)} wholly on another process's devices: this process holds none "
            "of their bytes, and a read or a jit over them raises here (\"non-addressable\"). "
            "Fix: make them on a device of this process, jax.local_devices()[0], not "
            "jax.devices()[0], which is process 0's in every process of a job; or, for one "
            "array over every "
            "process, put each process's part with jax.make_array_from_process_local_data "
            "(pytorch/xla#8667).")


def _elsewhere(leaf: LeafPlacement) -> bool:
    """No shard of the leaf is on this process's devices."""
    return bool(leaf.devices and leaf.nbytes and not leaf.local_bytes and not leaf.deleted)


def _committed(leaves: tuple[LeafPlacement, ...]) -> dict[tuple[str, ...], list[str]]:
    """The committed leaves' paths, by the devices they are on."""
    committed: dict[tuple[str, ...], list[str]] = {}
    for leaf in leaves:
        if leaf.committed:
            committed.setdefault(leaf.devices, []).append(leaf.path)
    return committed


def committed_apart_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Committed leaves on different devices: a jit over the tree raises."""
    committed = _committed(leaves)
    if len(committed) < 2:
        return ""
    groups = "; ".join(f"{', '.join(devs)}: {_paths(paths)}"
                       for devs, paths in committed.items())
    spread = max(committed, key=len)
    others = [leaf.path for leaf in leaves if leaf.committed and leaf.devices != spread]
    fix = ("jax.device_put(tree, device) to put every leaf in one place first" if
           len(spread) == 1 else
           _mirror_fix(leaves, others, spread).removesuffix(".") or
           "put the others where the spread ones are, replicated over their mesh "
           "(jax.device_put(leaf, NamedSharding(mesh, P())), mesh the spread leaves' "
           "sharding.mesh), or make them under that mesh: putting the whole tree on one "
           "device would gather the spread ones there")
    return (f"committed leaves sit on different devices ({groups}): a jit over the whole "
            f"tree raises 'Received incompatible devices for jitted computation'. Fix: "
            f"{fix}.")


def _last_key(path: str) -> str:
    """ "['w1']" of "['opt_state']['mu']['w1']" (the whole path where it has no key)."""
    return path[path.rfind("["):] if "[" in path else path


def _mirror_fix(leaves: tuple[LeafPlacement, ...], moved: list[str],
                devices: tuple[str, ...]) -> str:
    """The fix for leaves (``moved``) to put on the split leaves' ``devices`` where some have
    the shape of a split one there: an optimizer's moments beside the parameters they mirror
    (AI-Hypercomputer/maxdiffusion#484, a restore with no shardings), which replicated would
    hold whole on every device (4x a split one's bytes on 4 devices), each found by its shape
    and last key, any dtype (bfloat16 moments of float32 parameters; ['opt_state']['mu']['w1']
    mirrors ['params']['w1']: a bias of a weight's shape is no mirror,
    keras-team/keras#18681); "" where none do."""
    # (any dtype: moments kept in bfloat16 beside float32 parameters, optax's mu_dtype, split
    # as their parameters are: a review)
    alike = {(leaf.shape, _last_key(leaf.path)) for leaf in leaves
             if leaf.committed and leaf.devices == devices and not leaf.replicated}
    mirror = [leaf.path for leaf in leaves if leaf.path in moved and leaf.shape and
              (leaf.shape, _last_key(leaf.path)) in alike]
    if not mirror:
        return ""
    rest = (" The others (of another rank, such as a step counter, or of no split leaf's "
            "shape): replicated, jax.device_put(leaf, NamedSharding(other.sharding.mesh, P()))."
            if len(mirror) < len(moved) else "")
    return (f"put each where its like is, once: {_some(mirror)} of the shape of a "
            "split leaf (an optimizer's moments beside the parameters they mirror), so put "
            "each on that leaf's sharding, jax.device_put(leaf, other.sharding), other the "
            "split leaf (a pickled or loaded array: device_put its NumPy data straight onto "
            "the sharding); for a whole restored state, jax.device_put(state, shardings) with "
            "the shardings the run made it with (AI-Hypercomputer/maxdiffusion#484). "
            f"Replicated, each would be whole on every device.{rest}")


def context_mesh_note(leaves: tuple[LeafPlacement, ...], context_mesh: Any) -> str:
    """Leaves committed to one device while ``jax.set_mesh`` has set ``context_mesh`` (None:
    no mesh set): any operation on them in that block raises (google/orbax#3183,
    vllm-project/tpu-inference#3140, AI-Hypercomputer/maxtext#2863)."""
    alone = [leaf.path for leaf in leaves if leaf.committed and len(leaf.devices) == 1]
    if context_mesh is None or not alone:
        return ""
    return (f"{_some(alone)} committed to one device while jax.set_mesh has set a mesh "
            f"({dict(context_mesh.shape)}): inside that block any operation on them, jitted "
            "or not, raises 'Received incompatible devices ... jit's context mesh'. Fix: "
            "read them on the host (np.asarray), put them on the mesh "
            "(jax.device_put(leaf, NamedSharding(mesh, P())), replicated), or use them "
            "outside the jax.set_mesh block.")


def mesh_order_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Leaves on the same devices through meshes of different device orders: a jit over them
    raises (marin-community/levanter#635)."""
    orders: dict[tuple[str, ...], list[str]] = {}
    for leaf in leaves:
        if leaf.committed and len(leaf.mesh_order) > 1:
            orders.setdefault(leaf.mesh_order, []).append(leaf.path)
    if len(orders) < 2 or len({tuple(sorted(o)) for o in orders}) != 1:
        return ""
    listed = "; ".join(f"[{', '.join(o)}]: {_paths(paths)}" for o, paths in orders.items())
    return (f"leaves sit on the same devices through meshes of different device orders "
            f"({listed}): a jit over them raises 'Received incompatible devices for "
            "jitted computation', though the devices are the same. Fix: build every "
            "sharding from one Mesh (NamedSharding(x.sharding.mesh, spec)).")


def uncommitted_notes(leaves: tuple[LeafPlacement, ...],
                      default_device: Callable[[], str] | None = None) -> list[str]:
    """Uncommitted leaves beside leaves all committed to one place, copied there at each call:
    a batch-shaped one whole on one device beside a mesh (keras-team/keras#20007), and the rest
    (on the default device, named by ``default_device()``: an optimizer's init,
    google-deepmind/optax#548). No note, or one, or both."""
    committed = _committed(leaves)
    moved = [leaf.path for leaf in leaves if leaf.committed is False and committed
             and all(leaf.devices != devs for devs in committed)]
    if len(committed) != 1 or not moved:
        return []
    out = []
    (target,) = committed
    placed = [leaf for leaf in leaves if leaf.committed and leaf.devices == target]
    batches = _batch_like([leaf for leaf in leaves if leaf.path in moved], placed)
    if batches:
        out.append(_batch_problem(batches, target))
        moved = [path for path in moved if path not in batches]
    if not moved:
        return out
    ranks = {len(leaf.shape) for leaf in leaves if leaf.committed and leaf.devices == target}
    other_rank = any(len(leaf.shape) not in ranks for leaf in leaves if leaf.path in moved)
    # the committed leaves all split (none holds a copy on each device) and shaped like none
    # of these: their sharding would split these too, so replication comes first
    # (patrick-kidger/equinox#688's parameters beside a split batch; an unpickled copy of a
    # split leaf, jax-ml/jax#12253, takes its sharding)
    shapes = {leaf.shape for leaf in placed}
    split = (not any(leaf.replicated for leaf in placed)
             and not any(leaf.shape in shapes for leaf in leaves if leaf.path in moved))
    mirrored = _mirror_fix(leaves, moved, target) if len(target) > 1 else ""
    spread = (mirrored + " " if mirrored else
              "put them where the others are, once, replicated: jax.device_put(leaf, "
              "NamedSharding(other.sharding.mesh, P())), with other a leaf already spread "
              "there (a leaf of another rank, such as a step counter, cannot take "
              "other.sharding itself, whose spec names its dimensions). " if other_rank else
              "put them where the others are, once, replicated: jax.device_put(leaf, "
              "NamedSharding(other.sharding.mesh, P())), with other a leaf already spread "
              "there (other.sharding itself would split them as it splits the others; a "
              "pickled or loaded array: device_put its NumPy data straight onto the "
              "sharding). " if split else
              "put them where the others are, once: jax.device_put(leaf, other.sharding) "
              "with a leaf already spread there (or NamedSharding(mesh, P()) to replicate; "
              "a pickled or loaded array: device_put its NumPy data straight onto the "
              "sharding). ")
    fix = ("jax.device_put(tree, device) once" if len(target) == 1 else
           spread + "Not jax.device_put(leaf, device): a jit over the tree then raises "
           "'Received incompatible devices' (jax-ml/jax#12253); the whole tree put on one "
           "device gathers the split leaves there")
    where = {d for leaf in leaves if leaf.path in moved for d in leaf.devices}
    default = default_device() if default_device is not None else None
    made = ("uncommitted elsewhere" if where != {default} else
            f"uncommitted on the default device ({', '.join(where)}), where JAX makes a "
            "value that no committed input places (an optimizer's init from jnp.zeros: "
            "google-deepmind/optax#548)")
    if len(target) == 1:
        fix += (f", the device being {target[0]}; or make them under "
                "`with jax.default_device(device):` and call the step inside that block too "
                "(made there they stay uncommitted: dm-haiku#118's init)")
    out.append(f"{_some(moved)} {made}: a jit over the tree copies them to "
               f"{', '.join(target)} at each call they are passed to (a loop that feeds the "
               "step's outputs back copies them once: the outputs are committed there). "
               f"Fix: {fix}.")
    return out


def off_default_note(leaves: tuple[LeafPlacement, ...],
                     default_device: Callable[[], str] | None = None) -> str:
    """Leaves all uncommitted, whole on one device that is not the default device: made under
    ``with jax.default_device(d)`` (google-deepmind/dm-haiku#118's init moved there, the kit's
    own former advice), they stay uncommitted, and a jit over them outside that block runs on
    the default device and copies them there at each call. Run: jit's output lands on the
    default device. "" otherwise (a committed leaf: :func:`uncommitted_notes`)."""
    if default_device is None or not leaves or _committed(leaves) or any(
            leaf.committed is not False or len(leaf.devices) != 1 for leaf in leaves):
        return ""
    where = {leaf.devices for leaf in leaves}
    default = default_device()
    if len(where) != 1 or default in next(iter(where)):
        return ""
    (place,) = next(iter(where))
    return (f"{_some([leaf.path for leaf in leaves])} uncommitted on {place}, not the default "
            f"device ({default}): arrays made under `with jax.default_device(...)` stay "
            f"uncommitted, and a jit over the tree outside that block runs on {default} and "
            f"copies them there at each call (google-deepmind/dm-haiku#118). Fix: "
            f"jax.device_put(tree, device) once, the device being {place} (committed, a jit "
            "runs where they are); or call the step inside the same `with "
            "jax.default_device(...)` block.")


def whole_beside_split_note(leaves: tuple[LeafPlacement, ...], arrays: list,
                            context_mesh: Any = None, paths: tuple[tuple, ...] = ()) -> str:
    """A tree whose leaves sit whole on one device while a mesh of several devices is in use.
    Uncommitted leaves, 1 MiB or more together, with the shapes and dtypes of live arrays
    outside the tree split over a mesh: a state made from split parameters outside jit
    (``jnp.zeros(p.shape)`` lands whole on the default device, where ``jnp.zeros_like(p)`` keeps
    ``p``'s sharding), which holds on one device what the mesh spreads over several
    (ayaka14732/llama-2-jax#10: optax.MultiSteps' accumulator). Otherwise every array leaf on
    one and the same device, 8 MiB or more together (uncommitted, or committed where no
    ``jax.set_mesh`` is set: :func:`context_mesh_note` names those), beside ``context_mesh``
    (jax.set_mesh's) or live arrays outside the tree split over a mesh: a model made whole on
    one device before it is split (keras-team/keras#21634). "" otherwise, and with one device;
    ``arrays`` are the leaves themselves, ``paths`` their key paths. Where every live array
    they mirror is split along its first dimension only, as a data-parallel batch is, and no
    sibling leaf mirrors a live array replicated over that mesh (as a state mirrors a bias),
    the leaves may be an eval batch made like the training one: the note gives that cause and
    fix first, then the state's (:func:`_batch_or_state`)."""
    if _committed(leaves):
        return _whole_on_one(leaves, arrays, context_mesh, {})
    whole = [(leaf, x) for leaf, x in zip(leaves, arrays, strict=True)
             if leaf.committed is False and len(leaf.devices) == 1]
    if sum(leaf.nbytes for leaf, _ in whole) < 2**20:
        return ""
    live, split = _split_outside(arrays, next(iter(whole[0][1].devices())).platform)
    like = [(leaf, split[leaf.shape, leaf.dtype]) for leaf, _ in whole
            if (leaf.shape, leaf.dtype) in split]
    if (total := sum(leaf.nbytes for leaf, _ in like)) < 2**20:
        return _whole_on_one(leaves, arrays, context_mesh, split)
    mesh = like[0][1][1]
    n = len(like[0][1][0].sharding.device_set)
    share = sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
                for _, (x, _) in like)  # the shard's shape: reading a shard makes views
    device = like[0][0].devices[0]
    batch = _batch_or_state(like, leaves, paths, live, mesh)
    return (f"{_some([leaf.path for leaf, _ in like])} uncommitted, whole on {device} "
            f"({total:,} B), with the shapes and dtypes of live arrays split over a mesh "
            f"({dict(mesh.shape)}, {n} devices)"
            + (" along their first dimension only, as a batch is," if batch else "")
            + f" where each device holds {share:,} B of them: "
            + (f"if it is an eval batch made like the training one with jnp.ones or "
               "jnp.asarray, a jit over it runs whole on one device, or, beside the "
               "parameters replicated over the mesh, copies it whole to each device, which "
               "computes all of it (its output comes back replicated, not split): put it "
               "from NumPy straight onto its split, jax.device_put(np_batch, "
               f"NamedSharding(mesh, P({batch}))), mesh the split arrays' sharding.mesh "
               "(keras-team/keras#20007). If it is a state: " if batch else "a state ")
            + "made outside jit from split parameters with jnp.zeros(p.shape) it lands "
            "whole on the default device: for a model split because it does not fit on one "
            "device, that runs out of memory there (ayaka14732/llama-2-jax#10: "
            "optax.MultiSteps' accumulator). Fix: make it "
            "with their shardings, jax.tree.map(jnp.zeros_like, params) (zeros_like keeps "
            "each one's sharding) or jax.jit(init, out_shardings=...) with the parameters' "
            "shardings.")


def _split_outside(arrays: list, platform: str) -> tuple[list, dict]:
    """The live arrays of ``platform``, and of those outside ``arrays`` split over a mesh, the
    first of each shape and dtype with its mesh: ``{(shape, dtype): (array, mesh)}``."""
    live = jaxcompat.import_jax().live_arrays(platform)
    ids = {id(x) for x in arrays}
    split: dict = {}
    for x in live:
        if id(x) not in ids and (mesh := split_mesh(x)) is not None:
            split.setdefault((tuple(x.shape), str(x.dtype)), (x, mesh))
    return live, split


def _batch_or_state(like: list, leaves: tuple[LeafPlacement, ...], paths: tuple[tuple, ...],
                    live: list, mesh: Any) -> str:
    """The mesh axis, written as P's argument, to split a batch over where the leaves in
    ``like`` (each with the live array it mirrors) may be a data-parallel batch: every array
    they mirror split along its first dimension alone, and no leaf beside them (the same
    parent in the tree) mirrors an array replicated over ``mesh``, as an optimizer state
    mirrors a bias (ayaka14732/llama-2-jax#10's accumulator holds both). "" for a state."""
    for _, (x, _) in like:
        shard = tuple(x.sharding.shard_shape(x.shape))
        if not x.shape or shard[0] == x.shape[0] or shard[1:] != tuple(x.shape[1:]):
            return ""
    if len(paths) == len(leaves):
        parents = {path[:-1] for path, leaf in zip(paths, leaves, strict=True)
                   if any(leaf is mine for mine, _ in like)}
        key = _mesh_key(mesh)
        replicated = {(tuple(x.shape), str(x.dtype)) for x in live
                      if not x.is_deleted() and len(x.sharding.device_set) > 1
                      and x.sharding.is_fully_replicated
                      and (m := getattr(x.sharding, "mesh", None)) is not None
                      and getattr(m, "devices", None) is not None and _mesh_key(m) == key}
        if any(path[:-1] in parents and (leaf.shape, leaf.dtype) in replicated
               for path, leaf in zip(paths, leaves, strict=True)):
            return ""
    spec = getattr(like[0][1][0].sharding, "spec", ())
    axis = spec[0] if spec and spec[0] is not None else mesh.axis_names[0]
    if not isinstance(axis, str) and len(axis) == 1:
        (axis,) = axis
    return repr(axis if isinstance(axis, str) else tuple(axis))


#: a tree whole on one device beside a mesh in use, of this many bytes or more, is named (a
#: model made whole before it is split, keras-team/keras#21634, or a batch put on one device);
#: a smaller one costs a device little whole
_WHOLE_MODEL = 8 * 2**20


def _whole_on_one(leaves: tuple[LeafPlacement, ...], arrays: list, context_mesh: Any,
                  split: dict) -> str:
    """:func:`whole_beside_split_note`'s second case (keras-team/keras#21634): every array
    leaf whole on one device, :data:`_WHOLE_MODEL` or more together, while a mesh of several
    devices is in use (``context_mesh``, or one that the live arrays outside the tree in
    ``split``, by shape and dtype, are split over; read here where not given)."""
    placed = [leaf for leaf in leaves if leaf.devices]
    if (not placed or len({leaf.devices for leaf in placed}) != 1
            or len(placed[0].devices) != 1 or any(leaf.kind != "jax.Array" for leaf in placed)
            or (context_mesh is not None and any(leaf.committed for leaf in placed))):
        return ""  # (committed under jax.set_mesh: context_mesh_note)
    if (total := sum(leaf.nbytes for leaf in placed)) < _WHOLE_MODEL:
        return ""
    if context_mesh is not None:
        mesh, whose = context_mesh, "set by jax.set_mesh"
    else:
        if not split:
            jax = jaxcompat.import_jax()
            _, split = _split_outside(arrays, next(iter(next(
                x for x in arrays if isinstance(x, jax.Array)).devices())).platform)
        if not split:
            return ""
        mesh, whose = next(iter(split.values()))[1], "other live arrays split over it"
    n = int(mesh.size)
    state = ("committed, " if all(leaf.committed for leaf in placed) else
             "uncommitted, " if not any(leaf.committed for leaf in placed) else "")
    return (f"{_some([leaf.path for leaf in placed])} whole on {placed[0].devices[0]} "
            f"({state}{total:,} B) while a mesh of {n} devices is in use ({dict(mesh.shape)}, "
            f"{whose}): that device holds all of what the mesh would spread over {n}; a model "
            "made whole on one device and split afterwards needs all of it there first, which "
            "runs out of memory for a model larger than one device (keras-team/keras#21634), "
            "and a batch put on one device is copied from there to the others. Fix: create it "
            "split: parameters with jax.jit(init, out_shardings=shardings), so that each "
            f"device makes only its own part (about {total // n:,} B each here); data or a "
            "loaded array with jax.device_put(np_array, sharding) straight from NumPy.")


def cpu_copies_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Leaves replicated over simulated CPU devices, which share this process's RAM: the
    copies' bytes, where they reach 1 MiB (AI-Hypercomputer/maxtext#3192)."""
    copies = [leaf for leaf in leaves if leaf.local_bytes > leaf.nbytes
              and all(d.startswith("cpu:") for d in leaf.devices)]
    if (extra := sum(leaf.local_bytes - leaf.nbytes for leaf in copies)) < 2**20:
        return ""
    each = [leaf.local_bytes // max(leaf.nbytes, 1) for leaf in copies]
    n, least = max(each), min(each)  # (a leaf split over one axis of the mesh: fewer copies)
    times = (("twice" if n == 2 else f"{n} times") if least == n else
             f"{'twice' if least == 2 else f'{least} times'} to {n} times")
    split = [leaf for leaf in leaves if leaf.committed and len(leaf.devices) > 1
             and leaf.local_bytes == leaf.nbytes and leaf.nbytes]
    if split:  # replicated beside split leaves: data parallelism, on the stand-in
        return (f"{_some([leaf.path for leaf in copies])} held {times} over, replicated on "
                f"CPU devices beside {_paths([leaf.path for leaf in split])}, split over them, "
                "as data parallelism places them. On GPUs each copy is in its own device's "
                "memory, as intended; here the simulated devices share this process's RAM, "
                f"so the copies cost {extra:,} B of host memory beyond the arrays: a cost of "
                "the stand-in, not of the program (fewer simulated devices lower it).")
    return (f"{_some([leaf.path for leaf in copies])} held {times} over, replicated "
            "on CPU devices: simulated devices share this process's RAM, so the copies "
            "cost "
            f"{extra:,} B of host memory beyond the arrays. For work on the host alone "
            "(a checkpoint converted or inspected), run with one CPU device (leave "
            "JAX_NUM_CPU_DEVICES and xla_force_host_platform_device_count unset), split "
            "the leaves over the mesh instead of replicating them, or restore them as "
            "NumPy (AI-Hypercomputer/maxtext#3192).")


def unsupported_dtype_note(dtype: str | np.dtype, shape: tuple[int, ...] = ()) -> str:
    """Why JAX refuses a NumPy array of this dtype ("Dtype |V2 is not a valid JAX array
    type", jax 0.8.0 to 0.12.0.1), and what to change; "" for a dtype JAX takes. Raw bytes
    (void, ``|V2``): NumPy has no bfloat16, so a BF16 tensor read with np.frombuffer is V2
    (sgl-project/sglang-jax#1017, fixed by ``.view(ml_dtypes.bfloat16)``); one Python object
    in a 0-d object array: a pytree np.save/np.savez pickled (google-deepmind/dm-haiku#526,
    ``.item()``); text, dates, a structured array, long double."""
    try:  # (a structured dtype's text is its fields' list: "[('a', '<f4'), ...]")
        kind = np.dtype(ast.literal_eval(dtype) if isinstance(dtype, str)
                        and dtype.startswith("[") else dtype)
    except (TypeError, ValueError, SyntaxError):  # a name NumPy does not know
        return ""
    if kind.type is np.void and not kind.fields:  # (ml_dtypes' bfloat16 is kind "V" too)
        size = kind.itemsize
        view = ("x.view(ml_dtypes.bfloat16), as the file's header says BF16 (F16 reads as "
                "float16 already)" if size == 2 else
                "x.view(ml_dtypes.float8_e4m3fn) or x.view(ml_dtypes.float8_e5m2), as the "
                "file's header says" if size == 1 else
                "x.view() of the dtype the file's header names")
        return (f"a NumPy array of raw bytes ({dtype}: {size} byte{'s' if size > 1 else ''} "
                "each, NumPy's void type), which JAX refuses: NumPy has no bfloat16 or "
                "float8, so np.frombuffer or np.fromfile of such a tensor gives bytes. "
                f"Reinterpret them in place before jax.device_put: {view} (ml_dtypes comes with "
                "JAX; sgl-project/sglang-jax#1017's fix). jax.device_put alone raises the same "
                "TypeError."
                + (" np.load of a bfloat16 array that np.save wrote gives these bytes too (the "
                   "file keeps no name for the dtype): jnp.load reads it back as bfloat16, or "
                   "view it as above (jax-ml/jax#8499)." if size == 2 else ""))
    if kind.kind == "O":
        if tuple(shape) == ():
            return ("a 0-d NumPy object array: one Python object, pickled, as np.save or "
                    "np.savez store a dict of arrays and np.load(allow_pickle=True) gives it "
                    "back. JAX refuses it; x.item() is the object itself (the dict, a pytree of "
                    "arrays JAX takes), or save the arrays flat, one name each "
                    "(np.savez(path, **flat), safetensors) (google-deepmind/dm-haiku#526).")
        return ("a NumPy object array (one Python object per element), which JAX refuses: "
                "np.stack the arrays it holds, or give it a numeric dtype.")
    if kind.kind in "US":
        return (f"a NumPy array of text ({dtype}), which JAX refuses: JAX holds numbers only; "
                "map the strings to integer ids on the host and pass those.")
    if kind.kind in "Mm":  # (a review: these were advised jax.device_put, which raises)
        return (f"a NumPy array of {'dates' if kind.kind == 'M' else 'durations'} ({dtype}), "
                "which JAX refuses: pass their counts, x.astype('int64') (in the unit of the "
                "dtype, as x.view('int64') reads them).")
    if kind.fields:
        return (f"a NumPy structured array ({len(kind.fields)} fields), which JAX refuses: "
                "pass each field as an array of its own, {name: x[name] for name in "
                "x.dtype.names}.")
    if kind.kind in "fc" and kind.itemsize > (16 if kind.kind == "c" else 8):
        return (f"a NumPy array of {dtype} (long double), which JAX refuses: "
                f"x.astype(np.{'complex128' if kind.kind == 'c' else 'float64'}), the widest "
                "JAX holds (with jax_enable_x64 on).")
    return ""


def foreign_kind(kind: type) -> str:
    """How the notes name another framework's tensor type: its package and class,
    "torch.Tensor" (torch.Tensor's module is torch itself; a class deeper in a package keeps
    only the package's name)."""
    return f"{kind.__module__.split('.')[0]}.{kind.__name__}"


def foreign_tensor_fix(kind: str) -> str:
    """Why JAX refuses another framework's tensor (``kind``: "torch.Tensor") as an argument
    ("Error interpreting argument ... as an abstract array", jax 0.8.0 to 0.12.0.1), and how to
    convert it: DLPack, or NumPy on the host; a PyTorch DataLoader's batches collated to NumPy
    (jax-ml/jax#1004: the docs' collate, fixed in jax-ml/jax#17929)."""
    loader = (" For a PyTorch DataLoader, collate its batches to NumPy: collate_fn=lambda b: "
              "jax.tree.map(np.asarray, default_collate(b)) (jax-ml/jax#1004, the docs' fix in "
              "jax-ml/jax#17929)." if kind.startswith("torch.") else "")
    return (f"a {kind}, another framework's tensor, which JAX does not take as an array: a "
            "jit over it raises 'Error interpreting argument ... as an abstract array'. Convert "
            "it first: jnp.from_dlpack(x) (DLPack, no round trip through NumPy), or "
            f"np.asarray(x) on the host.{loader}")


def foreign_tensors_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """Leaves that are another framework's tensors (:func:`foreign_tensor_fix`)."""
    foreign = [leaf for leaf in leaves if leaf.foreign]
    if not foreign:
        return ""
    total = sum(leaf.nbytes for leaf in foreign)
    return (f"{_some([leaf.path or '(root)' for leaf in foreign])} "
            f"{foreign_tensor_fix(foreign[0].kind)} ({total:,} B)")


def unsupported_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """NumPy leaves of a dtype JAX refuses (:func:`unsupported_dtype_note`): a jit over the
    tree raises, and jax.device_put of it too."""
    bad = [(leaf, why) for leaf in leaves if leaf.kind == "numpy.ndarray"
           and (why := unsupported_dtype_note(leaf.dtype, leaf.shape))]
    if not bad:
        return ""
    leaf, why = bad[0]
    more = f" ({len(bad) - 1} more such leaves)" if len(bad) > 1 else ""
    return f"{leaf.path or '(root)'} ({leaf.dtype}{list(leaf.shape)}){more} is {why}"


def numpy_note(leaves: tuple[LeafPlacement, ...]) -> str:
    """NumPy leaves: copied host to device on every call they are passed to (used in place by
    a CPU device where aligned: :func:`helpers.devices.placement`), which a batch new
    at each step needs anyway (jax-ml/jax#16905); data passed again gains from one put. Leaves
    JAX refuses are :func:`unsupported_note`'s."""
    numpy = [leaf for leaf in leaves if leaf.kind == "numpy.ndarray"
             and not unsupported_dtype_note(leaf.dtype, leaf.shape)]
    if not numpy:
        return ""
    total = sum(leaf.nbytes for leaf in numpy)
    return (f"{_some([leaf.path for leaf in numpy])} NumPy ({total:,} B): a jit copies "
            "them host to device on every call they are passed to (a CPU device uses one "
            "that is C-contiguous and aligned to 64 bytes in place: devices.placement(leaf) "
            "says which, jax-ml/jax#40789), the one copy a batch "
            "new each step needs: pass it as NumPy (a jax.device_put of it just before "
            "the step only adds its own dispatch: jax-ml/jax#16905), or put the next "
            "batch while this step runs (flax.jax_utils.prefetch_to_device), onto the "
            "step's sharding where it is split. Only data passed again unchanged gains "
            "from jax.device_put(tree) once, keeping the result.")


def memory_kinds_note(leaves: tuple[LeafPlacement, ...], paths: tuple[tuple, ...] = ()) -> str:
    """Leaves in host memory beside device-memory ones: a small part of a state left in
    another kind than the rest of it (marin-community/marin#8515), else the host-memory
    leaves and how a step brings them in. ``paths``: the leaves' key paths."""
    kinds = {leaf.memory for leaf in leaves if leaf.devices}
    if len(kinds) < 2:
        return ""
    if stray := _stray_memory_kinds(leaves, paths):
        return stray
    host = [leaf.path for leaf in leaves if leaf.devices
            and leaf.memory != "device"]
    return (f"{_some(host)} in host memory ({', '.join(sorted(kinds - {'device'}))}) "
            "beside device-memory leaves: an operation on both raises (their memory "
            "spaces differ), so a step brings them in for the computation, "
            "jax.device_put(x, jax.memory.Space.Device) inside jit (and returns them "
            "with out_shardings in their memory, where they are offloaded on purpose); "
            "where they are not meant to be offloaded, put them in device memory once, "
            "jax.device_put(leaf, leaf.sharding.with_memory_kind('device')).")


def split_mesh(x: Any) -> Any:
    """The mesh a live array is split over (not replicated, on several devices); else None."""
    mesh = getattr(x.sharding, "mesh", None)
    if (mesh is None or getattr(mesh, "devices", None) is None or x.is_deleted()
            or len(x.sharding.device_set) < 2 or x.sharding.is_fully_replicated):
        return None
    return mesh


def _mesh_key(mesh: Any) -> tuple:
    """Its axes and their sizes (two orders of one shape are another problem, named apart)."""
    return tuple(mesh.shape.items())


def other_mesh_note(arrays: list) -> str:
    """A tree split over a mesh that no other live array uses, while other live arrays are
    split over another mesh: the layout a checkpoint was saved with, restored into a target
    without shardings (google/flax#5110, jax-ml/jax#19656). "" otherwise."""
    jax = jaxcompat.import_jax()
    meshes = {_mesh_key(m): m for x in arrays if isinstance(x, jax.Array)
              and (m := split_mesh(x)) is not None}
    if len(meshes) != 1:
        return ""
    (key, mesh), = meshes.items()
    platform = next(iter(mesh.devices.flat)).platform
    ids = {id(x) for x in arrays}
    others = {}
    for x in jax.live_arrays(platform):
        if id(x) in ids or (theirs := split_mesh(x)) is None:
            continue
        if _mesh_key(theirs) == key:
            return ""  # other arrays use this tree's mesh too: nothing stands out
        others[_mesh_key(theirs)] = theirs
    # one other mesh, with the same axes in other sizes: the same model's mesh on another
    # slice (a 2-D model mesh beside a 1-D data mesh is a design, not a restore)
    if len(others) != 1 or set(next(iter(others.values())).axis_names) != set(mesh.axis_names):
        return ""
    (other,) = others.values()
    return (f"the tree is split over a mesh ({dict(mesh.shape)}) that no other live array "
            f"uses, while other arrays are split over the same axes in other sizes "
            f"({dict(other.shape)}): a step given this tree compiles again for its layout, and "
            "a jit over it beside arrays of the other mesh raises 'Mesh for all inputs should "
            "be equal' where the axes are Explicit (jax.make_mesh's default on jax 0.10.2). "
            "A checkpoint restored into a target without shardings comes back in the layout "
            "it was saved with (google/flax#5110). Fix: give the restore target shardings, "
            "jax.ShapeDtypeStruct(shape, dtype, sharding=...) or "
            "jax.eval_shape(jax.jit(init, out_shardings=...)) (jax.eval_shape of a function "
            "with with_sharding_constraint inside gives none: jax-ml/jax#19656); or "
            "jax.device_put(tree, shardings on the other mesh) once.")


def _pmap_laid_out(x: Any, jax: Any) -> bool:
    """Laid out as jax.pmap lays out: a PmapSharding (jax.device_put_replicated, jax 0.8.0) or
    a one-axis mesh, a leading axis as long as the devices it is on, one slice of it on each
    (all in this process). The mesh is pmap's own (:func:`_pmap_own`) or one of another name,
    which is pmap's with an axis_name (jax.pmap(f, axis_name='devices') names its outputs' mesh
    so on jax 0.10.2) or the user's own: a batch of one row per device, or a zero-initialised
    FSDP state whose slices will differ, looks the same, so the caller asks more of it."""
    if not isinstance(x, jax.Array) or x.is_deleted() or not x.ndim or x.shape[0] < 2:
        return False
    mesh = getattr(x.sharding, "mesh", None)
    if type(x.sharding).__name__ != "PmapSharding" and (
            mesh is None or not (jaxcompat.is_pmap_mesh(mesh)
                                 or len(getattr(mesh, "axis_names", ())) == 1)):
        return False
    if not x.is_fully_addressable or len(x.sharding.device_set) != x.shape[0]:
        return False
    return tuple(x.sharding.shard_shape(tuple(x.shape))) == (1, *x.shape[1:])


def _pmap_own(x: Any) -> bool:
    """The array's mesh is jax.pmap's own by its axis name (no axis_name given), or it has a
    PmapSharding: no user's mesh."""
    mesh = getattr(x.sharding, "mesh", None)
    return type(x.sharding).__name__ == "PmapSharding" or (
        mesh is not None and jaxcompat.is_pmap_mesh(mesh))


def _slice_checksums(xs: list) -> list:
    """Two position-weighted sums of each slice's bits, each device taking its own slice's:
    differing sums prove the slices differ. The compiled program has no collective (checked on
    4 CPU devices, jax 0.8.0 and 0.10.2; not yet run on a GPU), so no slice moves."""
    jnp = jaxcompat.import_jax().numpy
    lax = jaxcompat.import_jax().lax
    out = []
    for x in xs:
        flat = x.reshape(x.shape[0], -1)
        if flat.dtype == jnp.bool_:
            flat = flat.astype(jnp.uint8)
        size = flat.dtype.itemsize
        bits = lax.bitcast_convert_type(
            flat, {1: jnp.uint8, 2: jnp.uint16}.get(size, jnp.uint32))
        bits = bits.reshape(x.shape[0], -1).astype(jnp.uint32)
        idx = lax.broadcasted_iota(jnp.uint32, bits.shape, 1)
        out.append(jnp.stack([jnp.sum(bits * (2 * idx + 1), axis=1),
                              jnp.sum((bits ^ (idx * jnp.uint32(0x9E3779B9)))
                                      * jnp.uint32(0x85EBCA6B), axis=1),
                              jnp.any(bits != bits[:, :1], axis=1).astype(jnp.uint32)],
                             axis=1))
    return out


_checksums = None  # jax.jit(_slice_checksums), made at its first use


def _equal_slices(xs: list, jax: Any) -> list[bool]:
    """Whether each pmap-laid-out array's slices are all equal, by their checksums (one small
    program over all of them, the kit's own compile). Their bytes are not read: reading a
    shard (``s.data``) makes JAX cache an Array over it, which later counts of live memory
    would meet as a host read's views (jax-ml/jax#26216)."""
    global _checksums
    if _checksums is None:
        _checksums = jax.jit(_slice_checksums)
    with own.compiling():  # the kit's compile, not the user's: compiles.watch skips it
        sums = [np.asarray(c) for c in _checksums(xs)]
    # (equal, and varying within a slice: a slice of one repeated value, zeros, proves little)
    return [(bool((c[:, :2] == c[:1, :2]).all()), bool(c[:, 2].any())) for c in sums]


def _drifted(x: Any, jax: Any, most: int = 64) -> float | None:
    """For a float array laid out as pmap's whose slices differ: the largest difference from
    the first slice at up to ``most`` evenly spaced positions, relative to its largest value,
    where every slice differs from it by under a quarter of the spread of its own values
    (copies of one value that drifted apart); None where they differ more (different values:
    a batch), not at all, or a slice holds fewer than 8 values. Reads those positions only."""
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] < 8:  # a per-device loss or a few values: nothing to tell copies by
        return None
    idx = np.linspace(0, flat.shape[1] - 1, min(most, flat.shape[1])).astype(np.int32)
    with own.compiling():
        sample = np.asarray(jax.device_get(flat[:, idx]), dtype=np.float64)
    spread, scale = float(sample[0].std()), float(np.abs(sample[0]).max())
    if not np.isfinite(sample).all() or spread == 0 or scale == 0:
        return None
    # copies that drifted differ far less than the values within a slice do; different data
    # (a batch of temperatures about 290 +- 3: a review) differs about as much
    if float(np.abs(sample - sample[:1]).max()) > 0.25 * spread:
        return None
    gap = float(np.abs(sample - sample[:1]).max() / scale)
    return gap if gap > 0 else None


#: a leaf's path that names running statistics, a state no gradient updates (flax's
#: "batch_stats" collection, a "running_mean", a "moving_variance")
_RUNNING_STATS = re.compile(r"batch_stats|(?:running|moving)_(?:mean|var)|_ema\b|mean_ema|"
                            r"var_ema|\bstats\b|_stats\b")


def _stats_note(paths: list[str], n: int, copies: bool) -> str:
    """Running statistics with a different slice on each device: each device updated them
    from its own shard of the batch, and the step's pmean of the gradients never touches them,
    so an eval or a save of one device's copy depends on which (google/flax#877: logits apart
    by up to 0.87 in a new user's trial; 0.0 once averaged)."""
    keeps = (" Taking slice 0 of the state (the unreplicate above) keeps device 0's alone."
             if copies else "")
    return (f"{_some(paths)} {n} slices, one per device, that differ: running statistics "
            "(BatchNorm's mean and variance) that each device updates from its own shard of "
            "the batch, which averaging the gradients never touches, so an evaluation or a "
            f"save depends on the device its copy comes from.{keeps} Fix: average them across "
            "the devices, jax.lax.pmean(batch_stats, axis_name) in the step, or before "
            "evaluating and saving with a pmap of its own, jax.pmap(lambda s: "
            "jax.lax.pmean(s, 'i'), 'i')(batch_stats) (flax's sync_batch_stats), or give "
            "BatchNorm axis_name= so it averages the batch's statistics over the devices "
            "(google/flax#877).")


def pmap_copies_note(leaves: tuple[LeafPlacement, ...], arrays: list) -> str:
    """Leaves that hold one copy of a value per device, as a state replicated for jax.pmap does
    (flax.jax_utils.replicate): a save or a device_get copies every one (google/objax#163).
    "" where none does, or where a leaf's dtype cannot be compared (a typed PRNG key)."""
    jax = jaxcompat.import_jax()
    laid = [(leaf, x) for leaf, x in zip(leaves, arrays, strict=True)
            if _pmap_laid_out(x, jax) and (
                jax.numpy.issubdtype(x.dtype, jax.numpy.number) or x.dtype == jax.numpy.bool_)]
    if not laid:
        return ""
    try:
        equal = _equal_slices([x for _, x in laid], jax)
    except Exception:  # a dtype or layout the check cannot take: say nothing
        return ""
    # on a mesh of the user's name only slices that vary inside (not zeros made split)
    copies = [(leaf, x) for (leaf, x), (same, varies) in zip(laid, equal, strict=True)
              if same and (varies or _pmap_own(x))]
    drift = ""
    # statistics each device updates from its own batch (BatchNorm's running mean and
    # variance): never averaged by a pmean of the gradients, and apart however far
    stats = [leaf.path for (leaf, x), (same, _) in zip(laid, equal, strict=True)
             if not same and _RUNNING_STATS.search(leaf.path) and x.ndim >= 2  # (a value per
             and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]  # device: a metric; a review)
    try:
        apart = [(leaf, gap) for (leaf, x), (same, _) in zip(laid, equal, strict=True)
                 if not same and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
                 and leaf.path not in stats and (gap := _drifted(x, jax)) is not None]
    except Exception:  # a layout the sample cannot take: say nothing of it
        apart = []
    if apart:
        n = laid[0][1].shape[0]
        drift = (f"{_some([leaf.path for leaf, _ in apart])} {n} slices, one per device, "
                 f"that are nearly the same but not equal (up to {max(g for _, g in apart):.1e} "
                 "of the largest value apart, at sampled positions): copies of one value that "
                 "drifted apart, as the parameters of a jax.pmap step do when its gradients "
                 "are not averaged across devices, each device following its own batch's. "
                 "Fix: grads = jax.lax.pmean(grads, axis_name) in the step before the update "
                 "(HenryNdubuaku/nanodl#12), then start again from one copy.")
    if stats:
        n = laid[0][1].shape[0]
        drift = " ".join(x for x in (_stats_note(stats, n, bool(copies)), drift) if x)
    if not copies:
        return drift
    n = max(x.shape[0] for _, x in copies)
    total = sum(leaf.nbytes for leaf, _ in copies)
    one = sum(leaf.nbytes // x.shape[0] for leaf, x in copies)
    how = "slices of equal checksums"  # two 32-bit sums of each slice's bits, position-weighted
    return (f"{_some([leaf.path for leaf, _ in copies])} one value copied per device, as a "
            f"state replicated for jax.pmap is (flax.jax_utils.replicate): a leading axis of {n} "
            f"{how}, one on each device, {total:,} B for {one:,} B of values; a save or "
            f"jax.device_get of it writes or copies all {n} (google/objax#163). Fix: save "
            "jax.tree.map(lambda x: x[0], state) (flax: jax_utils.unreplicate(state)), and "
            "replicate it again after loading." + (" " + drift if drift else ""))


def _batch_like(moved: list[LeafPlacement], placed: list[LeafPlacement]) -> dict[str, str]:
    """Of the uncommitted leaves beside leaves committed to a mesh of several devices, those
    shaped like a batch: of a shape no committed leaf has (an optimizer's state has the
    parameters' shapes), their first dimension divided by an axis of that mesh; never a PRNG
    key or a small integer leaf (:func:`_key_or_counter`). Each one's path and the axis to
    split it over (an axis named for data or batch first)."""
    axes = [(name, size) for leaf in placed[:1] for name, size in leaf.mesh_axes if size > 1]
    if len(placed[0].devices if placed else ()) < 2 or not axes:
        return {}
    axes.sort(key=lambda a: not any(w in a[0].lower() for w in ("data", "batch")))
    shapes = {leaf.shape for leaf in placed}
    found = {}
    for leaf in moved:
        if _key_or_counter(leaf) or _named_as_state(leaf.path):
            continue
        if leaf.shape and leaf.shape not in shapes and (axis := next(
                (name for name, size in axes if leaf.shape[0] % size == 0), None)):
            found[leaf.path] = axis
    return found


#: keys in a leaf's path that name a model's or an optimizer's state, never a batch (whole
#: keys: "states", "model_inputs" and "sample_weights" are batches)
_STATE_KEYS = frozenset({"params", "param", "parameters", "weights", "weight", "kernel", "bias",
                         "model", "opt_state", "optimizer_state", "mu", "nu", "ema_params",
                         "variables", "trainable_variables"})
#: keys that name a batch, whatever else the path says
_BATCH_KEYS = frozenset({"batch", "data", "inputs", "x", "y", "images", "labels", "tokens"})


def _named_as_state(path: str) -> bool:
    """Whether a key in the leaf's path (``['params']['w1']``) names state: parameters of a
    model never put on the mesh beside a split batch (patrick-kidger/equinox#688) are shaped
    like no committed leaf, as a batch is, and were advised as one."""
    keys = re.findall(r"\['([^']*)'\]|\.(\w+)", path)
    names = {k.lower() for pair in keys for k in pair if k}
    return bool(names & _STATE_KEYS) and not names & _BATCH_KEYS


#: integer leaves under this many bytes are state (a step counter, keys split for a few
#: devices), not a batch: a batch of tokens of 4 rows of 128 int32 is 2,048 B
_SMALL_INTEGERS = 1024


def _key_or_counter(leaf: LeafPlacement) -> bool:
    """A PRNG key (a typed key, key<fry>) or a small integer leaf (a raw key, uint32[2], a
    step counter): state to replicate, never a batch to split (jax-ml/jax#12253's note)."""
    if leaf.dtype.startswith("key<"):
        return True
    try:
        integer = np.dtype(leaf.dtype).kind in "iu"
    except TypeError:
        return False
    return integer and (len(leaf.shape) < 2 or leaf.nbytes < _SMALL_INTEGERS)


def _batch_problem(batches: dict[str, str], target: tuple[str, ...]) -> str:
    """A batch-shaped leaf left whole on one device beside leaves on a mesh (keras#20007)."""
    axis = next(iter(batches.values()))
    return (f"{_some(list(batches))} uncommitted on one device and shaped like none of the "
            f"leaves committed to {len(target)} devices, as a batch is: a jit over the tree "
            f"copies it whole to each of the {len(target)} devices at each call. If it is a "
            "data-parallel batch, put each one from NumPy straight onto its split, "
            f"jax.device_put(np_batch, NamedSharding(mesh, P({axis!r}))), mesh the others' "
            "sharding.mesh, not through jnp.asarray (which lands it whole on one device: "
            "keras-team/keras#20007) nor replicated (each device would hold all of it): split "
            "so beside replicated leaves, it is data parallelism; if it is state made once, "
            "put it there once, jax.device_put(leaf, NamedSharding(mesh, P())).")


def _stray_memory_kinds(leaves: tuple[LeafPlacement, ...], paths: tuple[tuple, ...]
                        ) -> str | None:
    """The problem of leaves kept in another memory kind than the rest of their own state: in
    a node of the tree (deepest first), a child (a leaf, or a subtree of one kind) holding
    under a sixteenth of the node's bytes in another kind than the one that holds most of
    them (marin-community/marin#8515: Adam's scalar ``count`` left in device memory beside
    its offloaded ``mu`` and ``nu``). Parameters on the device beside an offloaded optimizer
    state (no small part: placed so on purpose) name no leaf: None then."""
    if len(paths) != len(leaves):
        return None
    placed = [(path, leaf) for path, leaf in zip(paths, leaves, strict=True) if leaf.devices]
    nodes: dict[tuple, list] = {}
    for path, leaf in placed:
        for depth in range(len(path)):
            nodes.setdefault(path[:depth], []).append((path, leaf))
    for node in sorted(nodes, key=len, reverse=True):
        inside = nodes[node]
        by_kind: dict[str, int] = {}
        children: dict[Any, list[LeafPlacement]] = {}
        for path, leaf in inside:
            kind = leaf.memory
            by_kind[kind] = by_kind.get(kind, 0) + leaf.nbytes
            children.setdefault(path[len(node)], []).append(leaf)
        if len(by_kind) < 2:
            continue
        total = sum(by_kind.values())
        meant = max(by_kind, key=lambda k: by_kind[k])
        stray = [leaf for part in children.values()
                 if 16 * sum(leaf.nbytes for leaf in part) < total
                 and len({leaf.memory for leaf in part}) == 1
                 and part[0].memory != meant for leaf in part]
        if not stray:
            continue
        rest = [leaf for _, leaf in inside if leaf.memory == meant]
        where = "".join(str(k) for k in node) or "the tree"
        kind = stray[0].memory
        return (f"{_some([leaf.path for leaf in stray])} in {kind} memory while the rest of "
                f"{where} ({_paths([leaf.path for leaf in rest])}, "
                f"{sum(leaf.nbytes for leaf in rest):,} B) is in {meant}: a step that returns "
                f"it in {meant} (out_shardings) is compiled again at its second call, for the "
                "new memory kind (marin-community/marin#8515: Adam's count initialized on the "
                "device beside an offloaded state). Fix: put it where the rest is before the "
                "first call, jax.device_put(leaf, "
                f"leaf.sharding.with_memory_kind('{meant}')).")
    return None


def _paths(paths: list[str], most: int = 3) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most
                                      else "")


def _some(paths: list[str]) -> str:
    """ "1 leaf (['w']) is" / "3 leaves (['a'], ['b'], ['c']) are": the subject of a problem."""
    return (f"1 leaf ({_paths(paths)}) is" if len(paths) == 1
            else f"{len(paths)} leaves ({_paths(paths)}) are")

