"""Responses function tools: direct functions, namespace groups, tool_choice, parallel calls.

A namespace member keeps its own `ToolSpec.namespace`; the model sees and writes the
qualified name "namespace.name" (function names cannot contain '.', so the join is
unambiguous) and `ToolSet.lookup` restores the separate fields for output Items.
Everything whose semantics the engine cannot honour (strict schemas, forced or named
choice, hosted/MCP/custom tools, deferred loading, output schemas, callers excluding
direct calls) is rejected with the offending field.
"""
from __future__ import annotations

import dataclasses

from ninfer_jax.errors import InvalidRequest, Unsupported
from ninfer_jax.serve.core.fields import (
    TOOL_NAME, check_enum, opt_bool, opt_string, require_list, require_object, require_string)
from ninfer_jax.text.conversation import ToolSpec



@dataclasses.dataclass
class ToolSet:
    declared: list[ToolSpec]  # every declared function, declaration order
    effective: list[ToolSpec]  # what the model is offered after tool_choice
    choice_mode: str  # "auto" | "none"
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
        raise InvalidRequest(f"'{param}' must match {TOOL_NAME.pattern}; got {name!r}.",
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
                              f"{member.get('type')!r}.", param=f"{member_param}.type")
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
            raise Unsupported(f"Tool type {kind!r} is not supported: only client-executed "
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


def _allowed_tools(choice: dict, declared: list[ToolSpec], param: str) -> list[ToolSpec]:
    mode = check_enum(choice.get("mode"), f"{param}.mode", ("auto", "required"))
    if mode == "required":
        raise Unsupported("allowed_tools with mode 'required' forces a call, which needs "
                          "constrained decoding.", param=f"{param}.mode")
    wanted = set()
    for n, ref in enumerate(require_list(choice.get("tools"), f"{param}.tools")):
        ref_param = f"{param}.tools[{n}]"
        ref = require_object(ref, ref_param)
        if ref.get("type") != "function":
            raise Unsupported("allowed_tools may only name function tools.",
                              param=f"{ref_param}.type")
        name = require_string(ref.get("name"), f"{ref_param}.name", non_empty=True)
        namespace = opt_string(ref.get("namespace"), f"{ref_param}.namespace")
        qualified = f"{namespace}.{name}" if namespace else name
        if not any(spec.qualified_name == qualified for spec in declared):
            raise InvalidRequest(f"allowed_tools names undeclared tool '{qualified}'.",
                                 param=ref_param)
        wanted.add(qualified)
    return [spec for spec in declared if spec.qualified_name in wanted]


def parse_tool_choice(value, declared: list[ToolSpec], parallel,
                      param: str = "tool_choice") -> ToolSet:
    """Resolve tool_choice and parallel_tool_calls against the declared tools."""
    if value is None or value == "auto":
        mode, effective = "auto", list(declared)
    elif value == "none":
        mode, effective = "none", []
    elif value == "required":
        raise Unsupported("tool_choice 'required' forces a call, which needs constrained "
                          "decoding.", param=param)
    elif isinstance(value, dict) and value.get("type") == "allowed_tools":
        mode, effective = "auto", _allowed_tools(value, declared, param)
    elif isinstance(value, dict):
        raise Unsupported(f"tool_choice of type {value.get('type')!r} is not supported; use "
                          "auto, none, or allowed_tools in auto mode.", param=param)
    else:
        raise InvalidRequest("'tool_choice' must be 'auto', 'none' or an object.", param=param)
    parallel = opt_bool(parallel, "parallel_tool_calls")
    if parallel is False and effective:
        raise Unsupported("parallel_tool_calls:false would need single-call enforcement; it "
                          "is accepted only when no tool is callable.",
                          param="parallel_tool_calls")
    return ToolSet(list(declared), effective, mode, parallel is not False)
