"""HostPageStore: the bytes of the host tier for the JaxRunner (engine/host_pages.py keeps
the bookkeeping; this module only copies).

Each host slot holds exactly one page: the page's bytes from every attention layer's (k, v)
cache packed into one uint8 row (`page_bytes` long). A save gathers a run of device pages
and packs them in one compiled call whose outputs are one row per page; on a GPU the rows
are then put in `pinned_host` memory (a JAX memory kind), an asynchronous DMA that overlaps
the steps after it; on the CPU the device memory already is RAM and the rows stay where they
are. A load puts the wanted rows back on the device (a no-op on the CPU) and one compiled
call unpacks them into fresh pages; the rows stay (the prefix cache keeps them as clean
copies). A drop (a freed slot) forgets its row.

One row per slot is what keeps the host tier's real memory equal to its accounting:
slots * page_bytes, never more. (Keeping a gathered batch alive while any of its slots was
held let pinned use grow far past --host-context-mib: run 24 ran out of host memory.)
Run lengths are padded with DUMMY_PAGE to MIN_RUN_PAGES or a power of two so few shapes
compile; padding rows exist on the device only for the call. Hybrid state layers are not
paged: page copies pass them through untouched; a hybrid pause snapshot's or spilled state
checkpoint's state slot is one row of its own (`apply_state`, kept by ticket apart from page
rows until its drop).

Out of memory (device rows of a gather, pinned host rows, device rows of a load: run 24's
host pool raised RESOURCE_EXHAUSTED in a save's put) fails only the run of copies it hit:
its slots are `lost` (no row; a later drop of them is expected) or its pages `failed`, the
other copies run, and `take_failures` hands both to the runner, which fails the step's launch
with PageCopyError so the scheduler can drop what relied on them. Engine thread only.
"""
from __future__ import annotations

import functools
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.engine.host_pages import DROP, LOAD, SAVE
from ninfer_jax.engine.pages import DUMMY_PAGE

log = logging.getLogger("ninfer_jax.engine.page_store")

