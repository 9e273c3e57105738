"""Responses function tools: direct functions, namespace groups, tool_choice, parallel calls.

A namespace member keeps its own `ToolSpec.namespace`; the model sees and writes the
qualified name "namespace.name" (function names cannot contain '.', so the join is
unambiguous) and `ToolSet.lookup` restores the separate fields for output Items.
tool_choice required, a named function and allowed_tools in required mode force a call
through the shared core (serve.core.tools, the engine's ForcedToolCall policy), as in the
other dialects; parallel_tool_calls:false returns at most one call. Everything whose
semantics the engine cannot honour (strict schemas, hosted/MCP/custom tools, deferred
loading, output schemas, callers excluding direct calls) is rejected with the offending field.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import (
    TOOL_NAME, as_json, check_enum, opt_bool, opt_string, require_list, require_object,
    require_string)
from ninfer_jax.serve.core.tools import ToolChoice, effective_tools
from ninfer_jax.text.conversation import ToolSpec


@dataclasses.dataclass
class ToolSet:
    declared: list[ToolSpec]  # every declared function, declaration order
    effective: list[ToolSpec]  # what the model is offered after tool_choice
    choice: ToolChoice  # the generation's tool choice (forced calls included)
    parallel_tool_calls: bool

    def lookup(self, qualified_name: str) -> ToolSpec | None:
        """The effective tool the model named, or None (undeclared output stays text)."""
        for tool in self.effective:
            if tool.qualified_name == qualified_name:
                return tool
        return None


def _tool_name(value, param: str) -> str:
    name = require_string(value, param, non_empty=True)
    if not TOOL_NAME.match(name):
        raise InvalidRequest(f"'{param}' must match {TOOL_NAME.pattern}; got {as_json(name)}.",
                             param=param)
    return name


def _parse_function(tool: dict, param: str, namespace: str | None) -> ToolSpec:
    name = _tool_name(tool.get("name"), f"{param}.name")
    parameters = tool.get("parameters")
    if parameters is not None:
        require_object(parameters, f"{param}.parameters")
    if opt_bool(tool.get("strict"), f"{param}.strict"):
        raise Unsupported("strict:true needs schema-constrained decoding, which this server "
                          "does not perform.", param=f"{param}.strict")
    if opt_bool(tool.get("defer_loading"), f"{param}.defer_loading"):
        raise Unsupported("Deferred tool loading is not supported.", param=f"{param}.defer_loading")
    if tool.get("output_schema") is not None:
        raise Unsupported("Tool output schemas are not supported.", param=f"{param}.output_schema")
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in require_list(callers, f"{param}.allowed_callers"):
        raise Unsupported("A tool the model may not call directly cannot be offered.",
                          param=f"{param}.allowed_callers")
    return ToolSpec(name=name, description=opt_string(tool.get("description"),
                                                       f"{param}.description"),
                    parameters=parameters, namespace=namespace)


def _parse_namespace(tool: dict, param: str) -> list[ToolSpec]:
    namespace = _tool_name(tool.get("name"), f"{param}.name")
    opt_string(tool.get("description"), f"{param}.description")
    members = require_list(tool.get("tools"), f"{param}.tools", non_empty=True)
    specs = []
    for n, member in enumerate(members):
        member_param = f"{param}.tools[{n}]"
        member = require_object(member, member_param)
        if member.get("type") != "function":
            raise Unsupported(f"Namespace members must be function tools; got "
                              f"{as_json(member.get('type'))}.", param=f"{member_param}.type")
        specs.append(_parse_function(member, member_param, namespace))
    return specs


def parse_tools(value, param: str = "tools") -> list[ToolSpec]:
    if value is None:
        return []
    specs: list[ToolSpec] = []
    for n, tool in enumerate(require_list(value, param)):
        tool_param = f"{param}[{n}]"
        tool = require_object(tool, tool_param)
        kind = tool.get("type")
        if kind == "function":
            new = [_parse_function(tool, tool_param, None)]
        elif kind == "namespace":
            new = _parse_namespace(tool, tool_param)
        else:
            raise Unsupported(f"Tool type {as_json(kind)} is not supported: only client-executed "
                              "function tools (optionally in namespaces) are; hosted, MCP and "
                              "custom tools have no executor here.", param=f"{tool_param}.type")
        seen = {spec.qualified_name for spec in specs}
        for spec in new:
            if spec.qualified_name in seen:
                raise InvalidRequest(f"Duplicate tool '{spec.qualified_name}'.",
                                     param=f"{tool_param}.name")
            seen.add(spec.qualified_name)
        specs.extend(new)
    return specs


def _function_ref(ref, param: str) -> str:
    """The qualified name of a {"type": "function", "name", "namespace"?} reference."""
    ref = require_object(ref, param)
    if ref.get("type") != "function":
        raise Unsupported("Only function tools can be chosen.", param=f"{param}.type")
    name = require_string(ref.get("name"), f"{param}.name", non_empty=True)
    namespace = opt_string(ref.get("namespace"), f"{param}.namespace")
    return f"{namespace}.{name}" if namespace else name


def _allowed_tools(choice: dict, param: str) -> ToolChoice:
    mode = check_enum(choice.get("mode"), f"{param}.mode", ("auto", "required"))
    refs = require_list(choice.get("tools"), f"{param}.tools")
    names = tuple(_function_ref(ref, f"{param}.tools[{n}]") for n, ref in enumerate(refs))
    return ToolChoice(mode, allowed=names, param=param,
                      allowed_params=tuple(f"{param}.tools[{n}]" for n in range(len(refs))))


def _choice(value, param: str) -> ToolChoice:
    if value is None or value == "auto":
        return ToolChoice("auto", param=param)
    if value in ("none", "required"):
        return ToolChoice(value, param=param)
    if isinstance(value, dict) and value.get("type") == "allowed_tools":
        return _allowed_tools(value, param)
    if isinstance(value, dict) and value.get("type") == "function":
        return ToolChoice("required", name=_function_ref(value, param), param=param,
                          name_param=f"{param}.name")
    if isinstance(value, dict):
        raise Unsupported(f"tool_choice of type {as_json(value.get('type'))} is not supported; use "
                          "auto, none, required, a function or allowed_tools.", param=param)
    raise InvalidRequest("'tool_choice' must be 'auto', 'none', 'required' or an object.",
                         param=param)


def parse_tool_choice(value, declared: list[ToolSpec], parallel,
                      param: str = "tool_choice") -> ToolSet:
    """Resolve tool_choice and parallel_tool_calls against the declared tools (the shared
    core's resolution: serve.core.tools)."""
    choice = _choice(value, param)
    effective = effective_tools(declared, choice)
    parallel = opt_bool(parallel, "parallel_tool_calls")
    return ToolSet(list(declared), effective, choice, parallel is not False)
