"""Tool choice, shared by every wire dialect: which tools the model is offered, which call
is forced, how many calls a reply may return, and whether the model can call tools at all.

Each dialect lowers its own wire shape (Chat's {"type":"function","function":{...}},
Responses' {"type":"function","name":...}, Anthropic's {"type":"tool","name":...}) into one
`ToolChoice`, naming its own fields for errors; `effective_tools` resolves it against the
declared tools (an unknown name is a 400 on the dialect's field) and `check_tool_format`
rejects tools for a model whose artifact declares no tool-call format, instead of
rendering and then silently ignoring them. The forced call itself is the engine's
ForcedToolCall policy (generation._forced_call); GenerationOptions.parallel_tool_calls
False becomes the output parser's one-call limit (OutputPlan.max_calls).
`check_stops_spare_forced_call` refuses a stop that the forced call's own text would fire
(the reply would end at the marker with the promised call missing).
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import as_json
from ninfer_jax.text.conversation import ToolSpec
from ninfer_jax.text.stops import overlaps


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"  # auto | none | required
    name: str | None = None  # a named function: required, and the only tool offered
    allowed: tuple[str, ...] | None = None  # allowed_tools filter (qualified names)
    param: str = "tool_choice"  # the field a choice that cannot be honoured names
    name_param: str | None = None  # the field holding `name` (None: `param`)
    allowed_params: tuple[str, ...] = ()  # the field of each allowed name (None: Chat's)


def _allowed_param(choice: ToolChoice, index: int) -> str:
    if index < len(choice.allowed_params):
        return choice.allowed_params[index]
    return f"{choice.param}.allowed_tools.tools[{index}]"


def effective_tools(tools: list[ToolSpec], choice: ToolChoice) -> list[ToolSpec]:
    """The tools the template offers under `choice` (declaration order kept)."""
    if choice.mode == "none":
        return []
    if choice.allowed is not None:
        declared = {t.qualified_name for t in tools}
        for index, name in enumerate(choice.allowed):
            if name not in declared:
                raise InvalidRequest(f"allowed_tools names '{name}', which is not among the "
                                     "request's tools.", param=_allowed_param(choice, index))
        tools = [t for t in tools if t.qualified_name in choice.allowed]
    if choice.name is not None:
        tools = [t for t in tools if t.qualified_name == choice.name]
        if not tools:
            raise InvalidRequest(f"tool_choice names '{choice.name}', which is not among "
                                 "the request's tools.", param=choice.name_param or choice.param)
    if choice.mode == "required" and not tools:
        raise InvalidRequest("tool_choice requires a tool call but no tool is offered.",
                             param=choice.param)
    return tools


def check_tool_format(tool_call_format: str | None, tools: list[ToolSpec],
                      param: str = "tools") -> None:
    """Tools offered to a model that cannot write a parseable call are refused (400)."""
    if tools and not tool_call_format:
        raise Unsupported(f"'{param}' cannot be honoured: this model's artifact declares no "
                          "tool-call format, so its replies cannot carry tool calls; send "
                          "the request without tools (or with tool_choice none).",
                          param=param)


@dataclasses.dataclass(frozen=True)
class ForcedText:
    """What a forced call writes whatever the model samples: `prefix` (its ids `prefix_ids`,
    committed as one forced run), then one of `targets` (an offered name plus the format's
    name terminator, held by the name rule); `markers` are atomic for stop strings."""

    prefix: str
    prefix_ids: tuple[int, ...]
    targets: tuple[str, ...]
    markers: tuple[str, ...]


def check_stops_spare_forced_call(forced: ForcedText, stops: tuple[str, ...], stop_param: str,
                                  stop_ids: tuple[int, ...], token_text) -> None:
    """A stop string that could match on the forced text (the whole marker, a piece of the
    prefix or of a name, or a match that runs into or out of them) or a stop token the
    forcing commits (a prefix token, a token whose text can be part of a name) would end the
    reply inside the call the client required, with no call: a 400 on the stop field instead.
    The arguments the model writes after the name are its own text and match as usual."""
    for stop in stops:
        if any(overlaps(stop, forced.prefix + target, forced.markers)
               for target in forced.targets):
            raise InvalidRequest(
                f"'{stop_param}' holds {as_json(stop)}, which would match on the text of the "
                f"forced tool call ({as_json(forced.prefix + forced.targets[0])}...) and end "
                "the reply before the call that tool_choice requires; remove it or let the "
                "model choose (tool_choice auto).", param=stop_param)
    for token in stop_ids:
        piece = token_text(token)
        if token in forced.prefix_ids or (piece and any(
                overlaps(piece, target, earliest=0) for target in forced.targets)):
            raise InvalidRequest(
                f"'stop_token_ids' holds {token} ({as_json(piece)}), a token the forced tool "
                "call commits, so the reply would end before the call that tool_choice "
                "requires; remove it or let the model choose (tool_choice auto).",
                param="stop_token_ids")
