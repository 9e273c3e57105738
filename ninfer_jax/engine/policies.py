"""Token policies: forced tokens the engine commits instead of a sampled one.

Both policies depend only on the committed output before a sampled token, so batching,
pauses and replay never change what they do. Each has two forms with the same tokens:
- `adjust` (the host form and the reference twin): runs on the engine thread after every
  sampled token and returns the tokens to commit; it keeps an incremental view of the
  output (recomputed from scratch if the output it is shown is shorter than what it has
  seen). A request whose policy runs this way sits out of the launch-ahead pipeline.
- `automaton(V)` (the device form, engine/policy_lanes.py): the same rule as data, a small
  automaton (model/token_automaton.py) the compiled step applies to each sample, so the
  request rides the pipeline; a forced run is committed one token per step there. Raises
  ValueError when the policy cannot be exact that way, and the host form is used.
ThinkingBudget and ForcedToolCall have both. A chain of several policies runs on the host
(one lane automaton has a single rule and counter; the product of a budget and a forced call
would need two). The call's name rule replaces a sample with a completion whose first token
the name state also keeps: the step reports which tokens a rule forced, and the host mirror
follows that (engine/policy_lanes.py), since the committed output alone does not say it.

- `ThinkingBudget`: once `budget` thinking tokens are committed and the block is still open,
  the next token becomes the early-close guidance plus the close marker (streamed as
  reasoning), unless the model closes the block or stops by itself right there.
- `ForcedToolCall` (tool_choice required or a named function): the first non-whitespace
  answer token (after any think block) becomes the call opener plus the format's text before
  a tool name; then the name is held to the offered names: a token that leaves every offered
  name is replaced by the rest of the first name its written part starts, plus the
  terminator. The model writes the arguments.

Policies are built here and run inside the engine-core process: they cross the channel
pickled with their request (callables are module-level classes or bound methods, never
lambdas; the tokenizer travels by reference). What the engine-side copy records and the HTTP
side reads afterwards (`ThinkingBudget.applied`) comes back with the terminal event
(`outcome()` there, `adopt_outcome()` here).
"""
from __future__ import annotations

import functools
import logging
import weakref
from typing import Callable, Sequence

from ninfer_jax.engine.call_automaton import CallAutomaton
from ninfer_jax.model.token_automaton import Automaton, Node

log = logging.getLogger("ninfer_jax.serve")

# Qwen's published wording for cutting thinking short at a budget.
EARLY_CLOSE_GUIDANCE = ("\n\nConsidering the limited time by the user, I have to give the "
                        "solution based on the thinking directly now.\n")


def never_raises(adjust):
    """Policies run on the engine thread, where an exception is an engine-wide failure: a
    policy bug must cost at most its own request's forcing, never every request."""
    @functools.wraps(adjust)
    def guarded(self, output_ids, sampled):
        try:
            return adjust(self, output_ids, sampled)
        except Exception:
            log.exception("%s failed; keeping the sampled token", type(self).__name__)
            return [sampled]
    return guarded


class BlankToken:
    """`is_blank(token)`: the token decodes to whitespace only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, token: int) -> bool:
        return not self.tokenizer.decode([token]).strip()

    def blank_ids(self, vocab_size: int) -> frozenset[int]:
        """Every blank token id: one decode per vocabulary entry, once per tokenizer."""
        key = (vocab_size,)
        try:
            cached = _BLANK_IDS.setdefault(self.tokenizer, {})
        except TypeError:  # a tokenizer without weak references: computed each time
            cached = {}
        if key not in cached:
            cached[key] = frozenset(t for t in range(vocab_size) if _is_blank_id(self, t))
        return cached[key]


_BLANK_IDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def blank_ids(is_blank: Callable[[int], bool], vocab_size: int) -> frozenset[int]:
    """The tokens `is_blank` holds blank, over the whole vocabulary."""
    if isinstance(is_blank, BlankToken):
        return is_blank.blank_ids(vocab_size)
    return frozenset(t for t in range(vocab_size) if _is_blank_id(is_blank, t))


def _is_blank_id(is_blank, token: int) -> bool:
    """A padded vocabulary id the tokenizer cannot decode is not blank (a host policy
    shown one would fail and keep the sampled token: never_raises)."""
    try:
        return bool(is_blank(token))
    except Exception:
        return False


class PlainEncode:
    """`encode(text)`: client-text ids (control spellings stay text)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, special=False)


