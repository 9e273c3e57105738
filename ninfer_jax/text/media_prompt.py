"""Media placeholders in the prompt: the template's markers expanded to one token per vision
embedding, as the Qwen VL processors expand them.

The chat template writes one placeholder per media part (`<|vision_start|><|image_pad|>
<|vision_end|>` in the Qwen templates); `expand_pieces` replaces it, in prompt order, by as
many pad tokens as the part's vision encoder output has rows after the spatial merge
(t * h * w / merge_size**2). A video placed as `<|vision_start|><|video_pad|><|vision_end|>`
becomes Qwen3-VL's layout: per temporal patch group a `<T seconds>` text (the group's mean
frame time, one decimal) followed by its own start marker, h * w / merge**2 pads and end
marker; a bare `<|video_pad|>` (Qwen2-VL templates) becomes all pads at once.
`media_spans` then finds each part's pad runs in the token ids: the positions its vision
embeddings replace.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
PAD_TOKENS = {"image": "<|image_pad|>", "video": "<|video_pad|>"}

Span = tuple[int, int]  # (first token offset, number of tokens)


@dataclasses.dataclass(frozen=True)
class MediaLayout:
    """How many placeholder tokens one prepared media part expands to."""

    kind: str  # "image" | "video"
    num_groups: int  # grid t: temporal patch groups (1 for an image)
    tokens_per_group: int  # grid h * grid w / merge_size**2
    timestamps: tuple[float, ...] = ()  # video: seconds of each group (Qwen3-VL prompt text)

    @property
    def num_tokens(self) -> int:
        return self.num_groups * self.tokens_per_group


def _problem(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_prompt")


def expand_pieces(pieces: list[tuple[str, int | None]], layouts: list[MediaLayout],
                  control_ids: dict[str, int]) -> list[tuple[str, int | None]]:
    """Tokenizer pieces (text, control id | None) with every media placeholder expanded.

    `layouts` are the conversation's media parts in prompt order; the template must have
    written exactly one placeholder per part of each kind, in that order."""
    queues = {kind: [m for m in layouts if m.kind == kind] for kind in PAD_TOKENS}
    for kind, queue in queues.items():
        if queue and PAD_TOKENS[kind] not in control_ids:
            raise _problem(f"this model's tokenizer has no {PAD_TOKENS[kind]} token, so it "
                           f"cannot take {kind} input")
    pad_ids = {control_ids[t]: kind for kind, t in PAD_TOKENS.items() if t in control_ids}
    start_id, end_id = control_ids.get(VISION_START), control_ids.get(VISION_END)
    out: list[tuple[str, int | None]] = []
    index = 0
    while index < len(pieces):
        text, control = pieces[index]
        kind = pad_ids.get(control) if control is not None else None
        if kind is None:
            out.append((text, control))
            index += 1
            continue
        if not queues[kind]:
            raise _problem(f"the chat template wrote more {kind} placeholders than the request "
                           f"has {kind}s")
        layout = queues[kind].pop(0)
        pad = (text, control)
        wrapped = (kind == "video" and out and out[-1][1] == start_id and start_id is not None
                   and index + 1 < len(pieces) and pieces[index + 1][1] == end_id)
        if not wrapped:
            out.extend([pad] * layout.num_tokens)
            index += 1
            continue
        start, end = out.pop(), pieces[index + 1]
        for group in range(layout.num_groups):
            _append_text(out, f"<{layout.timestamps[group]:.1f} seconds>")
            out.append(start)
            out.extend([pad] * layout.tokens_per_group)
            out.append(end)
        index += 2
    left = sum(len(q) for q in queues.values())
    if left:
        raise _problem(f"the chat template wrote no placeholder for {left} of the request's "
                       "media parts (a template without image/video support?)")
    return out


def _append_text(out: list, text: str) -> None:
    # The processor inserts this text into the prompt string before tokenizing it, so it
    # joins the text right before it into one piece.
    if out and out[-1][1] is None:
        out[-1] = (out[-1][0] + text, None)
    else:
        out.append((text, None))


def media_spans(ids: list[int], layouts: list[MediaLayout],
                control_ids: dict[str, int]) -> tuple[tuple[Span, ...], ...]:
    """Per media part (prompt order), its runs of pad tokens in `ids`."""
    runs: dict[str, list[Span]] = {kind: [] for kind in PAD_TOKENS}
    pad_ids = {control_ids[t]: kind for kind, t in PAD_TOKENS.items() if t in control_ids}
    position = 0
    while position < len(ids):
        kind = pad_ids.get(ids[position])
        if kind is None:
            position += 1
            continue
        end = position
        while end < len(ids) and ids[end] == ids[position]:
            end += 1
        runs[kind].append((position, end - position))
        position = end
    result = []
    for layout in layouts:
        if layout.kind == "image":
            spans = _take(runs["image"], 1)
        else:
            wrapped = layout.timestamps and len(runs["video"]) >= layout.num_groups and all(
                length == layout.tokens_per_group
                for _, length in runs["video"][:layout.num_groups])
            spans = _take(runs["video"], layout.num_groups if wrapped else 1)
        if sum(length for _, length in spans) != layout.num_tokens:
            raise _problem(f"a {layout.kind} placeholder does not expand to its "
                           f"{layout.num_tokens} tokens in the rendered prompt")
        result.append(tuple(spans))
    return tuple(result)


def _take(runs: list[Span], count: int) -> list[Span]:
    if len(runs) < count:
        raise _problem("the rendered prompt lacks a media placeholder")
    taken = runs[:count]
    del runs[:count]
    return taken
