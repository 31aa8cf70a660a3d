"""Random ``(batch, seq_len)`` windows of a host-side token array, moved to a device.

The story's last step: the tokens live in host memory (a read-only memmap, see
:func:`helpers.datasets.open_tokens`), and every training step needs a batch of random windows on
the accelerator. :class:`Batches` does it the way the benchmarks say is fast:

- **a compiled gather, one copy per byte**: where the token array can be handed to JAX's CPU
  client without a copy (a memmap always can), a jitted ``vmap`` of ``lax.dynamic_slice`` copies
  each window straight into the batch, on XLA's threads; on a CPU device that output is the batch
  itself (no ``device_put``). Otherwise, and for batches over 16 MiB, the NumPy :func:`gather`:
  fancy indexing of a sliding-window view, 256 windows per call, on up to 4 threads, into a
  fresh 4 KiB-aligned buffer (``kernel`` says which; see *The two kernels* below for why);
- **uint16 on the wire**: the batch is moved as uint16 and, if asked, converted on the device
  (half the bytes of int32);
- **int64 window starts** on the host: 10.2 billion tokens overflow int32;
- **prefetch**: a background thread gathers and ``device_put``\\ s the next batches while the
  current one is used, so a step costs the larger of gather and transfer, not their sum;
- optionally via **pinned host memory** (``memory_kind="pinned_host"``) where the device has it;
- optionally **sharded** over several devices (``sharding=NamedSharding(mesh, P("data"))``): one
  slice of the batch's rows per device, for data-parallel steps.

On the CPU backend an aligned buffer is handed to the device without a copy (``may_alias``); on a
GPU the batch is gathered on the host's CPU device and ``device_put`` copies it host→device.
Deterministic: the same seed gives the same batches, whichever kernel gathers them.

**The two kernels**: ``tokens[s:s + seq_len]`` for many ``s``.

- :func:`gather` (NumPy, any array): fancy indexing of a sliding-window view, 256 windows per
  call, on up to 4 threads, into a fresh 4 KiB-aligned buffer. Two copies per byte (the fancy
  index builds a temporary, which is then copied into the buffer), but the temporary stays in
  cache.
- :class:`CompiledGather` (XLA on a CPU device): the token array is handed to the CPU client
  without a copy (an *alias*: possible when a 64-byte-aligned address at or just before the first
  token lies in the same buffer, which holds for every ``numpy.memmap``, whose mapping starts on a
  page), and a jitted ``vmap`` of ``lax.dynamic_slice`` copies each window once, straight into
  the batch, on XLA's own threads. On a CPU device that output *is* the batch: no ``device_put``.

``benchmarks/feeding.py`` measured both (and the ideas that lost, listed in benchmarks/README.md):
random 2 KiB windows of a 1 GiB file cost DRAM latency, not copies, and the compiled gather gets
closer to that limit. Its output buffers come from XLA's allocator, which above the C library's
32 MiB limit maps fresh 4 KiB pages for every batch (16,384 page faults per 64 MiB), where NumPy's
large buffers get 2 MiB pages: hence :data:`COMPILED_MAX_BYTES`.

>>> import numpy as np
>>> tokens = np.arange(10_000, dtype=np.uint16)
>>> with Batches(tokens, 4, 16, steps=2, seed=0) as it:
...     shapes = [b.shape for b in it]
>>> shapes
[(4, 16), (4, 16)]
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from helpers import memory
from helpers._internal import jaxcompat
from helpers._internal.jaxcompat import device_name
from helpers.errors import BadInputError

__all__ = ["Batches", "CompiledGather", "aligned_empty", "gather", "naive_batch",
           "window_starts"]

ALIGN = 4096  # the NumPy kernel's buffers: page-aligned, so the CPU client can alias them
XLA_ALIGN = 64  # the CPU client aliases a host buffer only at this alignment (measured, 0.10.2)
#: batches larger than this use the NumPy kernel (see the module docstring)
COMPILED_MAX_BYTES = 16 * 2**20
ROWS_PER_PIECE = 256  # windows per fancy-index call: its temporary stays in cache
_pool: ThreadPoolExecutor | None = None


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
    """An uninitialised array whose data starts on a 4 KiB page boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + n].view(dtype).reshape(shape)


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   thread_name_prefix="helpers-gather")
    return _pool


def gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int, out: np.ndarray | None = None, *,
           parallel: bool = True) -> np.ndarray:
    """``tokens[s:s + seq_len]`` for every ``s`` in ``starts``, as one ``(len(starts), seq_len)``
    NumPy array in a fresh 4 KiB-aligned buffer (or ``out``).

    Vectorised: windows are picked by fancy indexing a sliding-window view, 256 windows per
    call (no Python loop per window), split across up to 4 threads, since random windows are
    bound by memory latency, which more cores hide, and NumPy releases the GIL while copying."""
    base = tokens.view(np.ndarray) if isinstance(tokens, np.memmap) else tokens
    windows = np.lib.stride_tricks.sliding_window_view(base, seq_len)
    starts = np.asarray(starts, dtype=np.int64)
    if out is None:
        out = aligned_empty((len(starts), seq_len), base.dtype)

    def piece(lo: int, hi: int) -> None:
        for a in range(lo, hi, ROWS_PER_PIECE):
            b = min(hi, a + ROWS_PER_PIECE)
            out[a:b] = windows[starts[a:b]]

    n = len(starts)
    if not parallel or n <= ROWS_PER_PIECE:
        piece(0, n)
        return out
    pool = _workers()
    step = -(-n // pool._max_workers)
    for f in [pool.submit(piece, lo, min(n, lo + step)) for lo in range(0, n, step)]:
        f.result()
    return out


def _alias_view(tokens: np.ndarray) -> tuple[np.ndarray, int] | None:
    """A view that starts 64-byte aligned at or before ``tokens[0]`` and ends at its last token,
    inside the same buffer, and the offset of ``tokens[0]`` in it (in tokens); None if none."""
    if tokens.ndim != 1 or not tokens.flags.c_contiguous or tokens.size == 0:
        return None
    owner = tokens
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base  # a memmap's base is its mmap, which starts on a page
    try:
        if isinstance(owner, np.ndarray):
            if not owner.flags.c_contiguous:
                return None
            region = owner.reshape(-1).view(np.uint8)
        else:
            region = np.frombuffer(owner, np.uint8)
    except (TypeError, ValueError, BufferError):  # not a buffer, or a closed mmap
        return None
    addr, low = tokens.ctypes.data, region.ctypes.data
    start = addr - addr % XLA_ALIGN
    end = addr + tokens.nbytes
    if start < low or end > low + region.nbytes or (addr - start) % tokens.itemsize:
        return None
    return region[start - low:end - low].view(tokens.dtype), (addr - start) // tokens.itemsize


def _windows(tokens, starts, seq_len: int):
    import jax
    from jax import lax

    return jax.vmap(lambda s: lax.dynamic_slice(tokens, (s,), (seq_len,)))(starts)


_jitted = None


class CompiledGather:
    """The compiled kernel for one token array on one CPU device (see the module docstring).

    :meth:`build` returns None where the tokens cannot be aliased; then use :func:`gather`.
    Calling it returns a ``(len(starts), seq_len)`` ``jax.Array`` on ``device``."""

    def __init__(self, alias, offset: int, device):
        self.alias, self.offset, self.device = alias, offset, device

    @classmethod
    def build(cls, tokens: np.ndarray, device) -> CompiledGather | None:
        import jax

        found = _alias_view(tokens)
        if found is None or getattr(device, "platform", None) != "cpu":
            return None
        view, offset = found
        # zero-copy (checked below), so no transfer for the transfer guard to log or refuse;
        # 64-bit dtypes are kept as they are (no converting copy)
        with jax.transfer_guard("allow"), jax.enable_x64(True):
            alias = jax.device_put(view, device, may_alias=True)
        if alias.unsafe_buffer_pointer() != view.ctypes.data:  # copied after all: not worth it
            alias.delete()
            return None
        kernel = cls(alias, offset, device)
        # the alias is the token file's own pages: memory.snapshot must not count it
        memory.register_borrowed(kernel, device, view.ctypes.data, alias.shape,
                                 str(alias.dtype))
        return kernel

    def __call__(self, starts: np.ndarray, seq_len: int):
        import jax

        global _jitted
        if _jitted is None:
            _jitted = jax.jit(_windows, static_argnums=2)
        starts = np.asarray(starts, dtype=np.int64) + self.offset
        # The starts (4 or 8 B a row) reach the device as a NumPy argument of the jitted call:
        # ~12 µs, where a device_put costs ~80 µs (jax 0.10.2), as much as a 64 KiB batch's
        # gather. The transfer guard would call that implicit: it is the kit's own bookkeeping,
        # so the guard neither logs nor refuses it. int32 where they fit: int64 (10.2 billion
        # tokens overflow int32) costs ~20 µs more.
        wide = self.alias.size > np.iinfo(np.int32).max
        x64 = wide or self.alias.dtype.itemsize == 8  # 64-bit tokens stay 64-bit
        with jax.transfer_guard_host_to_device("allow"), jax.enable_x64(x64):
            return _jitted(self.alias, starts if wide else starts.astype(np.int32),
                           int(seq_len))


_DONE = object()


def window_starts(n_tokens: int, batch_size: int, seq_len: int, *, seed: int = 0
                  ) -> Iterator[np.ndarray]:
    """Endless stream of int64 arrays of ``batch_size`` window starts in
    ``[0, n_tokens - seq_len]``: no window crosses the end. Deterministic for a seed."""
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise BadInputError(f"{name} must be a positive int, got {v!r}")
    if seq_len > n_tokens:
        raise BadInputError(f"seq_len={seq_len:,} is longer than the token array "
                         f"({n_tokens:,} tokens); use a shorter seq_len or a bigger file")
    rng = np.random.default_rng(seed)
    high = int(n_tokens) - int(seq_len) + 1  # exclusive

    def draw():  # a separate generator, so bad arguments raise at the call, not at next()
        while True:
            yield rng.integers(0, high, size=batch_size, dtype=np.int64)

    return draw()


def naive_batch(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """The obvious version, for comparison: one slice per window, then ``np.stack``."""
    return np.stack([tokens[int(s):int(s) + seq_len] for s in starts])


def _check_sharding(sharding, device, shape: tuple[int, int]):
    """``sharding`` if it can lay out a batch of ``shape``, else an error saying why."""
    if sharding is not None and device is not None:
        raise BadInputError("give device= or sharding=, not both (a sharding names its devices)")
    try:
        _ = sharding is None or sharding.shard_shape(shape)
    except AttributeError:
        raise TypeError("sharding must be a jax.sharding.Sharding such as NamedSharding(mesh, "
                        f"P('data')), got {type(sharding).__name__}") from None
    except ValueError as err:  # e.g. 10 rows over 8 devices
        raise BadInputError(f"cannot split a {shape} batch this way: {err}. Make batch_size a "
                            "multiple of the number of devices on the batch axis") from None
    return sharding


def _process_rows(sharding, shape: tuple[int, int]) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a batch that this process's devices hold under ``sharding``:
    every row for one process; in a multi-process job, only this process's block."""
    if sharding is None or sharding.is_fully_addressable:
        return 0, shape[0]
    ranges = {idx[0].indices(shape[0])[:2] if idx else (0, shape[0])
              for idx in sharding.addressable_devices_indices_map(shape).values()}
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    if sum(b - a for a, b in ranges) < hi - lo:
        raise BadInputError(f"this process's devices hold rows {sorted(ranges)} of the batch, "
                            "not one block: order the mesh's devices by process "
                            "(jax.make_mesh does)")
    return lo, hi


def _device_memory_kinds(device) -> set[str]:
    try:
        return {m.kind for m in device.addressable_memories()}
    except Exception:  # older JAX or a backend without memory spaces
        return set()


class Batches:
    """Iterator of device arrays ``(batch_size, seq_len)`` of random token windows.

    tokens: a 1-D NumPy array or memmap (e.g. ``datasets.open_tokens(path)``).
    device: where batches go (default: JAX's default device).
    sharding: instead of ``device``, a ``jax.sharding.Sharding`` for the ``(batch_size,
    seq_len)`` batch, e.g. ``NamedSharding(mesh, P("data"))``: each device gets its rows. In a
    multi-process job (a sharding over every process's devices) each process gathers only the
    rows its own devices hold (``rows``) and the global batch is built with
    ``jax.make_array_from_process_local_data``; every process draws the same window starts, so
    the global batch is the one a single process would make.
    prefetch: batches prepared ahead in a background thread; 0 prepares each on demand.
    steps: how many batches (None: endless).
    dtype: convert on the device after the transfer (e.g. ``"int32"``); None keeps uint16.
    pinned: stage through ``pinned_host`` memory first (needs a device that has it).

    ``kernel`` is ``"compiled"`` (XLA, one copy per byte) or ``"numpy"`` (see the module
    docstring for when each is used).

    ``timeline`` records ``(what, start, end)`` for each gather and transfer, with
    ``time.perf_counter()`` times, so you can see the overlap; ``starts_used`` records each
    batch's window starts. Both are fresh lists, copied under a lock, so they can be sliced,
    added to and looped over while the prefetch thread goes on. With ``steps`` given they hold
    every batch; endless (``steps=None``), only the newest :attr:`HISTORY` batches
    (``timeline`` has 2 entries per batch), so a long run does not grow them without end. Use
    as a context manager, or call :meth:`close`, to stop the thread early.
    """

    @property
    def timeline(self) -> list[tuple[str, float, float]]:
        """``(what, start, end)`` per gather and transfer: a copy (see the class docstring)."""
        with self._history_lock:
            return list(self._timeline)

    @property
    def starts_used(self) -> list[np.ndarray]:
        """Each batch's window starts, oldest first: a copy (see the class docstring)."""
        with self._history_lock:
            return list(self._starts_used)

    #: batches whose ``timeline`` and ``starts_used`` an endless iterator keeps (the newest)
    HISTORY = 1024

    def __init__(self, tokens, batch_size: int, seq_len: int, *, device=None, prefetch: int = 2,
                 seed: int = 0, steps: int | None = None, dtype=None, pinned: bool = False,
                 sharding=None):
        jax = jaxcompat.import_jax()
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        if tokens.ndim != 1:
            raise BadInputError(f"tokens must be 1-D, got shape {tokens.shape}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise BadInputError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if steps is not None and (not isinstance(steps, int) or steps < 0):
            raise BadInputError(f"steps must be None or an int >= 0, got {steps!r}")
        self.tokens, self.batch_size, self.seq_len = tokens, int(batch_size), int(seq_len)
        self.device = device if device is not None or sharding else jax.local_devices()[0]
        self._starts = window_starts(len(tokens), batch_size, seq_len, seed=seed)
        self.steps, self.prefetch, self.pinned = steps, prefetch, pinned
        self.sharding = _check_sharding(sharding, device, (self.batch_size, self.seq_len))
        #: the rows of each batch this process gathers: all of them, unless ``sharding`` spans
        #: several processes (a multi-process job), where each process reads only its own
        self.rows = _process_rows(self.sharding, (self.batch_size, self.seq_len))
        if pinned and self.rows != (0, self.batch_size):
            raise BadInputError("pinned=True with a sharding over several processes is not "
                                "supported: each process would stage only its rows; use "
                                "pinned=False")
        for d in (sharding.addressable_devices if sharding else [self.device]) if pinned else ():
            if "pinned_host" not in (kinds := _device_memory_kinds(d)):
                raise BadInputError(f"{device_name(d)} has no pinned_host memory "
                                    f"(it has: {sorted(kinds) or 'none'}); use pinned=False")
        self._convert = None if dtype is None else jax.jit(lambda x: x.astype(dtype))
        self._compiled = self._compiled_gather(jax)
        self.kernel = "numpy" if self._compiled is None else "compiled"
        self._direct = (self._compiled is not None and not pinned and self.sharding is None
                        and self._compiled.device == self.device)
        keep = None if steps is not None else self.HISTORY  # endless: the newest batches only
        self._timeline: deque = deque(maxlen=None if keep is None else 2 * keep)
        self._starts_used: deque = deque(maxlen=keep)
        self._history_lock = threading.Lock()
        self._made = 0
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue()  # bounded by _slots, not by its size
        # a slot per batch prepared ahead, taken before gathering: at most `prefetch` batches
        # exist beyond the one in use (each a fresh buffer: fewer of them, fewer page faults)
        self._slots = threading.Semaphore(max(1, prefetch))
        self._thread = None
        # Stop the producer when this iterator is garbage-collected unclosed: the thread holds
        # only a weak reference to it, so dropping the last reference ends both.
        self._finalizer = weakref.finalize(self, _wake_to_stop, self._stop, self._slots)
        if prefetch:
            self._thread = threading.Thread(
                target=_produce, args=(weakref.ref(self), self._stop, self._slots, self._queue),
                name="helpers-batches", daemon=True)
            self._thread.start()

    # --- producing -----------------------------------------------------------------------
    def _compiled_gather(self, jax) -> CompiledGather | None:
        """The compiled kernel where it applies: on the target itself when that is one CPU
        device (its output is then the batch), else on the first CPU device."""
        if self.batch_size * self.seq_len * self.tokens.itemsize > COMPILED_MAX_BYTES:
            return None
        where = self.device if self.sharding is None else None
        if getattr(where, "platform", None) != "cpu":
            try:
                where = jax.local_devices(backend="cpu")[0]  # this process's, in a job of many
            except RuntimeError:  # the CPU backend is switched off (JAX_PLATFORMS)
                return None
        return CompiledGather.build(self.tokens, where)

    def _one(self):
        import jax

        starts = next(self._starts)  # every process draws the same starts (the same seed)
        mine = starts if self.rows == (0, self.batch_size) else starts[slice(*self.rows)]
        t0 = time.perf_counter()
        with jax.profiler.TraceAnnotation("helpers.batches: gather"):  # seen in jax.profiler
            if self._compiled is None:
                host = gather(self.tokens, mine, self.seq_len)
            else:
                host = self._compiled(mine, self.seq_len).block_until_ready()
        t1 = time.perf_counter()
        with jax.profiler.TraceAnnotation("helpers.batches: transfer"):
            batch = self._place(jax, host)
        t2 = time.perf_counter()
        with self._history_lock:
            self._timeline.extend([("gather", t0, t1), ("transfer", t1, t2)])
            self._starts_used.append(starts)
        self._made += 1
        return batch

    def _place(self, jax, host):
        """The gathered batch where it goes (pinned staging, sharding, dtype), and ready."""
        if self._direct:  # gathered on the target device itself: this is the batch
            batch = host
        elif self.rows != (0, self.batch_size):  # this process's rows of a global batch
            batch = jax.make_array_from_process_local_data(
                self.sharding, np.asarray(host), (self.batch_size, self.seq_len))
        elif self.pinned:
            target = self.sharding or jax.sharding.SingleDeviceSharding(self.device)
            staged = jax.device_put(np.asarray(host), target.with_memory_kind("pinned_host"))
            # a bare device here is an error ("memory kind mismatch"): name the memory kind
            batch = jax.device_put(staged, target.with_memory_kind("device"))
        else:  # a sharding splits the rows: each device gets its own slice
            # np.asarray of a CPU jax.Array is a zero-copy view
            batch = jax.device_put(np.asarray(host), self.sharding or self.device, may_alias=True)
        if self._convert is not None:
            batch = self._convert(batch)
        return batch.block_until_ready()

    def _more(self) -> bool:
        return self.steps is None or self._made < self.steps

    # --- consuming -----------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        if self._thread is None:
            if not self._more():
                self._compiled = None
                raise StopIteration
            return self._one()
        item = self._queue.get()
        if item is _DONE:
            self._queue.put(_DONE)  # stay exhausted
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue.put(_DONE)
            raise item
        self._slots.release()
        return item

    def close(self) -> None:
        """Stop the background thread (if any) and drop prefetched batches."""
        self._finalizer()  # sets the stop event and wakes the producer (once)
        if self._thread is not None:
            self._thread.join()
        while True:  # drop what was prefetched, so its device memory goes now
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        # the compiled kernel's alias of the tokens is listed by jax.live_arrays() (as bytes on
        # a CPU device, though it uses none): drop it with the iterator
        self._compiled = None

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wake_to_stop(stop: threading.Event, slots: threading.Semaphore) -> None:
    """Tell a producer to stop, and wake it if it waits for a free slot."""
    stop.set()
    slots.release()


def _produce(ref: weakref.ref, stop: threading.Event, slots: threading.Semaphore,
             out: queue.Queue) -> None:
    """The prefetch thread: make batches while its :class:`Batches` lives, has more to make
    and is not closed. It holds the iterator only while making a batch, never while waiting,
    so an unclosed iterator can still be garbage-collected (which stops this thread)."""
    try:
        while True:
            owner = ref()
            if owner is None or stop.is_set() or not owner._more():
                break
            del owner
            slots.acquire()  # a free slot, or a wake-up from close / garbage collection
            owner = ref()
            if owner is None or stop.is_set():
                break
            out.put(owner._one())
            del owner
    except BaseException as err:  # handed to the consumer, raised there
        out.put(err)
        return
    finally:
        owner = ref()
        if owner is not None:
            owner._compiled = None  # no more batches: let go of the tokens' alias
        del owner
    out.put(_DONE)