class ThinkingBudget:
    def __init__(self, *, budget: int, open_id: int | None, close_id: int,
                 suffix_ids: Sequence[int], starts_in_reasoning: bool, max_tokens: int,
                 stop_ids: frozenset[int] = frozenset(),
                 is_blank: Callable[[int], bool] = lambda token: False, open_tail: int = 0):
        self.budget = budget
        self._open_id = open_id
        # Tokens of a multi-token open marker after its head (Gemma 4's "thought" after
        # <|channel>): part of the marker, not thinking, so not counted.
        self._open_tail = open_tail
        self._close_id = close_id
        self.suffix_ids = list(suffix_ids)
        self._starts_in_reasoning = starts_in_reasoning
        self._max_tokens = max_tokens
        self._stop_ids = stop_ids
        self._is_blank = is_blank  # whitespace tokens may precede a model-written open marker
        self.applied = 0  # times the suffix was inserted (0 or 1); read after the request
        self._reset()

    def _reset(self) -> None:
        self._seen = 0
        self._open = self._starts_in_reasoning
        # Without a prefilled block, only an open marker before any answer text opens one.
        self._closed = False
        self._count = 0
        self._tail_left = 0

    def _advance(self, output_ids: Sequence[int]) -> None:
        if len(output_ids) < self._seen:
            self._reset()
        for token in output_ids[self._seen:]:
            if self._closed:
                break
            if not self._open:
                self._open = token == self._open_id
                self._closed = not self._open and not self._is_blank(token)
                self._tail_left = self._open_tail if self._open else 0
            elif token == self._close_id:
                self._closed = True
            elif self._tail_left:
                self._tail_left -= 1
            else:
                self._count += 1
        self._seen = len(output_ids)

    @never_raises
    def adjust(self, output_ids: Sequence[int], sampled: int) -> list[int]:
        self._advance(output_ids)
        if not self._open or self._closed or self._count < self.budget:
            return [sampled]
        if sampled == self._close_id or sampled in self._stop_ids:
            return [sampled]
        if self._max_tokens - len(output_ids) < len(self.suffix_ids) + 1:
            return [sampled]  # never a partial control suffix
        self.applied += 1
        return list(self.suffix_ids)

    def outcome(self) -> int:
        return self.applied

    def adopt_outcome(self, applied: int) -> None:
        self.applied = applied

    def automaton(self, vocab_size: int) -> Automaton:
        """This policy as the device applies it (model/token_automaton.py): before the
        block (a model-written open marker may follow blank tokens), the marker's tail
        (`open_tail` nodes that do not count, with the block's rule), in it (a counting
        self-loop; from `budget` on, every token but the close marker or a stop token is
        replaced by the suffix's first token while the whole suffix plus one answer token
        still fits max_tokens), the suffix's remaining tokens as a forced chain, closed.
        ValueError when it cannot be exact (the host applies it then)."""
        before, thinking, closed = 0, 1, 2
        suffix = self.suffix_ids
        if not suffix or self._close_id not in suffix:
            raise ValueError("the suffix does not close the block")
        nodes = [Node(default_next=closed), Node(), Node()]
        nodes[before].entries = dict.fromkeys(blank_ids(self._is_blank, vocab_size), before)
        opened = thinking
        for _ in range(self._open_tail):  # the open marker's tail: in the block, not counted
            tail = Node(default_next=opened)
            nodes.append(tail)
            opened = len(nodes) - 1
        if self._open_id is not None:
            nodes[before].entries[self._open_id] = opened
        tails = range(3, len(nodes))
        in_block = nodes[thinking]
        in_block.counts = True
        in_block.entries = dict.fromkeys(self._stop_ids, thinking)
        in_block.entries[self._close_id] = closed
        in_block.threshold = self.budget
        in_block.limit = self._max_tokens - len(suffix) - 1
        in_block.forced = suffix[0]
        for index in tails:  # the host's rule applies there too (a budget of 0)
            tail = nodes[index]
            tail.entries = dict.fromkeys(self._stop_ids, tail.default_next)
            tail.entries[self._close_id] = closed
            tail.threshold, tail.limit, tail.forced = in_block.threshold, in_block.limit, suffix[0]
        previous = in_block
        for token in suffix[1:]:  # the chain, one node per remaining suffix token
            previous.forced_next = len(nodes)
            node = Node()
            node.forced = token
            nodes.append(node)
            previous = node
        previous.forced_next = closed  # the close marker is in the suffix
        for index in tails:
            nodes[index].forced_next = in_block.forced_next
        start = thinking if self._starts_in_reasoning else before
        return Automaton(nodes, start, rule_nodes=frozenset({thinking, *tails}))

    def record_applied(self) -> None:
        """The device inserted the suffix (the host mirror saw its rule fire)."""
        self.applied += 1


# A forced call waits for the answer's first text behind at most this many blank (or
# empty-text) tokens, then its prefix is forced whatever was sampled: without a cap a model
# that keeps writing newlines never reaches the call (a random Qwen3.5 answered a named
# tool_choice with 60 "\n" and finish "length", 2026-12-06 audit). Templates put the answer
# right after their markers, so real models spend at most a token or two here.
MAX_LEADING_BLANKS = 8


