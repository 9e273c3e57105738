"""The attention prologue as one op: the fused q|k|v projection's output cut into heads, the
per-head RMSNorm of q and k (Qwen3's QK-norm; none for Llama), RoPE on both, and the new K/V
stored in their cache pages.

Why: XLA runs these as a fusion or two for the norms and rotations and a scatter per cache
(run 20's 8B profile: ~20 small kernels of ~1.5 us a layer beside the products and the
attention kernels, 36 layers), where one kernel reads each head of the row once and writes q
and the two pages' rows. The model's entry point is tensor_parallel.attention_op's
`from_qkv`, which takes kernel.py on a GPU when GPU_PROLOGUE (or NINFER_ATTENTION_PROLOGUE=1)
is on and the shapes fit (one device, plain pages, power-of-two head and rotary widths), and
the model's own norms, rotations and paged_attention.write_kv otherwise: Llama / Qwen3
(model/llama.py) and the Qwen3.5 / 3.6 hybrids' gated attention (model/hybrid.py: each q
head followed by its output gate, zero-centred norms, RoPE on a quarter of the head).
reference.py is the kernel's twin. On since run 64 (native tests passed; with the vector
merge and the add + norm kernel the 8B step at 1 row 159.3 -> 166.7 tok/s on an H100).
"""
from __future__ import annotations

from ninfer_jax.kernels import dispatch

GPU_PROLOGUE = True
PROLOGUE_ENV = "NINFER_ATTENTION_PROLOGUE"  # "1" / "0" overrides GPU_PROLOGUE while tracing


def prologue_kernel_on() -> bool:
    """Whether attention_op's from_qkv takes the kernel: on a GPU backend (not forced to the
    references) with the switch on."""
    return dispatch.use_kernels() and dispatch.switch(PROLOGUE_ENV, GPU_PROLOGUE)