MAX_RUN_PAGES = 256  # pages per gather or scatter call (bounds the compiled shapes)
MIN_RUN_PAGES = 16
# Every padded run length (_padded): each is one save and one load executable.
RUN_SIZES = tuple(MIN_RUN_PAGES << i for i in range((MAX_RUN_PAGES // MIN_RUN_PAGES)
                                                     .bit_length()))
# Where the rows stay in device memory (the CPU): runs of at most this many pages. XLA:CPU
# takes 1.7, 1.4, 2.3, 2.8 and 5.9 s to compile the 16- to 256-page copies of the default
# model (a row per page is an output or input each; every server start pays them), and more
# calls cost little there (no DMA to batch).
PLAIN_MAX_RUN_PAGES = 32


# An attention layer's cache is a (k, v) tuple whose members are arrays or, for 8-bit pages,
# paged_attention.ScaledPages (codes and scales, both paged on axis 0): the copies below map
# over their leaves. State layers (hybrid models) are dicts and are not paged.


def _paged_leaves(kv) -> list:
    return [leaf for layer in kv if isinstance(layer, tuple) for leaf in jax.tree.leaves(layer)]


def _leaf_page_bytes(leaf) -> int:
    return int(np.prod(leaf.shape[1:])) * leaf.dtype.itemsize


def page_bytes(kv_spec, num_pages: int) -> int:
    """Bytes of one page across every attention layer's k and v (state layers excluded)."""
    total = sum(leaf.size * leaf.dtype.itemsize for leaf in _paged_leaves(kv_spec))
    return total // num_pages


def _state_leaves(kv) -> list:
    return [leaf for layer in kv if isinstance(layer, dict) for leaf in jax.tree.leaves(layer)]


def state_bytes(kv_spec) -> int:
    """Bytes of one state slot across every state layer (0 for dense models)."""
    return sum(_leaf_page_bytes(leaf) for leaf in _state_leaves(kv_spec))


def _pack(leaves, index):
    """[n, bytes] uint8: entries `index` (axis 0) of every leaf, bitcast (no rounding) and
    laid side by side in leaf order."""
    n = index.shape[0]
    return jnp.concatenate([jax.lax.bitcast_convert_type(leaf[index].reshape(n, -1), jnp.uint8)
                            .reshape(n, -1) for leaf in leaves], axis=1)


def _unpack(kv, kind: type, index, packed):
    """The caches with `packed` (a _pack of the layers of type `kind`) written back into
    entries `index` of those layers' leaves; the other layers untouched."""
    offset = 0

    def put(leaf):
        nonlocal offset
        width, size = _leaf_page_bytes(leaf), leaf.dtype.itemsize
        raw = packed[:, offset:offset + width].reshape(packed.shape[0], -1, size)
        offset += width
        values = jax.lax.bitcast_convert_type(raw, leaf.dtype)
        return leaf.at[index].set(values.reshape(packed.shape[0], *leaf.shape[1:]))

    # Leaf order as in _paged_leaves / _state_leaves: layers in order, tree leaves within.
    return [jax.tree.map(put, layer) if isinstance(layer, kind) else layer for layer in kv]


def pack_pages(kv, pages):
    """One uint8 row per entry of `pages`: that page's bytes in every attention layer."""
    packed = _pack(_paged_leaves(kv), pages)
    return tuple(packed[i] for i in range(pages.shape[0]))


def unpack_pages(kv, pages, rows):
    """The caches with each row of `rows` unpacked into the matching entry of `pages`."""
    return _unpack(kv, tuple, pages, jnp.stack(rows))


def pack_state(kv, slot):
    """State slot `slot` of every state layer as one uint8 row (state layers are slot-major)."""
    return _pack(_state_leaves(kv), slot[None])[0]


def unpack_state(kv, slot, row):
    """The caches with `row` (a pack_state row) unpacked into state slot `slot`."""
    return _unpack(kv, dict, slot[None], row[None])


def waves(copies) -> list[list]:
    """`copies` grouped into waves that may run one after another, each wave's copies in any
    order: a copy goes one wave after the last earlier copy touching its device page or its
    host slot. A restore that reclaims as it loads queues save, load, save, load, ... (each
    load fills the page the save before it freed); in order that is thousands of one-page
    calls, in waves it is one wave of saves and one of loads."""
    out: list[list] = []
    page_wave: dict[int, int] = {}
    slot_wave: dict[int, int] = {}
    for copy in copies:
        wave = slot_wave.get(copy.host_slot, -1)
        if copy.kind != DROP:
            wave = max(wave, page_wave.get(copy.device_page, -1))
        wave += 1
        if wave == len(out):
            out.append([])
        out[wave].append(copy)
        slot_wave[copy.host_slot] = wave
        if copy.kind != DROP:
            page_wave[copy.device_page] = wave
    return out


def _padded(values, fill: int) -> np.ndarray:
    """`values` padded to MIN_RUN_PAGES or the next power of two: few compiled shapes."""
    size = max(MIN_RUN_PAGES, 1 << max(0, len(values) - 1).bit_length())
    out = np.full(size, fill, np.int32)
    out[:len(values)] = values
    return out


def _is_out_of_memory(error: Exception) -> bool:
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


class HostPageStore:
    def __init__(self, mesh=None):
        self._rows: dict[int, object] = {}  # host slot -> its packed page
        self._lost: set[int] = set()  # slots whose save ran out of memory, until dropped
        self._failures: tuple[set, set, list] = (set(), set(), [])  # lost, failed, causes
        self._states: dict[int, object] = {}  # ticket -> a state slot's packed row
        self._pack = jax.jit(pack_pages)
        self._unpack = jax.jit(unpack_pages, donate_argnames=("kv",))
        self._pack_state = jax.jit(pack_state)
        self._unpack_state = jax.jit(unpack_state, donate_argnames=("kv",))
        # Ahead-of-time executables (compile_run): ("pack" | "unpack", run length) or
        # ("pack_state" | "unpack_state", 0). Filled on a compile thread, read here.
        self._compiled: dict[tuple[str, int], object] = {}
        self._host, self._device = _memory_shardings(mesh)
        self.max_run = MAX_RUN_PAGES if self._host is not None else PLAIN_MAX_RUN_PAGES
        self.run_sizes = tuple(size for size in RUN_SIZES if size <= self.max_run)

    @property
    def num_rows(self) -> int:
        """Host slots holding bytes here (equals the pool's used slots once copies apply)."""
        return len(self._rows)

    @property
    def num_state_rows(self) -> int:
        """State rows held here (snapshots' and spilled checkpoints', until their drop)."""
        return len(self._states)

    def clear(self) -> None:
        self._rows.clear()
        self._lost.clear()
        self._states.clear()

    def take_failures(self) -> tuple[frozenset, frozenset, str] | None:
        """(slots lost, pages failed, the first error) since the last call, or None."""
        lost, failed, causes = self._failures
        if not causes:
            return None
        self._failures = (set(), set(), [])
        return frozenset(lost), frozenset(failed), causes[0]

    def apply_state(self, kv, copy):
        """`kv` after one StateCopy (a hybrid pause snapshot's or spilled checkpoint's
        state, saved, loaded or dropped)."""
        if copy.kind == DROP:
            del self._states[copy.ticket]
            return kv
        slot = np.int32(copy.state_slot)
        if copy.kind == SAVE:
            if copy.ticket in self._states:
                raise AssertionError(f"state ticket {copy.ticket} saved while held")
            row = self._fn("pack_state", 0)(kv, slot)
            self._states[copy.ticket] = (row if self._host is None
                                         else jax.device_put(row, self._host))
            return kv
        assert copy.kind == LOAD, copy.kind
        row = self._states[copy.ticket]  # kept until its DROP (a spilled checkpoint's home)
        if self._device is not None:
            row = jax.device_put(row, self._device)
        return self._fn("unpack_state", 0)(kv, slot, row)

    def compile_run(self, kv_spec, size) -> None:
        """Compile the save and the load of `size` pages (a run length) or, for "state", a
        state snapshot's save and load, ahead of time from the caches' shapes: any thread,
        so the engine thread only runs them once (warm / warm_state). One device only (a
        mesh's copies compile in warm, where jit sees the placed caches)."""
        if size == "state":
            if not _state_leaves(kv_spec):  # nothing to copy: done (warm_state returns)
                self._compiled["pack_state", 0] = None
                return
            slot = jax.ShapeDtypeStruct((), jnp.int32)
            pack = jax.jit(pack_state).lower(kv_spec, slot).compile()
            row = jax.eval_shape(pack_state, kv_spec, slot)
            unpack = jax.jit(unpack_state, donate_argnames=("kv",)).lower(kv_spec, slot, row)
            self._compiled["unpack_state", 0] = unpack.compile()
            self._compiled["pack_state", 0] = pack
            return
        if not _paged_leaves(kv_spec):  # nothing to copy: done (warm returns)
            self._compiled["pack", size] = None
            return
        pages = jax.ShapeDtypeStruct((size,), jnp.int32)
        pack = jax.jit(pack_pages).lower(kv_spec, pages).compile()
        rows = jax.eval_shape(pack_pages, kv_spec, pages)
        unpack = jax.jit(unpack_pages, donate_argnames=("kv",)).lower(kv_spec, pages, rows)
        self._compiled["unpack", size] = unpack.compile()
        self._compiled["pack", size] = pack  # last: the pair is complete once this is in

    @property
    def pins_host(self) -> bool:
        """Whether saved rows live in pinned host memory (a GPU), so reserve_pinned acts."""
        return self._host is not None

    def reserve_pinned(self, nbytes: int) -> float:
        """Have XLA pin `nbytes` of host memory for the rows now (a GPU; elsewhere nothing):
        seconds taken. XLA's pinned pool grows by regions (cudaHostAlloc, each at least
        twice the last) inside the put that needs one, on the calling thread; from the
        engine thread a burst of saves that grew it to gigabytes stalled every stream
        (the suspect of runs 41-44's 1.4-2.1 s launch as a load level turned to decode,
        benchmarks/pinned_probe.py). Regions are kept once freed, so one put of the whole
        budget at start-up leaves room for every later row."""
        if self._host is None or nbytes <= 0:
            return 0.0
        started = time.perf_counter()
        try:  # untouched zero pages: the put reads them without the process owning the bytes
            jax.block_until_ready(jax.device_put(np.zeros(nbytes, np.uint8), self._host))
        except Exception as error:  # noqa: BLE001 - the tier still serves; saves that find
            if not _is_out_of_memory(error):  # no room fail alone (_fail), as before
                raise
            log.warning("could not pin %.2f GiB of host memory for the host tier now: %s",
                        nbytes / 2**30, error)
        return time.perf_counter() - started

    def is_compiled(self, size) -> bool:
        """Whether compile_run(size) finished (size: a run length or "state")."""
        return ("pack_state", 0) in self._compiled if size == "state" else \
            ("pack", size) in self._compiled

    def _fn(self, name: str, size: int):
        """The ahead-of-time executable of `name` at `size`, else the jitted function."""
        compiled = self._compiled.get((name, size))
        return compiled if compiled is not None else getattr(self, "_" + name)

    def warm(self, kv, size: int = MIN_RUN_PAGES):
        """Compile the save and the load of `size` pages (run_sizes; copies of DUMMY_PAGE
        onto itself), so a spill or restore of that length does not wait for a compile
        (run 41's CPU server: a first 32-page save compiled for 0.39 s inside a step's
        launch, every stream waiting)."""
        if not _paged_leaves(kv):  # no attention layer: no pages to copy
            return kv
        if size not in self.run_sizes:
            raise ValueError(f"no copy run of {size} pages (run lengths: {self.run_sizes})")
        pages = np.full(size, DUMMY_PAGE, np.int32)
        return self._fn("unpack", size)(kv, pages, self._fn("pack", size)(kv, pages))

    def warm_state(self, kv, slot: int):
        """Compile a state snapshot's save and load (slot `slot` onto itself)."""
        if not _state_leaves(kv):
            return kv
        slot = np.int32(slot)
        return self._fn("unpack_state", 0)(kv, slot, self._fn("pack_state", 0)(kv, slot))

    def apply(self, kv, copies):
        """`kv` after the plan's page copies: the same result as applying them in order,
        in few large calls (`waves`)."""
        for wave in waves(copies):
            for kind in (DROP, SAVE, LOAD):
                run = [copy for copy in wave if copy.kind == kind]
                for start in range(0, len(run), self.max_run):
                    kv = self._apply_run(kv, run[start:start + self.max_run])
        return kv

    def _apply_run(self, kv, run):
        kind = run[0].kind
        if kind == DROP:
            for copy in run:
                if copy.host_slot in self._lost:
                    self._lost.discard(copy.host_slot)
                else:
                    del self._rows[copy.host_slot]
            return kv
        if kind == SAVE:
            try:
                pages = _padded([c.device_page for c in run], DUMMY_PAGE)
                rows = self._fn("pack", len(pages))(kv, pages)
                rows = rows[:len(run)]
                if self._host is not None:
                    rows = jax.device_put(rows, self._host)  # asynchronous device -> host
            except Exception as error:  # noqa: BLE001 - only out of memory is survivable
                self._fail(error, lost=[copy.host_slot for copy in run])
                return kv
            for copy, row in zip(run, rows):
                if copy.host_slot in self._rows:
                    raise AssertionError(f"host slot {copy.host_slot} saved while held")
                self._rows[copy.host_slot] = row
            return kv
        assert kind == LOAD, kind
        unreadable = [copy for copy in run if copy.host_slot in self._lost]
        if unreadable:  # their save ran out of memory: the pages get nothing
            self._failures[1].update(copy.device_page for copy in unreadable)
            self._failures[2].append("a load read a slot whose save ran out of memory")
            run = [copy for copy in run if copy.host_slot not in self._lost]
            if not run:
                return kv
        rows = [self._rows[copy.host_slot] for copy in run]  # kept: a clean copy
        if self._device is not None:
            try:
                rows = jax.device_put(rows, self._device)
            except Exception as error:  # noqa: BLE001 - only out of memory is survivable
                self._fail(error, failed=[copy.device_page for copy in run])
                return kv
        pages = _padded([c.device_page for c in run], DUMMY_PAGE)
        rows = tuple(rows) + (rows[0],) * (len(pages) - len(rows))  # padding -> DUMMY_PAGE
        return self._fn("unpack", len(pages))(kv, pages, rows)

    def _fail(self, error: Exception, lost=(), failed=()) -> None:
        if not _is_out_of_memory(error):
            raise error
        log.error("host tier copies ran out of memory (%d saves, %d loads): %s",
                  len(lost), len(failed), error)
        self._lost.update(lost)
        self._failures[0].update(lost)
        self._failures[1].update(failed)
        self._failures[2].append(str(error))


@functools.cache
def _memory_shardings(mesh=None):
    """(host sharding, device sharding) for pinned host memory, or (None, None) where the
    device memory is host memory already (CPU) or pinned host memory is missing. With a
    tensor-parallel mesh the copies are replicated over it (the step reads them on every
    device)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return None, None
    try:
        kinds = {memory.kind for memory in device.addressable_memories()}
    except Exception:  # noqa: BLE001 - an old runtime without memory kinds
        kinds = set()
    if "pinned_host" not in kinds:
        log.warning("no pinned_host memory on %s: host tier copies stay on the device", device)
        return None, None
    if mesh is not None:
        replicated = jax.sharding.PartitionSpec()
        sharding = jax.sharding.NamedSharding
        return (sharding(mesh, replicated, memory_kind="pinned_host"),
                sharding(mesh, replicated))
    sharding = jax.sharding.SingleDeviceSharding
    return sharding(device, memory_kind="pinned_host"), sharding(device)
