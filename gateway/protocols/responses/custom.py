"""Custom (freeform) tools as function tools, for channels that have no custom tools.

A Responses ``custom`` tool (``{type: custom, name, description, format}``: Codex CLI's
``apply_patch``) takes free text, optionally constrained by a grammar (``format: {type:
grammar, syntax: lark | regex, definition}``), and its call is a ``custom_tool_call`` item
with that text as ``input``. Chat completions, the messages protocol and generate-content
have only function tools, so a custom tool goes to them as a function with one string
parameter, ``input``, whose description carries the grammar (no other provider constrains
output by a grammar: the model is told it instead). The upstream's call of that function
comes back as a ``custom_tool_call`` whose ``input`` is the parameter's text, and a
``custom_tool_call`` / ``custom_tool_call_output`` of an earlier turn goes back as the
function's call and result. An openai channel that serves the Responses API gets the tool as
it is (``passthrough``).

Not carried to the function: the grammar as a constraint (it is text in the description),
``defer_loading``, ``allowed_callers``.
"""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequestError
from gateway.types import JSON

INPUT = "input"  # the one parameter of a custom tool's function
FREE_TEXT = "The tool's whole input, as plain text."
SYNTAXES = ("lark", "regex")  # a tuple: a syntax may be any JSON value, hashable or not


def function_of(tool: dict[str, JSON], where: str, name: str) -> JSON:
    """The chat-completions function tool standing for a custom tool."""
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"'{where}.description' must be a string")
    parameter = {"type": "string", "description": _input_description(tool.get("format"), where)}
    function: dict[str, JSON] = {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {INPUT: parameter},
            "required": [INPUT],
            "additionalProperties": False,
        },
    }
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _input_description(fmt: JSON, where: str) -> str:
    if fmt is None:
        return FREE_TEXT
    if not isinstance(fmt, dict):
        raise InvalidRequestError(f"'{where}.format' must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return FREE_TEXT
    if kind != "grammar":
        raise InvalidRequestError(f"'{where}.format.type' must be text or grammar")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in SYNTAXES or not isinstance(definition, str) or not definition:
        raise InvalidRequestError(
            f"'{where}.format': a grammar needs a 'syntax' (lark or regex) and a 'definition'"
        )
    return f"{FREE_TEXT} It must match this {syntax} grammar:\n{definition}"


def arguments_of(text: str) -> str:
    """A custom call's input as the arguments of its function's call."""
    return orjson.dumps({INPUT: text}).decode()


def input_of(arguments: str) -> str:
    """The text of a custom call from its function's arguments: the ``input`` parameter, or,
    from a model that did not keep to the schema, the arguments as they are."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(INPUT), str):
        return str(value[INPUT])
    return value if isinstance(value, str) else arguments
