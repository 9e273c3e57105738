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
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.text.conversation import ToolSpec


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
