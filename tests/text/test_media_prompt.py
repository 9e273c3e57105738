"""Placeholder expansion (text/media_prompt.py) on hand-made tokenizer pieces."""
import pytest

from ninfer_jax.errors import InvalidRequest
from ninfer_jax.text.media_prompt import MediaLayout, expand_pieces, media_spans

CONTROLS = {"<|vision_start|>": 1, "<|vision_end|>": 2, "<|image_pad|>": 3,
            "<|video_pad|>": 4}
START, END, IMAGE, VIDEO = (("<|vision_start|>", 1), ("<|vision_end|>", 2),
                            ("<|image_pad|>", 3), ("<|video_pad|>", 4))


def ids_of(pieces):
    # text pieces as one id (9) each: enough to check positions
    return [control if control is not None else 9 for _, control in pieces]


def test_images_and_a_wrapped_video_expand_in_order():
    pieces = [("user\n", None), START, IMAGE, END, ("and", None), START, VIDEO, END,
              START, IMAGE, END]
    layouts = [MediaLayout("image", 1, 3), MediaLayout("video", 2, 2, (0.5, 1.25)),
               MediaLayout("image", 1, 1)]
    out = expand_pieces(pieces, layouts, CONTROLS)
    assert out == [("user\n", None), START, IMAGE, IMAGE, IMAGE, END,
                   ("and<0.5 seconds>", None), START, VIDEO, VIDEO, END,
                   ("<1.2 seconds>", None), START, VIDEO, VIDEO, END,
                   START, IMAGE, END]
    spans = media_spans(ids_of(out), layouts, CONTROLS)
    assert spans == (((2, 3),), ((8, 2), (13, 2)), ((17, 1),))


def test_bare_video_pad_expands_whole():
    out = expand_pieces([("x", None), VIDEO], [MediaLayout("video", 2, 3, (0.0, 1.0))],
                        CONTROLS)
    assert out == [("x", None)] + [VIDEO] * 6


@pytest.mark.parametrize("pieces,layouts,fragment", [
    ([("x", None)], [MediaLayout("image", 1, 4)], "no placeholder"),
    ([START, IMAGE, END, START, IMAGE, END], [MediaLayout("image", 1, 4)], "more image"),
    ([VIDEO], [MediaLayout("image", 1, 4)], "more video"),
])
def test_placeholder_count_mismatch_is_invalid_prompt(pieces, layouts, fragment):
    with pytest.raises(InvalidRequest) as caught:
        expand_pieces(pieces, layouts, CONTROLS)
    assert caught.value.code == "invalid_prompt" and fragment in caught.value.message


def test_tokenizer_without_pad_token():
    with pytest.raises(InvalidRequest, match="no <\\|image_pad\\|> token"):
        expand_pieces([("x", None)], [MediaLayout("image", 1, 1)], {})
