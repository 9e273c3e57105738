"""StopMatcher: matches across arbitrary splits, releases only unambiguous text."""
import pytest

from ninfer_jax.text.stops import StopMatcher


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
