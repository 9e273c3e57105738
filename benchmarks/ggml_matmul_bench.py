"""CPU block kernel vs dequantize+XLA vs f32 XLA for Q4_1 projections, per row count M.
Run from the repository root: python benchmarks/ggml_matmul_bench.py 1 4 8 32 64 128"""
import time, sys, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, '.')
from ninfer_jax.kernels.quant_matmul import cpu, formats, reference
rng = np.random.default_rng(0)
def t(f, *a):
    f(*a).block_until_ready()
    n = 0; s = time.perf_counter()
    while time.perf_counter() - s < 0.3:
        f(*a).block_until_ready(); n += 1
    return (time.perf_counter() - s) / n * 1e3
for K, N in ((576, 1536), (576, 49152)):
    wf = rng.standard_normal((K, N)).astype(np.float32)
    w = formats.quantize(wf, "q4_1")
    for M in map(int, sys.argv[1:]):
        x = rng.standard_normal((M, K)).astype(np.float32)
        k = jax.jit(lambda x, b: cpu.matmul(x, {"q4_1": b}))
        r = jax.jit(lambda x, b: reference.matmul(x, {"q4_1": b}))
        f = jax.jit(lambda x, w: x @ w)
        print(f"K={K} N={N} M={M}: kernel {t(k, x, w['q4_1']):.3f} ms  dequant+xla {t(r, x, w['q4_1']):.3f} ms  f32 {t(f, x, wf):.3f} ms", flush=True)
