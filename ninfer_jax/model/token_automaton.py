"""Token policies as data: a small per-lane automaton the step applies to what it samples.

A TokenPolicy (engine/policies.py) compiles, once per request, to an automaton over the
committed output. Each node says what happens to the token sampled there:
- `entries`: explicit transitions, token -> next node (the token is kept);
- a *rule* (`forced` token >= 0): any other token is replaced by `forced` and the automaton
  moves to `forced_next`, but only once the lane's counter has reached `threshold` and while
  the row's sample index is at most `limit`; a multi-token insertion is a chain of nodes
  whose rule always fires, one forced token per step;
- a token of the automaton's *shared* set, on a node with `shared` set, is kept and the
  automaton stays (one set for every such node: ForcedToolCall's empty-text tokens, which a
  151k vocabulary padded past its tokenizer has hundreds of, stored once, not per node);
- otherwise the token is kept and the automaton moves to `default_next`; a self-loop on a
  node with `counts` set adds one to the lane's counter (ThinkingBudget counts its thinking
  tokens this way instead of unrolling a node per token);
- once the counter has reached a node's `cap`, its entries and the shared set no longer keep
  anything, so its rule takes every token (ForcedToolCall keeps at most a few blank tokens
  before the call: its answer node loops on them counting, and a cap of N costs one field,
  where N unrolled nodes would each repeat the vocabulary's blank set).
The rule replaces the sample after it is drawn, so the distribution of every token it keeps
is the unconstrained one, as the host policy's `adjust` would see it.

Memory layout: one int32 row of ROW_WIDTH per lane (the runner keeps [lanes + 1, ROW_WIDTH]
on the device; lane 0, all zeros, is the identity automaton that rows without a policy use):
    [node, counter, forced + 1 [N], forced_next [N], default_next [N], counts [N],
     threshold [N], limit [N], shared [N], cap [N], keys [E] (node * KEY_STRIDE + token,
     ascending; the shared set's under node N), next [E]]
with N = MAX_NODES and E = MAX_ENTRIES (unused keys padded with KEY_PAD, so the lookup is a
binary search). An all-zero row keeps every token on node 0. `advance` is written for any
array module with numpy's indexing (numpy on the host and in the fake runner, jax.numpy
inside the compiled step): the device, the fake and the host's mirror run one function.
This module imports no JAX, so the host-side engine may use it.
"""
from __future__ import annotations

import numpy as np

MAX_NODES = 256
MAX_ENTRIES = 4096
KEY_STRIDE = 1 << 20  # tokens below 2**20; nodes * KEY_STRIDE stays below 2**31
KEY_PAD = np.iinfo(np.int32).max
NO_LIMIT = np.iinfo(np.int32).max
# The step marks a token a rule forced by this bit in its `out` slot (tokens stay below
# KEY_STRIDE), so the host mirror follows forced vs kept without inferring it from the
# token: a forced token may be one its node would also keep if sampled (ForcedToolCall's
# name completion). Everything that reads `out` as tokens masks it (ragged_batch.step_tokens,
# the runner's collect).
FORCED_BIT = 1 << 30
TOKEN_MASK = FORCED_BIT - 1

_FIELDS = ("forced", "forced_next", "default_next", "counts", "threshold", "limit", "shared",
           "cap")
_OFFSET = {name: 2 + i * MAX_NODES for i, name in enumerate(_FIELDS)}
KEYS = 2 + len(_FIELDS) * MAX_NODES
NEXT = KEYS + MAX_ENTRIES
ROW_WIDTH = NEXT + MAX_ENTRIES
_SEARCH_STEPS = MAX_ENTRIES.bit_length()


class Node:
    """One node of an automaton under construction (see the module docstring)."""

    def __init__(self, default_next: int | None = None):
        self.entries: dict[int, int] = {}
        self.default_next = default_next  # None: itself
        self.counts = False
        self.forced, self.forced_next = -1, 0
        self.threshold, self.limit = 0, NO_LIMIT
        self.shared = False  # keeps the automaton's shared tokens, staying
        self.cap = NO_LIMIT  # from this counter on, entries and the shared set keep nothing


