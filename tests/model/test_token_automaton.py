"""The token-policy automaton (model/token_automaton.py): the step's jax.numpy run of
`advance` equals the numpy run the fake runner and the host mirror use, on random lanes;
the mirror follows the step's forced flag; an automaton too large for a lane is refused (the
policy then stays on the host)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.engine.policies import ThinkingBudget
from ninfer_jax.engine.policy_lanes import DevicePolicy
from ninfer_jax.model import token_automaton
from ninfer_jax.model.token_automaton import MAX_ENTRIES, MAX_NODES, Automaton, Node


def random_automaton(rng, vocab):
    nodes = [Node() for _ in range(int(rng.integers(2, 12)))]
    for node in nodes:
        node.default_next = int(rng.integers(len(nodes)))
        node.counts = bool(rng.integers(2))
        tokens = rng.choice(vocab, int(rng.integers(0, 6)), replace=False)
        node.entries = {int(t): int(rng.integers(len(nodes))) for t in tokens}
        if rng.random() < 0.6:
            node.forced = int(rng.choice([t for t in range(vocab) if t not in node.entries]))
            node.forced_next = int(rng.integers(len(nodes)))
            node.threshold, node.limit = int(rng.integers(0, 4)), int(rng.integers(0, 30))
        node.shared = bool(rng.integers(2))
    shared = frozenset(int(t) for t in rng.choice(vocab, int(rng.integers(0, 4)), replace=False))
    return Automaton(nodes, 0, shared=shared)


def test_the_device_run_is_the_host_run():
    rng = np.random.default_rng(0)
    vocab, lanes, rows = 12, 5, 9
    table = np.zeros((lanes + 1, token_automaton.ROW_WIDTH), np.int32)
    automata = [None]
    for lane in range(1, lanes + 1):
        automata.append(random_automaton(rng, vocab))
        table[lane] = automata[lane].row(int(rng.integers(len(automata[lane].nodes))),
                                         int(rng.integers(0, 5)))
    step = jax.jit(lambda *a: token_automaton.advance(jnp, *a))
    fired = 0
    for _ in range(20):
        args = (rng.integers(0, lanes + 1, rows).astype(np.int32),
                rng.integers(0, vocab, rows).astype(np.int32),
                rng.integers(0, 30, rows).astype(np.int32))
        host = token_automaton.advance(np, table, *args)
        device = step(table, *args)
        for got, want in zip(device, host):
            np.testing.assert_array_equal(np.asarray(got), want)
        fired += int(host[3].sum())
        for row, lane in enumerate(args[0]):  # the mirror, told the flag, moves as the lane
            if lane:
                state = automata[lane].follow(int(table[lane, 0]), int(table[lane, 1]),
                                              int(host[0][row]), bool(host[3][row]))
                assert state == (int(host[1][row]), int(host[2][row]))
        dummy = args[0] == 0
        np.testing.assert_array_equal(host[0][dummy], args[1][dummy])  # lane 0 keeps all
    assert fired > 0


def test_the_mirror_follows_the_forced_flag_where_the_token_is_ambiguous():
    """A rule may force a token its node keeps: the committed token alone does not say which
    way the lane went, the step's flag does, and `follow` takes the same transition."""
    kept, chain, forced_next = Node(), Node(), Node()
    nodes = [Node(), kept, chain, forced_next]
    nodes[0].entries, nodes[0].forced, nodes[0].forced_next = {5: 1}, 5, 2
    automaton = Automaton(nodes, 0)
    table = np.stack([np.zeros(token_automaton.ROW_WIDTH, np.int32), automaton.row(0, 0)])
    for sampled, want_node, want_forced in ((5, 1, False), (7, 2, True)):
        emitted, node, _, forced = token_automaton.advance(
            np, table, np.int32([1]), np.int32([sampled]), np.int32([0]))
        assert (int(emitted[0]), int(node[0]), bool(forced[0])) == (5, want_node, want_forced)
        assert automaton.follow(0, 0, 5, want_forced) == (want_node, 0)
    out = token_automaton.mark(np, np.int32([5, 5]), np.array([False, True]))
    assert list(out & token_automaton.TOKEN_MASK) == [5, 5]
    assert list(out & token_automaton.FORCED_BIT != 0) == [False, True]
    policy = ThinkingBudget(budget=2, open_id=None, close_id=9, suffix_ids=[9, 4],
                            starts_in_reasoning=True, max_tokens=20)
    assert DevicePolicy.compile(policy, 20) is not None  # its suffix opens with the close


def test_an_automaton_too_large_for_a_lane_stays_on_the_host():
    with pytest.raises(ValueError):
        Automaton([Node() for _ in range(MAX_NODES + 1)], 0)
    blank = lambda token: token % 2 == 0  # noqa: E731
    policy = ThinkingBudget(budget=2, open_id=1, close_id=3, suffix_ids=[5, 3],
                            starts_in_reasoning=False, max_tokens=20, is_blank=blank)
    assert DevicePolicy.compile(policy, 2 * MAX_ENTRIES + 2) is None
    assert DevicePolicy.compile(policy, 100) is not None
