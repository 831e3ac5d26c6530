"""Chat-completions requests, both ways: a client's body is the internal shape already (it is
checked, not copied); toward an openai channel it loses the gateway's extension fields
(``gateway.types``) and a stream asks for its usage chunk, so that every stream can be billed.
"""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequestError
from gateway.protocols.base import UpstreamCall, UpstreamTarget
from gateway.types import JSON, ChatRequest

DROP_UPSTREAM = ("top_k",)
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


def usage_wanted(payload: JSON) -> bool:
    """Whether a chat-completions client asked for the usage chunk of its stream."""
    opts = payload.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _strip_extensions(messages: list[JSON]) -> list[JSON]:
    out: list[JSON] = []
    for m in messages:
        if any(k in m for k in MESSAGE_EXTENSIONS) or (
            m.get("tool_calls") and any("thought_signature" in tc for tc in m["tool_calls"])
        ):
            m = {k: v for k, v in m.items() if k not in MESSAGE_EXTENSIONS}
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {k: v for k, v in tc.items() if k != "thought_signature"}
                    for tc in m["tool_calls"]
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


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    body: dict[str, JSON] = {k: v for k, v in req.items() if k not in DROP_UPSTREAM}
    body["model"] = target.model
    body["messages"] = _strip_extensions(body.get("messages") or [])
    if target.stream:
        body["stream"] = True
        body["stream_options"] = with_usage(body.get("stream_options"))
    else:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return UpstreamCall(
        url=target.base_url + "/chat/completions", headers=headers(target), body=orjson.dumps(body)
    )
