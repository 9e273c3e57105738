"""engine/prompt_media.py: the MRoPE layout from the items' spans equals model/vision/mrope.py's
from token types (the layout tested against transformers), feature rows and cache keys."""
from __future__ import annotations

import types

import numpy as np
import pytest

from ninfer_jax.engine.prompt_media import MediaKeyedTokens, build
from ninfer_jax.engine.request import MediaInput
from ninfer_jax.model.vision import mrope

IMAGE, VIDEO = 900, 901
VISION = types.SimpleNamespace(image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=2)


def prompt_with(runs):
    """Token ids: 3 text tokens before each (kind, length) run and 2 after the last."""
    ids, spans = [], []
    for kind, length in runs:
        ids += [1, 2, 3]
        spans.append((len(ids), length))
        ids += [IMAGE if kind == "image" else VIDEO] * length
    return ids + [4, 5], spans


def item(kind, digest, grid_thw, spans):
    return MediaInput(kind, digest, grid_thw, tuple(spans), pixel_values=None)


def test_positions_and_delta_equal_mrope_from_token_types():
    ids, spans = prompt_with([("image", 6), ("video", 4), ("video", 4), ("image", 8)])
    items = (item("image", "a", (1, 4, 6), spans[:1]), item("video", "v", (2, 4, 4), spans[1:3]),
             item("image", "b", (1, 8, 4), spans[3:]))
    media = build(items, len(ids), ids)
    expected, delta = mrope.rope_positions(mrope.token_types(ids, VISION),
                                           [(1, 4, 6), (1, 8, 4)], [(2, 4, 4)], VISION)
    np.testing.assert_array_equal(media.rope_positions, expected)
    assert media.rope_delta == delta < 0
    # past the prompt every axis is position + delta
    tail = media.chunk_positions(len(ids) - 1, 3)
    np.testing.assert_array_equal(tail[:, 1:], np.broadcast_to(
        np.arange(len(ids), len(ids) + 2) + delta, (3, 2)))
    # feature rows: each item's tokens in order, the items concatenated in prompt order
    rows = media.feature_row[media.feature_row >= 0]
    np.testing.assert_array_equal(rows, np.arange(6 + 8 + 8))
    assert media.item_rows == (0, 6, 14) and media.end == len(ids) - 2


def test_a_bare_video_run_is_cut_into_its_frames():
    ids, spans = prompt_with([("video", 8)])
    bare = build((item("video", "v", (2, 4, 4), spans),), len(ids), ids)
    framed = build((item("video", "v", (2, 4, 4), [spans[0][:1] + (4,),
                                                     (spans[0][0] + 4, 4)]),), len(ids), ids)
    np.testing.assert_array_equal(bare.rope_positions, framed.rope_positions)


def test_cache_keys_carry_the_digest_on_placeholders_only():
    ids, spans = prompt_with([("image", 6)])
    first = build((item("image", "a", (1, 4, 6), spans),), len(ids), ids)
    other = build((item("image", "b", (1, 4, 6), spans),), len(ids), ids)
    a, b = MediaKeyedTokens(ids, first.marks), MediaKeyedTokens(ids, other.marks)
    assert len(a) == len(ids) and a[0:3] == b[0:3] == ids[0:3]
    assert a[3:9] != b[3:9] and a[3:9] == [(IMAGE, "a", k) for k in range(6)]
    assert a[9:] == ids[9:]


@pytest.mark.parametrize("spans,message", [
    ([(3, 5)], "does not fit the grid"),
    ([(3, 6), (5, 6)], "placeholder runs"),
    ([(20, 6)], "leave the prompt"),
])
def test_spans_that_disagree_are_refused(spans, message):
    ids, _ = prompt_with([("image", 6)])
    items = tuple(item("image", str(i), (1, 4, 6), [span]) for i, span in enumerate(spans))
    with pytest.raises(ValueError, match=message):
        build(items, len(ids), ids)
