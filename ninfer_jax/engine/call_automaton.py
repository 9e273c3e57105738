"""ForcedToolCall as a token automaton (model/token_automaton.py): the construction behind
`ForcedToolCall.automaton` (engine/policies.py, whose docstring names the nodes).

A name state is the text w written so far after the call prefix (the host policy's
`written`). It keeps a token whose text extends w along an offered target (name +
terminator), runs past a target's end, or is empty; any other token is replaced by the rest
of the first target w starts. The host decodes the written tokens as one run while the
automaton joins single-token texts, so every kept transition is checked to decode the same
both ways; a tokenizer that fails that (a decoder that strips a leading space) is refused
and the host applies the policy. Forced chains are shared by (remaining tokens, end).
"""
from __future__ import annotations

import bisect
import weakref
from typing import Callable, Sequence

from ninfer_jax.model.token_automaton import MAX_NODES, Automaton, Node


class VocabIndex:
    """Each token's decode alone, sorted (prefix ranges by bisection) and grouped by text."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.ordered = sorted(range(len(texts)), key=texts.__getitem__)
        self.sorted_texts = [texts[t] for t in self.ordered]
        self.by_text: dict[str, list[int]] = {}
        for token, text in enumerate(texts):
            self.by_text.setdefault(text, []).append(token)
        self.empties = self.by_text.get("", [])
        self.blanks = [t for t, text in enumerate(texts) if not text.strip()]


def vocab_index(decode: Callable[[Sequence[int]], str], vocab_size: int) -> VocabIndex:
    """The vocabulary's texts, once per tokenizer when `decode` is its bound method.
    ValueError when a token does not decode (the host applies the policy then: it keeps
    such a token, and fails to read past it)."""
    owner = getattr(decode, "__self__", None)
    key = (getattr(decode, "__name__", None), vocab_size)
    try:
        cached = _VOCAB_TEXTS.setdefault(owner, {}) if owner is not None else {}
    except TypeError:
        cached = {}
    if key not in cached:
        texts = []
        for token in range(vocab_size):
            try:
                texts.append(decode([token]))
            except Exception as exc:
                raise ValueError(f"token {token} does not decode") from exc
        cached[key] = VocabIndex(texts)
    return cached[key]


_VOCAB_TEXTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class CallAutomaton:
    """Builds one ForcedToolCall's automaton; ValueError where it cannot be exact or does
    not fit a lane."""

    def __init__(self, policy, vocab_size: int):
        self.policy = policy
        self.vocab = vocab_index(policy._decode, vocab_size)
        self.nodes: list[Node] = []
        self.chains: dict[tuple, int] = {}
        self.names: dict[str, int] = {}
        self.probes: dict[str, int] = {}  # a token that reaches the name state (join checks)
        self.pending: list[str] = []

    def build(self) -> Automaton:
        policy, texts = self.policy, self.vocab.texts
        prefix, targets = policy._prefix_ids, policy._targets
        if not prefix or not targets or any("\ufffd" in t for t in targets):
            raise ValueError("no call prefix or no offered name")
        if not texts[prefix[0]].strip() or (policy._may_open_thinking
                                            and prefix[0] == policy._open_id):
            raise ValueError("the call prefix starts with a token the answer keeps")
        self.arguments = self.new()
        root = self.name_node("", None)
        while self.pending:
            self.fill_name(self.pending.pop())
        thinking, answer = self.new(), self.new()
        opener = self.new() if policy._may_open_thinking else None
        blanks = frozenset(self.vocab.blanks) - frozenset(self.vocab.empties)
        for index in (answer, opener):
            if index is None:
                continue
            self.nodes[index].entries = dict.fromkeys(blanks, index)
            self.nodes[index].shared = True
            # blank and empty tokens loop here counting; past the cap the prefix is forced
            self.nodes[index].counts, self.nodes[index].cap = True, policy.max_leading_blanks
            if index == opener and policy._open_id is not None:
                self.nodes[index].entries[policy._open_id] = thinking
            self.force(index, prefix, root)
        if policy._close_id is not None:
            self.nodes[thinking].entries = {policy._close_id: answer}
        start = (thinking if policy._starts_in_reasoning
                 else answer if opener is None else opener)
        return Automaton(self.nodes, start, shared=frozenset(self.vocab.empties))

    def new(self) -> int:
        self.nodes.append(Node())
        if len(self.nodes) > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES} nodes")
        return len(self.nodes) - 1

    def force(self, index: int, tokens: Sequence[int], end: int) -> None:
        """`index`'s rule forces tokens[0]; a chain of always-firing nodes the rest."""
        self.nodes[index].forced = tokens[0]
        rest = tuple(tokens[1:])
        if not rest:
            self.nodes[index].forced_next = end
            return
        if (rest, end) not in self.chains:
            self.chains[rest, end] = self.new()
            self.force(self.chains[rest, end], rest, end)
        self.nodes[index].forced_next = self.chains[rest, end]

    def name_node(self, written: str, via: int | None) -> int:
        if written not in self.names:
            self.names[written] = self.new()
            self.pending.append(written)
            if via is not None:
                self.probes[written] = via
        return self.names[written]

    def fill_name(self, written: str) -> None:
        """The name state's kept tokens, its rule (the completion) and the join check."""
        policy, vocab, index = self.policy, self.vocab, self.names[written]
        entries: dict[int, int] = {}
        for target in policy._targets:
            if not target.startswith(written):
                continue
            rest = target[len(written):]
            for end in range(1, len(rest) + 1):  # a token whose text extends the name
                candidate = written + rest[:end]
                for token in vocab.by_text.get(rest[:end], ()):
                    entries[token] = (self.arguments if policy._name_finished(candidate)
                                      else self.name_node(candidate, token))
            low = bisect.bisect_left(vocab.sorted_texts, rest)  # one that runs past it
            while low < len(vocab.ordered) and vocab.sorted_texts[low].startswith(rest):
                entries[vocab.ordered[low]] = self.arguments
                low += 1
        node = self.nodes[index]
        node.entries, node.shared = entries, True  # an empty text leaves the name as it is
        target = next(t for t in policy._targets if t.startswith(written))
        completion = policy._encode(target[len(written):])
        if not completion or "".join(vocab.texts[t] for t in completion) != target[len(written):]:
            raise ValueError("a name completion does not decode to its text")
        self.force(index, completion, self.arguments)
        probe = self.probes.get(written)
        if probe is None:
            return
        for token in {t for t in entries if vocab.texts[t]}:
            if policy._decode([probe, token]) != vocab.texts[probe] + vocab.texts[token]:
                raise ValueError("the tokenizer's decode of a run is not the run of its decodes")
