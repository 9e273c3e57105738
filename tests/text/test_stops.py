"""StopMatcher: matches across arbitrary splits, releases only unambiguous text."""
import pytest

from ninfer_jax.text.stops import StopMatcher, overlaps


def run(pieces, stops):
    matcher = StopMatcher(stops)
    out = "".join(matcher.push(p) for p in pieces)
    if matcher.match is None:
        out += matcher.flush()
    return out, matcher.match


@pytest.mark.parametrize("stops", [["END"], ["x", "END"], ["ENDING", "DIN"]])
def test_every_split_gives_the_unsplit_result(stops):
    text = "The story goes on. ENDING here. More text."
    expected = run([text], stops)
    for cut in range(len(text) + 1):
        assert run([text[:cut], text[cut:]], stops) == expected
    assert run(list(text), stops) == expected


def test_match_withholds_stop_and_everything_after():
    out, match = run(["Hello wor", "ld STOP and more"], ["STOP"])
    assert out == "Hello world "
    assert (match.stop, match.start, match.end) == ("STOP", 12, 16)


def test_earliest_completed_stop_wins():
    # "DIN" completes inside "ENDING" before "ENDING" itself completes.
    out, match = run(list("xxENDINGyy"), ["ENDING", "DIN"])
    assert out == "xxEN" and match.stop == "DIN"


def test_held_prefix_is_released_when_no_match_follows():
    matcher = StopMatcher(["</end>"])
    assert matcher.push("abc</e") == "abc"
    assert matcher.push("x") == "</ex"
    assert matcher.push("</en") == ""
    assert matcher.flush() == "</en"


def test_no_stops_passes_text_through_and_empty_stop_rejected():
    assert run(["a", "b"], []) == ("ab", None)
    with pytest.raises(ValueError):
        StopMatcher([""])


THINK = ("<think>", "</think>")
REPLY = "<think>\nI think, <then>.\n</think>\n\nAnswer <tea> and <thi"


def run_marked(pieces, stops):
    matcher = StopMatcher(stops, markers=THINK)
    out = "".join(matcher.push(p) for p in pieces)
    return out + matcher.flush(), matcher.match


@pytest.mark.parametrize("stops", [["hin"], ["<t"], ["/th", "swer"], ["k>"], ["</think>"],
                                   ["<th"], ["nk>\n\nA", "ea"]])
def test_with_markers_every_split_gives_the_unsplit_result(stops):
    expected = run_marked([REPLY], stops)
    for cut in range(len(REPLY) + 1):
        assert run_marked([REPLY[:cut], REPLY[cut:]], stops) == expected
    assert run_marked(list(REPLY), stops) == expected


def test_a_match_cutting_into_a_marker_is_no_match():
    # "hin" inside "<think>" is skipped; the reasoning's "think" matches.
    out, match = run_marked(list(REPLY), ["hin"])
    assert out == "<think>\nI t" and (match.start, match.end) == (11, 14)
    # Only inside markers (or across one's edge): no match at all.
    assert run_marked(list(REPLY), ["/th", "k>\n"]) == (REPLY, None)


def test_a_match_holding_a_whole_marker_stops():
    out, match = run_marked(list(REPLY), ["</think>"])
    assert out == "<think>\nI think, <then>.\n" and match.stop == "</think>"


def test_a_match_waiting_on_a_partial_marker_keeps_its_own_offsets():
    matcher = StopMatcher(["<t"], markers=THINK)
    assert matcher.push("ab <t") == "ab "  # "<t" may still become "<think>"
    assert matcher.match is None
    assert matcher.push("hink>") == "<think>"
    assert matcher.match is None  # it did: the match was inside the marker
    assert matcher.push(" x <t") == " x "
    assert matcher.push("ea") == "" and (matcher.match.start, matcher.match.end) == (13, 15)


def test_a_partial_marker_at_the_end_is_text_and_its_match_stands():
    out, match = run_marked(list("ab <thi"), ["<th"])
    assert out == "ab " and (match.start, match.end) == (3, 6)


# ------------------------------------------------------------------ overlaps (forced text)

FORCED = '<tool_call>\n{"name": "get_weather"'


@pytest.mark.parametrize("stop, expected", [
    ("<tool_call>", True),  # the whole marker
    ("\n", True), ("weather", True),
    ('r", "arguments', True),  # runs out of the forced text into the model's
    ("x<tool_call>", True),  # runs into it from the text before
    ("<tool", False), ("call>", False),  # would cut the marker: never a match
    ("zzz", False), ("\n\n", False), ("search", False)])
def test_overlaps_the_forced_text_as_the_matcher_would(stop, expected):
    assert overlaps(stop, FORCED, ["<tool_call>"]) is expected
    if expected:  # and StopMatcher does fire on some text around it
        around = ["", "x", 'r", "arguments', "\n"]
        assert any(_fires(stop, pre + FORCED + post) for pre in around for post in around)


def test_overlaps_from_a_start_only_sees_pieces_from_there():
    assert overlaps('r"', 'get_weather"', earliest=0)
    assert overlaps('",', 'get_weather"', earliest=0)  # runs past the end
    assert not overlaps('x get', 'get_weather"', earliest=0)


def _fires(stop: str, text: str) -> bool:
    matcher = StopMatcher([stop], markers=["<tool_call>"])
    matcher.push(text)
    matcher.flush()
    return matcher.match is not None
