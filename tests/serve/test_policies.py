"""Token policies on a toy vocabulary: thinking budget and forced tool calls."""
from ninfer_jax.engine.policies import ForcedToolCall, PolicyChain, ThinkingBudget

OPEN, CLOSE, EOS = 100, 101, 2
SUFFIX = [7, 8, CLOSE, 9]


def run(policy, samples):
    output: list[int] = []
    for sampled in samples:
        output += policy.adjust(output, sampled)
    return output


def budget(**kwargs):
    options = dict(budget=3, open_id=OPEN, close_id=CLOSE, suffix_ids=SUFFIX,
                   starts_in_reasoning=True, max_tokens=50, stop_ids=frozenset({EOS}))
    options.update(kwargs)
    return ThinkingBudget(**options)


def test_budget_inserts_the_close_suffix_once():
    policy = budget()
    assert run(policy, [11, 12, 13, 14, 15, 16]) == [11, 12, 13] + SUFFIX + [15, 16]
    assert policy.applied == 1


def test_budget_counts_after_a_model_written_open_marker():
    blank = {5}.__contains__  # token 5 is whitespace
    assert run(budget(starts_in_reasoning=False, is_blank=blank), [5, OPEN, 11, 12, 13, 14]) \
        == [5, OPEN, 11, 12, 13] + SUFFIX
    # An open marker after answer text is not a thinking block: no cap.
    late = [11, OPEN, 12, 13, 14, 15]
    assert run(budget(starts_in_reasoning=False, is_blank=blank), late) == late


def test_natural_close_stop_and_small_capacity_are_honoured():
    assert run(budget(), [11, 12, 13, CLOSE, 14]) == [11, 12, 13, CLOSE, 14]
    assert run(budget(), [11, 12, 13, EOS]) == [11, 12, 13, EOS]
    # Only 4 tokens of room left at the cap: the 4-token suffix plus one answer token won't fit.
    assert run(budget(max_tokens=7), [11, 12, 13, 14]) == [11, 12, 13, 14]


def test_budget_is_a_function_of_the_output_only():
    policy = budget()
    first = run(policy, [11, 12, 13, 14])
    # Shown a shorter output again (a replay), it recomputes and decides the same way.
    assert policy.adjust(first[:3], 14) == SUFFIX


VOCAB = {1: " ", 2: "\n", 3: "Hi", 4: "se", 5: "arch", 6: '"', 7: ", ", 8: "get", 9: "xyz",
         10: "<call>", 11: '{"name": "', 20: "<think>", 21: "</think>", 12: "_weather"}
INVERSE = {text: token for token, text in VOCAB.items()}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def encode(text):
    out = []
    while text:
        piece = max((t for t in INVERSE if text.startswith(t)), key=len)
        out.append(INVERSE[piece])
        text = text[len(piece):]
    return out


def forced(**kwargs):
    options = dict(decode=decode, encode=encode, prefix_ids=[10, 11],
                   names=["get_weather", "search"], terminator='"', open_id=20, close_id=21,
                   starts_in_reasoning=False, may_open_thinking=False)
    options.update(kwargs)
    return ForcedToolCall(**options)


def test_first_non_blank_answer_token_becomes_the_call_prefix():
    output = run(forced(), [1, 2, 3, 4, 5, 6, 7, 9])
    assert decode(output) == ' \n<call>{"name": "search", xyz'


def test_name_leaving_the_offered_names_is_completed():
    assert decode(run(forced(), [3, 9, 7])) == '<call>{"name": "get_weather", '
    assert decode(run(forced(), [3, 8, 9, 7])) == '<call>{"name": "get_weather", '
    assert decode(run(forced(), [3, 4, 9])) == '<call>{"name": "search"'


def test_thinking_first_then_the_call():
    prefilled = run(forced(starts_in_reasoning=True), [3, 9, 21, 1, 3, 4, 5, 6])
    assert decode(prefilled) == 'Hixyz</think> <call>{"name": "search"'
    opened = run(forced(may_open_thinking=True), [20, 3, 21, 3, 8, 12, 6])
    assert decode(opened) == '<think>Hi</think><call>{"name": "get_weather"'
    # Without thinking mode the open marker is just a first answer token.
    assert decode(run(forced(), [20, 4, 5, 6])) == '<call>{"name": "search"'


def test_chain_applies_the_first_change():
    chain = PolicyChain([budget(budget=10), forced()])
    assert decode(run(chain, [3, 4, 5, 6])) == '<call>{"name": "search"'


def test_a_failing_policy_keeps_the_sampled_token():
    def broken(ids):
        raise RuntimeError("decode failed")

    policy = forced(decode=broken)
    assert policy.adjust([], 3) == [3]


def test_policies_built_like_generation_does_pickle_small_and_behave_the_same(
        default_tokenizer):
    # What generation.py builds crosses to the engine-core process with every request.
    import pickle

    from ninfer_jax.engine.policies import BlankToken, PlainEncode

    tokenizer = default_tokenizer
    call = ForcedToolCall(decode=tokenizer.decode, encode=PlainEncode(tokenizer),
                          prefix_ids=tokenizer.encode("<tool_call>\n{\"name\": \"", special=True),
                          names=["get_weather"], terminator="\"", open_id=None, close_id=None,
                          starts_in_reasoning=False, may_open_thinking=False)
    chain = PolicyChain([budget(is_blank=BlankToken(tokenizer)), call])
    data = pickle.dumps(chain)
    assert len(data) < 4096  # the tokenizer travels as a file reference, not its vocabulary
    copy = pickle.loads(data)
    samples = tokenizer.encode("Sure get_wrong\" x", special=False)
    assert run(copy, samples) == run(chain, samples)
    assert copy.outcome() == chain.outcome() == (1, None)  # the budget closed once
    chain.policies[0].applied = 0
    chain.adopt_outcome(copy.outcome())
    assert chain.policies[0].applied == 1