class ForcedToolCall:
    max_leading_blanks = MAX_LEADING_BLANKS

    def __init__(self, *, decode: Callable[[Sequence[int]], str],
                 encode: Callable[[str], list[int]], prefix_ids: Sequence[int],
                 names: Sequence[str], terminator: str, open_id: int | None,
                 close_id: int | None, starts_in_reasoning: bool, may_open_thinking: bool):
        self._decode = decode
        self._encode = encode
        self._prefix_ids = list(prefix_ids)
        self._targets = [name + terminator for name in names]
        self._terminator = terminator
        self._open_id, self._close_id = open_id, close_id
        self._starts_in_reasoning = starts_in_reasoning
        # The model may open its own think block before answering (thinking mode whose
        # prompt does not prefill the open marker); once, and only before any answer text.
        self._may_open_thinking = may_open_thinking and close_id is not None
        self._reset()

    def _reset(self) -> None:
        self._seen = 0
        self._blanks = 0  # blank tokens kept in the answer phase (the device's counter)
        self._phase = "thinking" if self._starts_in_reasoning else "answer"
        self._can_open = self._may_open_thinking and not self._starts_in_reasoning
        self._name_start = 0

    def _advance(self, output_ids: Sequence[int]) -> None:
        if len(output_ids) < self._seen:
            self._reset()
        for index in range(self._seen, len(output_ids)):
            token = output_ids[index]
            if self._phase == "thinking" and token == self._close_id:
                self._phase = "answer"
            elif (self._phase == "answer" and self._is_blank(token)
                  and self._blanks < self.max_leading_blanks):
                self._blanks += 1
            elif self._phase == "answer" and self._can_open and token == self._open_id:
                self._phase, self._can_open = "thinking", False
            elif self._phase == "answer":
                self._phase, self._name_start = "name", index + len(self._prefix_ids)
            elif self._phase == "name" and index >= self._name_start:
                if self._name_finished(self._decode(output_ids[self._name_start:index + 1])):
                    self._phase = "arguments"
        self._seen = len(output_ids)

    def _is_blank(self, token: int) -> bool:
        return not self._decode([token]).strip()

    def _name_finished(self, written: str) -> bool:
        return any(written.startswith(target) for target in self._targets)

    @never_raises
    def adjust(self, output_ids: Sequence[int], sampled: int) -> list[int]:
        self._advance(output_ids)
        capped = self._blanks >= self.max_leading_blanks
        if self._phase == "answer" and (capped or not self._is_blank(sampled)):
            if self._can_open and sampled == self._open_id and not capped:
                return [sampled]
            return list(self._prefix_ids)
        if self._phase != "name":
            return [sampled]
        written = self._decode(output_ids[self._name_start:])
        candidate = written + self._decode([sampled])
        if any(t.startswith(candidate) or candidate.startswith(t) for t in self._targets):
            return [sampled]
        target = next((t for t in self._targets if t.startswith(written)), None)
        return [sampled] if target is None else self._encode(target[len(written):])

    def automaton(self, vocab_size: int) -> Automaton:
        """This policy as the device applies it (model/token_automaton.py). Nodes: thinking
        (keeps all; the close marker leads to the answer), the answer before its first text
        (blank tokens stay, counted, up to MAX_LEADING_BLANKS of them; a model-written open
        marker may open thinking once before that; any other token is replaced by the call
        prefix, a forced chain), one node per name state (the
        written part w of a name; it keeps a token t whose text extends w along an offered
        target, or completes one and runs past it, and an empty-text token; any other is
        replaced by the rest of the first target w starts, a forced chain), and the
        arguments (keeps all). Empty-text tokens (a padded vocabulary's, hundreds at 151k)
        are the automaton's shared set, stored once. The completion's first token is also one the name state
        keeps: the step's forced flag tells the mirror which way the lane went. The states
        are strings of per-token texts, so this holds only where the tokenizer's decode of a
        run is the run of its decodes; ValueError where it is not, or when the automaton does
        not fit a lane (the host applies the policy then)."""
        return CallAutomaton(self, vocab_size).build()


class PolicyChain:
    """Several policies in order; the first that changes the token decides."""

    def __init__(self, policies: Sequence):
        self.policies = list(policies)

    def outcome(self) -> tuple:
        return tuple(getattr(p, "outcome", lambda: None)() for p in self.policies)

    def adopt_outcome(self, outcomes: tuple) -> None:
        for policy, outcome in zip(self.policies, outcomes):
            if outcome is not None:
                policy.adopt_outcome(outcome)

    def adjust(self, output_ids: Sequence[int], sampled: int) -> list[int]:
        for policy in self.policies:
            adjusted = policy.adjust(output_ids, sampled)
            if adjusted != [sampled]:
                return adjusted
        return [sampled]

    def automaton(self, vocab_size: int) -> Automaton:
        """A chain of one policy runs as that policy; several stay on the host."""
        if len(self.policies) != 1:
            raise ValueError("a chain of several policies runs on the host")
        return self.policies[0].automaton(vocab_size)

    def record_applied(self) -> None:
        self.policies[0].record_applied()
