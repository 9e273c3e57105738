"""Block sizes for the paged attention kernels, chosen per call shape at trace time.

The decode kernel is memory-bound: each program streams one KV head's pages for one row and one
split of the context. We want enough programs to cover every SM a few times (split the context
when batch x kv heads is small) while keeping each program's loop long enough to pipeline.
Figures behind the defaults are in docs/benchmarks.md (GPU section).
"""
from __future__ import annotations

import dataclasses

# Defaults from the sweep in docs/benchmarks.md (8 rows x 32k context on the H200): many small
# programs without software pipelining win. Pipelined variants (num_stages 2-3) park K/V tiles
# in shared memory and lose occupancy: 2.0-2.4 TB/s against 3.1 TB/s unpipelined.
TARGET_PROGRAMS = 2048  # about 16 per SM (an H200 has 132)
# Tokens one loop iteration reads per KV head (K and V each): 64 x 128 dims x 2 bytes = 16 KiB.
BLOCK_TOKENS = 64
# Never split so finely that a split holds fewer tokens than this.
MIN_SPLIT_TOKENS = 128
# Cap on splits: each adds a [G, D] float32 partial per row and kv head for the merge to read.
MAX_SPLITS = 64
NUM_WARPS = 2
NUM_STAGES = 1


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
    pages_per_block: int  # pages gathered per loop iteration
    pages_per_split: int  # pages one program covers (a multiple of pages_per_block)
    num_splits: int  # programs along the context axis
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES
    # Whether the splits divide each row's own blocks (its length, read by the kernel)
    # instead of the table's: every split of a row then holds keys, whatever the table's
    # width (kernel.py FOLLOW_LENGTH_MAX_PAIRS says why).
    follow_length: bool = False


def decode_tuning(*, batch: int, num_kv_heads: int, page_size: int, table_width: int,
                  block_tokens: int = BLOCK_TOKENS, target_programs: int = TARGET_PROGRAMS,
                  min_split_tokens: int | None = None, num_warps: int = NUM_WARPS,
                  num_stages: int = NUM_STAGES, follow_length: bool = False) -> DecodeTuning:
    """Pick the loop block and the context split for one decode call shape."""
    if min_split_tokens is None:  # read at call time, so a benchmark can set the module's value
        min_split_tokens = MIN_SPLIT_TOKENS
    pages_per_block = max(1, block_tokens // page_size)
    blocks_in_table = -(-table_width // pages_per_block)
    max_splits = max(1, min(MAX_SPLITS, (table_width * page_size) // min_split_tokens))
    wanted = -(-target_programs // (batch * num_kv_heads))
    num_splits = max(1, min(wanted, max_splits, blocks_in_table))
    blocks_per_split = -(-blocks_in_table // num_splits)
    num_splits = -(-blocks_in_table // blocks_per_split)  # drop splits that would be empty
    return DecodeTuning(pages_per_block=pages_per_block,
                        pages_per_split=blocks_per_split * pages_per_block,
                        num_splits=num_splits, num_warps=num_warps, num_stages=num_stages,
                        follow_length=follow_length)
