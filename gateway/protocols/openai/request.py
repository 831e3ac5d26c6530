"""Chat-completions requests, both ways: a client's body is the internal shape already (it is
checked, not copied); toward an openai channel it loses the gateway's extension fields
(``gateway.types``) and a stream asks for its usage chunk, so that every stream can be billed.
"""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequestError
from gateway.protocols.base import UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.types import JSON, ChatRequest

DROP_UPSTREAM = ("top_k",)
COMPLETION_LIMIT = "max_completion_tokens"
MESSAGE_EXTENSIONS = ("reasoning_signature", "redacted_reasoning", "reasoning_content", "is_error")


def body_model(payload: JSON) -> str:
    """The model a request body names (chat completions, messages): a 400 when the body is
    not an object or names none, before anything else is looked at."""
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a string")
    return model


def check_chat_request(payload: JSON) -> None:
    body_model(payload)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] must be an object with a 'role'")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean")


def check_facts(payload: dict[str, JSON]) -> None:
    """The fields the gateway itself reads of a chat-completions body, pass-through included:
    the stream flag, whether its usage is wanted, the maximum output (held against the
    balance)."""
    REQUEST.opt_bool(payload.get("stream"), "stream")
    options = REQUEST.opt_obj(payload.get("stream_options"), "stream_options")
    if options is not None:
        REQUEST.opt_bool(options.get("include_usage"), "stream_options", "include_usage")
    REQUEST.opt_integer(payload.get("max_tokens"), "max_tokens")
    REQUEST.opt_integer(payload.get("max_completion_tokens"), "max_completion_tokens")


def usage_wanted(payload: JSON) -> bool:
    """Whether a chat-completions client asked for the usage chunk of its stream."""
    opts = payload.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _strip_extensions(messages: list[JSON]) -> list[JSON]:
    out: list[JSON] = []
    for i, m in enumerate(messages):
        m = REQUEST.obj(m, "messages", i)
        calls = REQUEST.opt_array(m.get("tool_calls"), f"messages[{i}]", "tool_calls")
        signed = False
        for k, tc in enumerate(calls):
            signed |= "thought_signature" in REQUEST.obj(tc, f"messages[{i}].tool_calls", k)
        if signed or any(k in m for k in MESSAGE_EXTENSIONS):
            m = {k: v for k, v in m.items() if k not in MESSAGE_EXTENSIONS}
            if calls:
                m["tool_calls"] = [
                    {k: v for k, v in tc.items() if k != "thought_signature"} for tc in calls
                ]
        out.append(m)
    return out


def headers(target: UpstreamTarget) -> dict[str, str]:
    out = {"Content-Type": "application/json"}
    if target.api_key:
        out["Authorization"] = f"Bearer {target.api_key}"
    return out


def with_usage(options: JSON) -> JSON:
    """``stream_options`` asking for the usage chunk, the client's other options kept."""
    return {**(options if isinstance(options, dict) else {}), "include_usage": True}


def output_limit(body: dict[str, JSON], target: UpstreamTarget) -> None:
    """``max_tokens`` moved to ``max_completion_tokens`` for an upstream model that takes only
    that (``target.max_tokens_field``); a body that has both keeps the latter."""
    if target.max_tokens_field == COMPLETION_LIMIT and "max_tokens" in body:
        limit = body.pop("max_tokens")
        body.setdefault(COMPLETION_LIMIT, limit)


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    body: dict[str, JSON] = {k: v for k, v in req.items() if k not in DROP_UPSTREAM}
    body["model"] = target.model
    output_limit(body, target)
    body["messages"] = _strip_extensions(REQUEST.opt_array(body.get("messages"), "messages"))
    if target.stream:
        body["stream"] = True
        body["stream_options"] = with_usage(body.get("stream_options"))
    else:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return UpstreamCall(
        url=target.base_url + "/chat/completions", headers=headers(target), body=orjson.dumps(body)
    )
