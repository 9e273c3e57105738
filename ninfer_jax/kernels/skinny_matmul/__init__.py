"""A 16-bit weight times a few rows (decode): x [M, K] @ w [K, N] for M <= 16.

Why: a decode step of a dense 8B model is its projections read once (15 GB); XLA's product
of one or two rows reaches 3.4-4.2 TB/s on the H200 (run 20: gate|up 4.2, down 3.9, q|k|v
3.5, o 3.4) and the small projections lose the most. kernel.py is a split-K Triton product on
the tensor cores with the rows padded to 16 as they are loaded (a masked load, no pad copy)
and the weight tiles pipelined (num_stages), for kernel_bench's `skinny` section to weigh
against XLA's dot before any model uses it. reference.py is its twin. Not yet wired into
model/layers.linear: nothing serves through it.
"""
