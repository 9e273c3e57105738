"""The residual add and the RMSNorm after it as one op: `x + delta` (the residual stream) and
its RMSNorm (plain weight or zero-centred 1 + weight).

Why: a decoder layer adds an attention (or Gated DeltaNet) output to the residual and
normalises the sum for the MLP; XLA runs the add as one fusion and the norm as another (run
57's 35B-A3B step: `loop_add_fusion` 1.7 us and the norm's fusion 1.76 us, per layer), where
one kernel can read both rows once and write both results. The model's entry point is
model/layers.py `add_rms_norm`, which takes kernel.py on a GPU when GPU_ADD_NORM (or
NINFER_ADD_NORM_KERNEL=1) is on and the model's own add and norm otherwise (the CPU's norm
sums in a fixed order, layers.mean_square). reference.py is the kernel's twin.
On since run 64 (native tests passed; with the vector merge and the attention prologue the
8B step at 1 row 159.3 -> 166.7 tok/s on an H100).
"""
from __future__ import annotations

from ninfer_jax.kernels import dispatch

GPU_ADD_NORM = True
ADD_NORM_ENV = "NINFER_ADD_NORM_KERNEL"  # "1" / "0" overrides GPU_ADD_NORM while tracing


def add_norm_kernel_on() -> bool:
    """Whether model/layers.add_rms_norm takes the kernel: on a GPU backend (not forced to
    the references) with the switch on."""
    return dispatch.use_kernels() and dispatch.switch(ADD_NORM_ENV, GPU_ADD_NORM)
