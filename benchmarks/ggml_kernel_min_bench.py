"""The CPU block kernel alone, min of N runs per product (robust to a shared host's other jobs
more than a mean): Q4_1 weights of the default model's shapes, 1, 2 and 8 rows.

    PYTHONPATH=. python benchmarks/ggml_kernel_min_bench.py LABEL
To compare two builds, copy each .so over ninfer_jax/kernels/quant_matmul/cpu/_ggml_matmul*.so
in turn and alternate runs (benchmarks/results/cpu-block/kernel_min_times.txt).
"""
import sys, time, numpy as np, jax, jax.numpy as jnp
from ninfer_jax.kernels.quant_matmul import cpu, formats
rng = np.random.default_rng(0)
def tmin(f, *a, n=300):
    f(*a).block_until_ready(); best = 1e9
    for _ in range(n):
        s = time.perf_counter(); f(*a).block_until_ready(); best = min(best, time.perf_counter() - s)
    return best * 1e3
k = jax.jit(lambda x, b: cpu.matmul(x, {"q4_1": b}))
out = []
for K, N in ((576, 192), (576, 1536), (1536, 576), (576, 49152)):
    w = formats.quantize(rng.standard_normal((K, N)).astype(np.float32), "q4_1")["q4_1"]
    for M in (1, 2, 8):
        x = rng.standard_normal((M, K)).astype(np.float32)
        out.append(f"{K}x{N} M={M}: {tmin(k, x, w, n=300 if N < 10000 else 30):.3f}")
print(sys.argv[1] if sys.argv[1:] else "kernel", " | ".join(out))
