"""Speculative decoding: the backends, the drafter interface, the n-gram drafter, acceptance.

A speculative round of one sequence verifies K drafted tokens in one ordinary ragged step: the
scheduler plans K + 1 DecodeRows of the sequence at consecutive positions p..p+K, tokens
[last committed token, d_1..d_K], all on its page table (pages reserved for p + K). Every
row's KV is written before attention runs and row i attends keys 0..p+i, so row i sees the
drafts before it exactly as plain decoding would have seen those tokens: verification is
causal and exact with no runner or kernel change. Row i samples with the SampleSpec plain
decoding would give output position n + i (n = output tokens committed before the round).

Acceptance (`num_accepted`) is the same rule for greedy and sampled rows. With t_i the token
row i produced: accept d_{i+1} while t_i == d_{i+1}; commit t_0..t_m where m is the first
mismatch (t_m is the correction), or t_0..t_K when every draft matched (t_K the bonus).
- Greedy: t_i is the argmax, so this is the longest matching prefix plus the bonus token.
- Sampled, deterministic drafter (q one-hot at d): speculative rejection sampling accepts d
  with probability min(1, p(d) / q(d)) = p(d), and on rejection resamples from
  max(0, p - q) normalised = p restricted to tokens != d. Row i draws t_i ~ p_i with the
  ordinary per-position key fold_in(key(seed), n + i) (model/sampling.py); P(t_i == d) =
  p(d), and given t_i != d, t_i is distributed as p without d: exactly the rule. Moreover,
  as long as the drafts matched, row i's context is the one plain decoding would have had,
  with the same key, so the committed tokens are token for token those of plain sampling
  with the same seed.
- A drafter whose q is not one-hot (sampled MTP drafts) needs the target's p(d_i) and a
  residual draw from max(0, p - q): the verify step does that on the device for rows that
  feed a sampled MTP draft (model/spec_verify.py, q kept on the device per state slot), so
  row i's token is the draft when accepted and a residual draw otherwise, which never
  equals the draft. This host rule is then unchanged, and the committed tokens follow the
  target's distribution (no longer plain sampling's tokens for the same seed, since they
  depend on the drafts, but reproducible: every key is the row's own). Host drafters with
  a q would set `Draft.probs`, which `num_accepted` refuses (none exists).

Hybrid families (Gated DeltaNet state slots): the K + 1 rows share the sequence's state
slot and chain inside the step, each row continuing its predecessor's recurrent state; the
slot receives, after sampling, the state after the last committed token but one, chosen on
the device by this same rule (model/hybrid.py `settle_rows`), so the scheduler's slot
invariant holds when it commits the round. Nemotron-H (Mamba-2 state slots) has no such
chain and is refused whatever the backend.

Backends: `ngram` (prompt lookup, host side, below); `mtp` (the artifact's MTP head,
model/mtp.py), `dflash` and `dflash2` (the artifact's DFlash / DFlash2 drafter components,
model/dflash.py) draft inside the compiled step from its hidden states, K tokens after each
sample: MTP on hybrid models with the head, DFlash on hybrid models and on dense llama /
qwen3 ones (whose sequences then hold a slot for the draft store only,
engine/state_slots.py). `--lm-head-draft` makes those device drafters propose through the
artifact's reduced proposal head (its draft_head component: a vocabulary-subset lm_head).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import numpy as np

from ninfer_jax.model.dflash_config import DENSE_TARGETS

# backend -> (fewest, most, default) draft tokens; a default of None means --draft-tokens
# must be given. ngram drafts cost no device work, only verify rows.
DRAFT_RANGES = {"ngram": (1, 15, 4), "mtp": (1, 5, 3), "dflash": (1, 15, 7),
                "dflash2": (1, 15, 7)}
BACKENDS = tuple(DRAFT_RANGES)
IMPLEMENTED = ("ngram", "mtp", "dflash", "dflash2")
DEVICE_BACKENDS = ("mtp", "dflash", "dflash2")  # draft inside the step (check_servable: where)
# State families whose verify rows cannot chain (only Gated DeltaNet's do: model/hybrid.py).
STATE_REFUSAL = ("speculative decoding needs chained verify rows over the recurrent state, "
                 "built for Gated DeltaNet only, not for {architecture} (Mamba-2); serve it "
                 "without --spec")
# Speculation widens the runner's row capacity to lanes x (K + 1), at most this many rows
# (never fewer than the lanes): rows are compiled in doubling buckets, so a larger capacity
# means more step shapes to compile at start-up.
MAX_SPECULATIVE_ROWS = 256
# The n-gram drafter: suffix lengths tried (longest first) and how far back it looks.
NGRAM_MIN, NGRAM_MAX = 2, 4
NGRAM_LOOKBACK = 4096
EMPTY_DRAFT = np.empty(0, np.int32)


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """--spec BACKEND --draft-tokens K, validated."""

    backend: str
    draft_tokens: int
    lm_head_draft: bool = False  # propose through the artifact's draft_head component

    def __post_init__(self):
        if self.backend not in DRAFT_RANGES:
            raise ValueError(f"--spec {self.backend}: choose one of {', '.join(BACKENDS)}")
        low, high, _ = DRAFT_RANGES[self.backend]
        if not low <= self.draft_tokens <= high:
            raise ValueError(f"--draft-tokens {self.draft_tokens}: --spec {self.backend} "
                             f"drafts {low}..{high} tokens")
        if self.lm_head_draft and self.backend not in DEVICE_BACKENDS:
            raise ValueError(f"--lm-head-draft: --spec {self.backend} has no proposal head "
                             f"(use it with {', '.join(DEVICE_BACKENDS)})")

    @classmethod
    def from_options(cls, backend: str | None, draft_tokens: int | None,
                     lm_head_draft: bool = False) -> "SpeculativeConfig | None":
        """None without --spec; --draft-tokens or --lm-head-draft alone is refused (it would
        do nothing)."""
        if backend is None:
            if draft_tokens is not None or lm_head_draft:
                given = "--draft-tokens" if draft_tokens is not None else "--lm-head-draft"
                raise ValueError(f"{given} needs --spec")
            return None
        if draft_tokens is None:
            draft_tokens = DRAFT_RANGES.get(backend, (0, 0, 1))[2]
        return cls(backend, draft_tokens, lm_head_draft)

    def row_capacity(self, lanes: int) -> int:
        """Rows the runner must hold: every lane verifying K drafts, within the bound."""
        return max(lanes, min(lanes * (self.draft_tokens + 1), MAX_SPECULATIVE_ROWS))

    def check_servable(self, model_config, components: dict | None = None) -> None:
        """ValueError when this process cannot speculate for the model (start-up);
        `components` (metadata.json's) when known: the drafter's component must be there."""
        if self.backend not in IMPLEMENTED:
            raise ValueError(f"--spec {self.backend} is not implemented yet (available: "
                             f"{', '.join(IMPLEMENTED)})")
        if model_config.has_recurrent_state and not model_config.is_hybrid:
            raise ValueError(STATE_REFUSAL.format(architecture=model_config.architecture))
        if self.backend == "mtp" and not (model_config.is_hybrid
                                          and model_config.mtp_num_layers):
            raise ValueError(f"--spec mtp needs a model with an MTP head; "
                             f"{model_config.architecture} artifact has none")
        if self.backend in ("dflash", "dflash2"):
            if not (model_config.is_hybrid or model_config.architecture in DENSE_TARGETS):
                raise ValueError(f"--spec {self.backend} drafts inside the step of the hybrid "
                                 f"families and of dense {' / '.join(DENSE_TARGETS)}; "
                                 f"{model_config.architecture} is neither (use ngram)")
            if components is not None and not components.get(self.backend):
                raise ValueError(f"--spec {self.backend} needs the artifact's {self.backend} "
                                 "component; this artifact has none (ninfer convert "
                                 f"--{self.backend} DIR adds one)")
        if self.lm_head_draft and components is not None and \
                not components.get("draft_head"):
            raise ValueError("--lm-head-draft needs the artifact's draft_head component (a "
                             "reduced proposal head); this artifact has none")

    @property
    def mtp_drafts(self) -> int:
        """Drafts the compiled step makes with the MTP head (0 for host-side drafters)."""
        return self.draft_tokens if self.backend == "mtp" else 0

    @property
    def dflash_drafts(self) -> int:
        """Drafts the compiled step makes with a DFlash / DFlash2 drafter (else 0)."""
        return self.draft_tokens if self.backend in ("dflash", "dflash2") else 0


class Draft(NamedTuple):
    """What a drafter proposes for one sequence."""

    tokens: np.ndarray  # int32 [k'], k' <= k (maybe 0)
    # f32 [k', V]: the drafter's distribution q at each position; None for a deterministic
    # drafter (q one-hot at the token), the only kind acceptance handles now.
    probs: np.ndarray | None = None


class Drafter(Protocol):
    """A host-side proposer. Device-side drafters (MTP, DFlash) will propose inside the
    compiled step instead, from the verify step's hidden states, and fill `Draft.probs`."""

    name: str
    on_device: bool  # drafts come with the step results (MtpDrafter), not from propose

    def propose(self, tokens: np.ndarray, k: int) -> Draft:
        """Up to k tokens likely to follow `tokens` (prompt + committed output)."""


class NgramDrafter:
    """Prompt lookup: the longest suffix of the tokens, of length NGRAM_MAX down to NGRAM_MIN,
    that occurred earlier in the same tokens (its latest earlier occurrence) proposes the
    tokens that followed it there. Vectorised: one comparison of the window against each
    suffix token, so a round costs O(NGRAM_MAX x window) with the window bounded by
    `lookback` tokens, however long the context."""

    name = "ngram"
    on_device = False

    def __init__(self, min_n: int = NGRAM_MIN, max_n: int = NGRAM_MAX,
                 lookback: int = NGRAM_LOOKBACK):
        if not 1 <= min_n <= max_n or lookback < max_n + 1:
            raise ValueError("ngram sizes need 1 <= min_n <= max_n < lookback")
        self.min_n, self.max_n, self.lookback = min_n, max_n, lookback

    def propose(self, tokens: np.ndarray, k: int) -> Draft:
        window = tokens[-self.lookback:]
        length = len(window)
        if k <= 0 or length <= self.min_n:
            return Draft(EMPTY_DRAFT)
        # match[j] (j <= length - 2): the n tokens ending at j equal the n-token suffix.
        match = window[:-1] == window[-1]
        found = -1
        for n in range(1, self.max_n + 1):
            if n >= self.min_n:
                hits = np.flatnonzero(match)
                if hits.size == 0:
                    break
                found = int(hits[-1])
            if n == self.max_n or n >= length - 1:
                break
            extended = np.zeros_like(match)
            extended[n:] = window[:length - 1 - n] == window[length - 1 - n]
            match &= extended
        if found < 0:
            return Draft(EMPTY_DRAFT)
        # A copy: `tokens` may be a view of a buffer that later rounds append to.
        return Draft(window[found + 1:found + 1 + k].astype(np.int32))


class DeviceDrafter:
    """A drafter inside every compiled step (the MTP head, model/mtp.py; DFlash and DFlash2,
    model/dflash.py): K tokens after each sample (the argmax for greedy requests, draws from
    its q for sampled ones); the scheduler keeps a sequence's drafts (Sequence.device_draft)
    and proposes them next round."""

    on_device = True

    def __init__(self, name: str):
        self.name = name

    def propose(self, tokens: np.ndarray, k: int) -> Draft:
        raise TypeError(f"{self.name} drafts come from the device (SpeculativeRounds)")


def make_drafter(config: SpeculativeConfig) -> Drafter:
    if config.backend not in IMPLEMENTED:
        raise ValueError(f"--spec {config.backend} is not implemented yet")
    if config.backend == "ngram":
        return NgramDrafter()
    return DeviceDrafter(config.backend)


def num_accepted(draft: Draft, produced: np.ndarray) -> int:
    """How many drafts the verify rows accept: `produced[i]` is row i's token (i = 0..K,
    row 0 fed the last committed token), so d_{i+1} is accepted while produced[i] equals it.
    The round commits produced[:accepted + 1] (the module docstring says why that is exact,
    greedy and sampled)."""
    if draft.probs is not None:
        raise NotImplementedError("drafts with a distribution need device-side rejection "
                                  "sampling (not built)")
    drafts = draft.tokens
    mismatch = np.flatnonzero(produced[:len(drafts)] != drafts)
    return int(mismatch[0]) if mismatch.size else len(drafts)


class TokenHistory:
    """A sequence's tokens as a growing int32 array, appended to as tokens commit, so the
    drafter does not convert the whole Python list every round. Tokens are only appended
    (a stop truncation ends the request), so (length, the list) tells what is new."""

    __slots__ = ("array", "length")

    def __init__(self):
        self.array = np.empty(256, np.int32)
        self.length = 0

    def view(self, tokens: list[int]) -> np.ndarray:
        total = len(tokens)
        if total < self.length:  # truncated (not expected while it drafts): start over
            self.length = 0
        if total > len(self.array):
            grown = np.empty(max(total, 2 * len(self.array)), np.int32)
            grown[:self.length] = self.array[:self.length]
            self.array = grown
        if total > self.length:
            self.array[self.length:total] = tokens[self.length:total]
            self.length = total
        return self.array[:total]
