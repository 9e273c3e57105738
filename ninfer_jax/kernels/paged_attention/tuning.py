"""Block sizes for the paged attention kernels, chosen per call shape at trace time.

The decode kernel is memory-bound: each program streams one KV head's pages for one row and one
split of the context. We want enough programs to cover every SM a few times (split the context
when batch x kv heads is small) while keeping each program's loop long enough to pipeline.
Figures behind the defaults are in docs/benchmarks.md (GPU section).
"""
from __future__ import annotations

import dataclasses

# Number of programs we aim for (an H200 has 132 SMs; two or three programs per SM hide the
# page-gather latency).
TARGET_PROGRAMS = 512
# Tokens one loop iteration reads per KV head (K and V each): 64 tokens x 128 dims x 2 bytes
# = 16 KiB, which leaves room for three pipeline stages of K and V in shared memory.
BLOCK_TOKENS = 64
# Never split so finely that a split holds fewer tokens than this.
MIN_SPLIT_TOKENS = 256


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
    pages_per_block: int  # pages gathered per loop iteration
    pages_per_split: int  # pages one program covers (a multiple of pages_per_block)
    num_splits: int  # programs along the context axis
    num_warps: int = 4
    num_stages: int = 3


def decode_tuning(*, batch: int, num_kv_heads: int, page_size: int, table_width: int,
                  block_tokens: int = BLOCK_TOKENS, target_programs: int = TARGET_PROGRAMS,
                  min_split_tokens: int = MIN_SPLIT_TOKENS, num_warps: int = 4,
                  num_stages: int = 3) -> DecodeTuning:
    """Pick the loop block and the context split for one decode call shape."""
    pages_per_block = max(1, block_tokens // page_size)
    blocks_in_table = -(-table_width // pages_per_block)
    max_splits = max(1, (table_width * page_size) // min_split_tokens)
    wanted = -(-target_programs // (batch * num_kv_heads))
    num_splits = max(1, min(wanted, max_splits, blocks_in_table))
    blocks_per_split = -(-blocks_in_table // num_splits)
    num_splits = -(-blocks_in_table // blocks_per_split)  # drop splits that would be empty
    return DecodeTuning(pages_per_block=pages_per_block,
                        pages_per_split=blocks_per_split * pages_per_block,
                        num_splits=num_splits, num_warps=num_warps, num_stages=num_stages)
