"""ReasoningSplitter: markers and framing whitespace removed, every split gives one result."""
import pytest

from ninfer_jax.text.reasoning import CONTENT, REASONING, ReasoningSplitter

MARKERS = ("<think>", "</think>")


def split(pieces, starts_in_reasoning=False, markers=MARKERS):
    splitter = ReasoningSplitter(*markers, starts_in_reasoning=starts_in_reasoning)
    out = []
    for piece in pieces:
        out += splitter.push(piece)
    out += splitter.finish()
    joined = {REASONING: "", CONTENT: ""}
    for piece in out:
        if piece.kind in joined:
            joined[piece.kind] += piece.text
    return joined[REASONING], joined[CONTENT]


CASES = [
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", False, ("Let me add.", "It is 4.")),
    ("\n<think>x</think>y", False, ("x", "y")),
    ("Just an answer <think> not reasoning", False, ("", "Just an answer <think> not reasoning")),
    ("Prefilled thoughts\n</think>\n\nAnswer", True, ("Prefilled thoughts", "Answer")),
    ("Thinking that never ends </thi", True, ("Thinking that never ends </thi", "")),
    ("<thin", False, ("", "<thin")),
    ("  ", False, ("", "  ")),
    ("a < b </think> c", True, ("a < b", "c")),
]


@pytest.mark.parametrize("text,starts,expected", CASES)
def test_split_is_independent_of_chunking(text, starts, expected):
    assert split([text], starts) == expected
    for cut in range(len(text) + 1):
        assert split([text[:cut], text[cut:]], starts) == expected
    assert split(list(text), starts) == expected


def test_streaming_holds_only_possible_marker():
    splitter = ReasoningSplitter(*MARKERS, starts_in_reasoning=True)
    assert [p.text for p in splitter.push("step one </th")] == ["step one"]
    assert splitter.in_reasoning
    pieces = splitter.push("ink>done")
    assert [(p.kind, p.text) for p in pieces] == [("reasoning_end", ""), ("content", "done")]
    assert not splitter.in_reasoning


def test_no_reasoning_format_is_all_content():
    assert split(["<think>x</think>"], markers=(None, None)) == ("", "<think>x</think>")
