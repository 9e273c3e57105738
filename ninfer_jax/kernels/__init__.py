"""Device ops with a GPU kernel and a pure-jnp reference twin of the same signature.

paged_attention  paged KV decode (Pallas) and prefill (cuDNN) attention, the cache layout
ragged_attention a ragged step's prefill chunk plus row tokens in one call (composes the above)
quant_matmul     weight formats (host quantization) and the weight-only quantized matmul
dispatch         the trace-time switch between kernels and references (NINFER_FORCE_REFERENCE)
tiling           tile fitting shared by the Triton-lowered kernels' tunings
"""
