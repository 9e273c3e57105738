"""HostPageStore: the bytes of the host tier for the JaxRunner (engine/host_pages.py keeps
the bookkeeping; this module only copies).

A save gathers a run of device pages from every attention layer's (k, v) cache into one
batch ([N, ...] per layer, N padded to 16 or a power of two with DUMMY_PAGE) and keeps, per host
slot, (batch, index). On a GPU the batch is then put in `pinned_host` memory (a JAX memory
kind), so the copy is asynchronous DMA that overlaps the steps after it; on the CPU the
device memory already is RAM and the gathered batch stays where it is. A load puts a batch
back on the device (a no-op on the CPU) and scatters the wanted indices into fresh pages
(padding rows write to DUMMY_PAGE, which absorbs writes). A batch lives while any of its
slots does, so host use can exceed the slot count by part of a batch. Hybrid state layers are
not paged: they pass through untouched. Engine thread only.
"""
from __future__ import annotations

import functools
import logging

import jax
import numpy as np

from ninfer_jax.engine.host_pages import SAVE
from ninfer_jax.engine.pages import DUMMY_PAGE

log = logging.getLogger("ninfer_jax.engine.page_store")

MAX_RUN_PAGES = 256  # pages per gather or scatter call (bounds the compiled shapes)
MIN_RUN_PAGES = 16


# An attention layer's cache is a (k, v) tuple whose members are arrays or, for 8-bit pages,
# paged_attention.ScaledPages (codes and scales, both paged on axis 0): the copies below map
# over their leaves. State layers (hybrid models) are dicts and are not paged.


def page_bytes(kv_spec, num_pages: int) -> int:
    """Bytes of one page across every attention layer's k and v (state layers excluded)."""
    total = sum(leaf.size * leaf.dtype.itemsize for layer in kv_spec
                if isinstance(layer, tuple) for leaf in jax.tree.leaves(layer))
    return total // num_pages


def gather_pages(kv, pages):
    """Per layer (k[pages], v[pages]), None for state layers."""
    return [jax.tree.map(lambda cache: cache[pages], layer) if isinstance(layer, tuple)
            else None for layer in kv]


def scatter_pages(kv, pages, batch, index):
    """The caches with batch[index] written into `pages` of every attention layer."""
    return [jax.tree.map(lambda cache, saved: cache.at[pages].set(saved[index]), layer, kept)
            if isinstance(layer, tuple) else layer for layer, kept in zip(kv, batch)]


def _padded(values, fill: int) -> np.ndarray:
    """`values` padded to MIN_RUN_PAGES or the next power of two: few compiled shapes."""
    size = max(MIN_RUN_PAGES, 1 << max(0, len(values) - 1).bit_length())
    out = np.full(size, fill, np.int32)
    out[:len(values)] = values
    return out


class HostPageStore:
    def __init__(self):
        self._slots: dict[int, tuple[object, int]] = {}  # host slot -> (batch, index)
        self._gather = jax.jit(gather_pages)
        self._scatter = jax.jit(scatter_pages, donate_argnames=("kv",))
        self._host, self._device = _memory_shardings()

    def warm(self, kv):
        """Compile the smallest save and load (a copy of DUMMY_PAGE onto itself), so the
        first spill or restore does not wait for a compile."""
        batch = self._gather(kv, _padded([DUMMY_PAGE], DUMMY_PAGE))
        return self._scatter(kv, _padded([DUMMY_PAGE], DUMMY_PAGE), batch, _padded([0], 0))

    def apply(self, kv, copies):
        """`kv` after the plan's page copies, applied in order (runs of one kind at once)."""
        run: list = []
        for copy in copies:
            if run and (copy.kind != run[0].kind or len(run) == MAX_RUN_PAGES):
                kv = self._apply_run(kv, run)
                run = []
            run.append(copy)
        return self._apply_run(kv, run) if run else kv

    def _apply_run(self, kv, run):
        if run[0].kind == SAVE:
            batch = self._gather(kv, _padded([c.device_page for c in run], DUMMY_PAGE))
            if self._host is not None:
                batch = jax.device_put(batch, self._host)  # asynchronous device -> host
            for index, copy in enumerate(run):
                self._slots[copy.host_slot] = (batch, index)
            return kv
        by_batch: dict[int, tuple[object, list, list]] = {}
        for copy in run:
            batch, index = self._slots.pop(copy.host_slot)
            entry = by_batch.setdefault(id(batch), (batch, [], []))
            entry[1].append(copy.device_page)
            entry[2].append(index)
        for batch, pages, indices in by_batch.values():
            if self._device is not None:
                batch = jax.device_put(batch, self._device)
            kv = self._scatter(kv, _padded(pages, DUMMY_PAGE), batch, _padded(indices, 0))
        return kv


@functools.cache
def _memory_shardings():
    """(host sharding, device sharding) for pinned host memory, or (None, None) where the
    device memory is host memory already (CPU) or pinned host memory is missing."""
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
    sharding = jax.sharding.SingleDeviceSharding
    return sharding(device, memory_kind="pinned_host"), sharding(device)
