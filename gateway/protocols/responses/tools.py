"""Responses tools -> chat-completions tools, and the names of namespace tools both ways.

Function tools are flat in the Responses API (``{type, name, parameters}``) and nested in chat
completions (``{type, function: {name, parameters}}``). A ``namespace`` tool (a named group of
functions, as Codex CLI sends for its sub-agent tools) becomes its functions, each named
``<namespace>__<name>``; ``split_name`` takes such a name apart again for the reply. The tools
OpenAI runs itself are left out (``HOSTED_TOOLS``: no other provider runs them, and Codex CLI
offers web search in every request), and so is a ``tool_choice`` left without tools; the
tools a client runs with item types of their own (``local_shell``, ``computer_use_preview``)
and any other tool type are a 400.
"""

from __future__ import annotations

from gateway.errors import InvalidRequestError
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
SEPARATOR = "__"  # between a namespace and a function's name


def tool_name(namespace: str, name: str) -> str:
    return f"{namespace}{SEPARATOR}{name}"


def namespaces(payload: JSON) -> tuple[str, ...]:
    """The namespaces of a request's tools (what a call's name may start with)."""
    tools = payload.get("tools") if isinstance(payload, dict) else None
    if not isinstance(tools, list):
        return ()
    return tuple(
        t["name"]
        for t in tools
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str)
    )


def split_name(name: str, known: tuple[str, ...]) -> tuple[str | None, str]:
    """(namespace, name) of a function the upstream called."""
    for namespace in known:
        prefix = namespace + SEPARATOR
        if name.startswith(prefix):
            return namespace, name[len(prefix) :]
    return None, name


def decode_tools(tools: JSON) -> list[JSON]:
    if not isinstance(tools, list):
        raise bad("'tools' must be a list")
    out: list[JSON] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(f"'{where}' must be an object")
        kind = tool.get("type")
        if kind == "function":
            out.append(decode_function(tool, where, None))
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not namespace or not isinstance(inner, list):
                raise bad(f"'{where}': a namespace needs a 'name' and a list of 'tools'")
            for j, member in enumerate(inner):
                if not isinstance(member, dict) or member.get("type") != "function":
                    raise bad(f"'{where}.tools[{j}]': only function tools are carried")
                out.append(decode_function(member, f"{where}.tools[{j}]", namespace))
        elif isinstance(kind, str) and kind in CLIENT_RUN_TOOLS:
            raise bad(
                f"'{where}.type' {kind!r} is not supported: its calls and their results are item "
                "types of OpenAI's own models, which the gateway does not carry; offer the "
                "command or the computer as a function tool"
            )
        elif not isinstance(kind, str) or kind not in HOSTED_TOOLS:
            raise bad(
                f"'{where}.type' {str(kind)[:40]!r} is not supported; function tools are carried "
                "to every provider"
            )
    return out


def decode_function(tool: dict[str, JSON], where: str, namespace: str | None) -> JSON:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"'{where}.name' must be a string")
    function: dict[str, JSON] = {"name": name if namespace is None else tool_name(namespace, name)}
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
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str) and name:
            if not any(t["function"]["name"] == name for t in tools):
                raise bad(
                    f"'tool_choice' names the function {name[:64]!r}, which is not in 'tools'"
                )
            return {"type": "function", "function": {"name": name}}
    raise bad("'tool_choice' must be auto, none, required or {type: function, name}")
