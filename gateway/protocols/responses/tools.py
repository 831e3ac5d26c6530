"""Responses tools -> chat-completions tools, and the names of namespace tools both ways.

Function tools are flat in the Responses API (``{type, name, parameters}``) and nested in chat
completions (``{type, function: {name, parameters}}``). A ``namespace`` tool (a named group of
functions, as Codex CLI sends for its sub-agent tools) becomes its functions, each named
``<namespace>__<name>``; ``split_name`` takes such a name apart again for the reply. A
``custom`` tool (free text in, Codex CLI's ``apply_patch``) becomes a function with one string
parameter (``custom``); ``declared`` names them, so that their calls go back as
``custom_tool_call`` items. The tools of ``additional_tools`` input items (tools a client adds
partway through a conversation) join the request's. The tools OpenAI runs itself are left out
(``HOSTED_TOOLS``: no other provider runs them, and Codex CLI offers web search in every
request), and so is a ``tool_choice`` left without tools; the tools a client runs with item
types of their own (``local_shell``, ``computer_use_preview``) and any other tool type are a
400.
"""

from __future__ import annotations

from gateway.errors import InvalidRequestError
from gateway.protocols.responses.custom import function_of
from gateway.types import JSON


def bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message)


# tools OpenAI runs on its side: left out, since no other provider runs them
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
        "tool_search",
    }
)
# tools the client runs for OpenAI's own models, with item types of their own: refused
CLIENT_RUN_TOOLS = frozenset({"local_shell", "computer_use_preview"})
MEMBER_TYPES = ("function", "custom")  # the tools carried, alone or in a namespace (a tuple:
# a type may be any JSON value, hashable or not)
SEPARATOR = "__"  # between a namespace and a function's name


def tool_name(namespace: str, name: str) -> str:
    return f"{namespace}{SEPARATOR}{name}"


def tool_lists(payload: JSON) -> list[tuple[str, JSON]]:
    """A request's lists of tools, each with where it is: its ``tools``, then those of its
    ``additional_tools`` items."""
    if not isinstance(payload, dict):
        return []
    lists = [("tools", payload["tools"])] if payload.get("tools") is not None else []
    items = payload.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            lists.append((f"input[{i}].tools", item.get("tools")))
    return lists


def all_tools(payload: JSON) -> list[JSON]:
    """Every tool of a request, converted (``decode_tools``)."""
    return [t for where, tools in tool_lists(payload) for t in decode_tools(tools, where)]


def declared(payload: JSON) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The namespaces of a request's tools (what a call's name may start with), and the
    function names its custom tools go by (``<namespace>__<name>`` in a namespace)."""
    spaces: list[str] = []
    custom: list[str] = []
    tools = [t for _, ts in tool_lists(payload) if isinstance(ts, list) for t in ts]
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "custom":
            custom.append(tool["name"])
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            spaces.append(tool["name"])
            custom.extend(
                tool_name(tool["name"], m["name"])
                for m in tool["tools"]
                if isinstance(m, dict)
                and m.get("type") == "custom"
                and isinstance(m.get("name"), str)
            )
    return tuple(spaces), tuple(custom)


def split_name(name: str, known: tuple[str, ...]) -> tuple[str | None, str]:
    """(namespace, name) of a function the upstream called."""
    for namespace in known:
        prefix = namespace + SEPARATOR
        if name.startswith(prefix):
            return namespace, name[len(prefix) :]
    return None, name


def decode_tools(tools: JSON, at: str = "tools") -> list[JSON]:
    if not isinstance(tools, list):
        raise bad(f"'{at}' must be a list")
    out: list[JSON] = []
    for i, tool in enumerate(tools):
        where = f"{at}[{i}]"
        if not isinstance(tool, dict):
            raise bad(f"'{where}' must be an object")
        kind = tool.get("type")
        if kind in MEMBER_TYPES:
            out.append(decode_function(tool, where, None))
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not namespace or not isinstance(inner, list):
                raise bad(f"'{where}': a namespace needs a 'name' and a list of 'tools'")
            for j, member in enumerate(inner):
                if not isinstance(member, dict) or member.get("type") not in MEMBER_TYPES:
                    raise bad(f"'{where}.tools[{j}]': only function and custom tools are carried")
                out.append(decode_function(member, f"{where}.tools[{j}]", namespace))
        elif isinstance(kind, str) and kind in CLIENT_RUN_TOOLS:
            raise bad(
                f"'{where}.type' {kind!r} is not supported: its calls and their results are item "
                "types of OpenAI's own models, which the gateway does not carry; offer the "
                "command or the computer as a function tool"
            )
        elif not isinstance(kind, str) or kind not in HOSTED_TOOLS:
            raise bad(
                f"'{where}.type' {str(kind)[:40]!r} is not supported; function and custom tools "
                "are carried to every provider"
            )
    return out


def decode_function(tool: dict[str, JSON], where: str, namespace: str | None) -> JSON:
    """A function or custom tool (a function taking its text, ``custom``) as a chat tool."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"'{where}.name' must be a string")
    if namespace is not None:
        name = tool_name(namespace, name)
    if tool.get("type") == "custom":
        return function_of(tool, where, name)
    function: dict[str, JSON] = {"name": name}
    for field in ("description", "parameters", "strict"):
        if tool.get(field) is not None:
            function[field] = tool[field]
    return {"type": "function", "function": function}


def decode_tool_choice(choice: JSON, tools: list[JSON]) -> JSON:
    """The chat ``tool_choice`` for the ``tools`` carried: none when no tool is carried (the
    hosted ones left out: an upstream refuses a choice without tools), a 400 when it names a
    function that is not among them."""
    if choice in ("auto", "none", "required"):
        return choice if tools else None
    if isinstance(choice, dict) and choice.get("type") in MEMBER_TYPES:
        name = choice.get("name")
        if isinstance(name, str) and name:
            if not any(t["function"]["name"] == name for t in tools):
                raise bad(f"'tool_choice' names the tool {name[:64]!r}, which is not in 'tools'")
            return {"type": "function", "function": {"name": name}}
    raise bad("'tool_choice' must be auto, none, required or {type: function or custom, name}")
