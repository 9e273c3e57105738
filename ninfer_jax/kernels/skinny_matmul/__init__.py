"""A 16-bit weight times a few rows (decode): x [M, K] @ w [K, N] for M <= 16.

Why: a decode step of a dense 8B model is its projections read once (15 GB); XLA's product
of one or two rows reaches 3.4-4.2 TB/s on the H200 (run 20: gate|up 4.2, down 3.9, q|k|v
3.5, o 3.4) and the small projections lose the most. kernel.py is a split-K Triton product on
the tensor cores with the rows padded to 16 as they are loaded (a masked load, no pad copy)
and the weight tiles pipelined (num_stages), for kernel_bench's `skinny` section to weigh
against XLA's dot. Its swiglu form takes a gated MLP's gate | up product and computes
silu(gate) * up as it loads the rows, so the down product needs no activation kernel before
it. reference.py is its twin. kernels/quant_matmul.matmul (every model's `linear`) sends a
plain 16-bit weight times at most 16 rows through it on a GPU when GPU_SKINNY (or
NINFER_SKINNY_MATMUL=1) is on, and quant_matmul.swiglu_matmul (model/layers.swiglu_mlp's
down product) its swiglu form. Off: run 64 (H100) had the 8B step at 1 row 134.9 tok/s with
it against 166.7 without (8 rows 1,017 against 1,241), its native tests passed; XLA's own
products stay faster until its tiles are swept (kernel_bench.py `skinny`, run 62).
"""
from __future__ import annotations

from ninfer_jax.kernels import dispatch

GPU_SKINNY = False
SKINNY_ENV = "NINFER_SKINNY_MATMUL"  # "1" / "0" overrides GPU_SKINNY while tracing


def skinny_on() -> bool:
    """Whether quant_matmul.matmul takes the kernel for few rows of a plain weight: on a GPU
    backend (not forced to the references) with the switch on."""
    return dispatch.use_kernels() and dispatch.switch(SKINNY_ENV, GPU_SKINNY)