class Automaton:
    """Nodes and a start node, packed into a lane row by `row`. Raises ValueError when the
    automaton does not fit a lane. A rule's forced token may be one its node keeps: the step
    reports which tokens a rule forced (FORCED_BIT) and the mirror follows that (`follow`)."""

    def __init__(self, nodes: list[Node], start: int, rule_nodes: frozenset[int] = frozenset(),
                 shared: frozenset[int] = frozenset()):
        if len(nodes) > MAX_NODES:
            raise ValueError(f"{len(nodes)} nodes (a lane holds {MAX_NODES})")
        if sum(len(node.entries) for node in nodes) + len(shared) > MAX_ENTRIES:
            raise ValueError(f"more than {MAX_ENTRIES} transitions")
        for node in nodes:
            if any(token >= KEY_STRIDE or token < 0 for token in node.entries):
                raise ValueError("token id past the automaton's key range")
        if any(token >= KEY_STRIDE or token < 0 for token in shared):
            raise ValueError("token id past the automaton's key range")
        self.nodes, self.start, self.shared = nodes, start, shared
        self.rule_nodes = rule_nodes  # where a forced token counts as the policy applying
        self._table = self._pack()

    def _pack(self) -> np.ndarray:
        row = np.zeros(ROW_WIDTH, np.int32)
        for index, node in enumerate(self.nodes):
            values = (node.forced + 1, node.forced_next,
                      index if node.default_next is None else node.default_next,
                      int(node.counts), node.threshold, node.limit, int(node.shared),
                      node.cap)
            for name, value in zip(_FIELDS, values):
                row[_OFFSET[name] + index] = value
        keys = sorted((index * KEY_STRIDE + token, target)
                      for index, node in enumerate(self.nodes)
                      for token, target in node.entries.items())
        keys += sorted((MAX_NODES * KEY_STRIDE + token, 0) for token in self.shared)
        row[KEYS:NEXT] = KEY_PAD
        if keys:
            row[KEYS:KEYS + len(keys)] = [key for key, _ in keys]
            row[NEXT:NEXT + len(keys)] = [target for _, target in keys]
        return row

    def follow(self, node: int, counter: int, token: int, forced: bool) -> tuple[int, int]:
        """The state after committing `token` at (node, counter), as `advance` moved it:
        a forced token takes the rule's transition, a kept one its entry or the default."""
        at = self.nodes[node]
        if forced:
            return at.forced_next, counter
        open_ = counter < at.cap
        if open_ and token in at.entries:
            target = at.entries[token]
        elif open_ and at.shared and token in self.shared:
            target = node
        else:
            target = node if at.default_next is None else at.default_next
        return target, counter + int(target == node and at.counts)

    def row(self, node: int, counter: int) -> np.ndarray:
        """The lane row with the automaton at (node, counter)."""
        row = self._table.copy()
        row[0], row[1] = node, counter
        return row


def advance(xp, table, lanes, sampled, sample_index):
    """Apply each row's lane automaton to its sampled token.

    table int32 [L + 1, ROW_WIDTH]; lanes, sampled, sample_index int32 [R] (sample_index:
    output tokens before this one). Returns (emitted, node, counter, forced), each [R]: the
    token to commit, the lane's state after it, and whether a rule replaced the sample.
    Rows sharing lane 0 all compute its identity transition."""
    node, counter = table[lanes, 0], table[lanes, 1]

    def at_node(name):
        return table[lanes, _OFFSET[name] + node]

    def lookup(key):  # lower bound of key among the lane's sorted keys: (found, slot)
        low = xp.zeros_like(key)
        high = xp.full_like(key, MAX_ENTRIES)
        for _ in range(_SEARCH_STEPS):
            middle = xp.minimum((low + high) // 2, MAX_ENTRIES - 1)
            below = table[lanes, KEYS + middle] < key
            searching = low < high
            low = xp.where(searching & below, middle + 1, low)
            high = xp.where(searching & ~below, middle, high)
        slot = xp.minimum(low, MAX_ENTRIES - 1)
        return table[lanes, KEYS + slot] == key, slot

    open_ = counter < at_node("cap")
    found, slot = lookup(node * KEY_STRIDE + sampled)
    found = found & open_
    in_shared, _ = lookup(MAX_NODES * KEY_STRIDE + sampled)
    in_shared = in_shared & (at_node("shared") != 0) & ~found & open_
    forced = at_node("forced") - 1
    fires = ((forced >= 0) & ~found & ~in_shared & (counter >= at_node("threshold"))
             & (sample_index <= at_node("limit")))
    kept_next = xp.where(found, table[lanes, NEXT + slot],
                         xp.where(in_shared, node, at_node("default_next")))
    next_node = xp.where(fires, at_node("forced_next"), kept_next)
    loops = ~fires & (next_node == node) & (at_node("counts") != 0)
    return (xp.where(fires, forced, sampled), next_node,
            counter + loops.astype(counter.dtype), fires)


def mark(xp, emitted, forced):
    """`out` slots: each committed token with FORCED_BIT set where a rule forced it."""
    return emitted | xp.where(forced, FORCED_BIT, 0).astype(emitted.dtype)
