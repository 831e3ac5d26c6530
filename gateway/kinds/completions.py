"""The legacy completions kind: ``POST /v1/completions`` (a ``prompt`` to continue, and for
fill-in-the-middle a ``suffix`` to end on, as code-completion tools send it), relayed to
openai-type channels (openai; azure at its deployment's address) with only the model renamed.

The reply and its stream come back as the upstream sent them but for the model name (the
client's); a stream asks its upstream for the usage chunk (``stream_options.include_usage``),
which reaches the client only when it asked for it, as on chat completions. Billed by the
usage the upstream reports (``prompt_tokens``, ``completion_tokens``); a stream cut short
before its usage bills the local estimate of the prompt and what passed. No other channel
type has the endpoint: its models answer 404 there.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass

import orjson

from gateway.config import Channel
from gateway.edge.asgi import parse_json, read_body
from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.kinds.base import JSON_TYPE, Incoming, Reply, ReplyHeaders
from gateway.kinds.chat import KEEPALIVES, MAX_CHOICES, upstream_json
from gateway.kinds.media import NO_CHANNEL, OPENAI_TYPES, body_model, json_object
from gateway.kinds.wire import chat_target, openai_call, openai_errors
from gateway.policy.billing import MAX_TOKENS, Metered, billable_tokens, usage_classes
from gateway.policy.tokens import CHARS_PER_TOKEN
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.protocols.openai.passthrough import OpenAIPassthrough
from gateway.protocols.openai.request import headers, output_limit, usage_wanted, with_usage
from gateway.types import JSON

PATH = "/completions"


def prompt_chars(prompt: JSON) -> int:
    """Characters of a ``prompt`` (a string, strings, or token arrays: a token each)."""
    if isinstance(prompt, str):
        return len(prompt)
    chars = 0
    for item in prompt if isinstance(prompt, list) else ():
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, int):
            chars += CHARS_PER_TOKEN
        elif isinstance(item, list):
            chars += CHARS_PER_TOKEN * len(item)
    return chars


def check(payload: dict[str, JSON]) -> None:
    """The fields the gateway reads or bills by, checked; the rest is the upstream's."""
    prompt = payload.get("prompt")
    if prompt is None or not isinstance(prompt, str | list):
        raise InvalidRequestError("'prompt' is required: a string or a list")
    REQUEST.opt_text(payload.get("suffix"), "suffix")
    REQUEST.opt_bool(payload.get("stream"), "stream")
    REQUEST.opt_integer(payload.get("max_tokens"), "max_tokens")
    options = REQUEST.opt_obj(payload.get("stream_options"), "stream_options")
    if options is not None:
        REQUEST.opt_bool(options.get("include_usage"), "stream_options", "include_usage")


def most_output(payload: dict[str, JSON]) -> int:
    """The most output tokens a request can have generated: ``max_tokens`` times the
    completions generated (``n``, or ``best_of``, which the upstream generates and bills,
    when more); 0 when it sets no maximum."""
    limit = billable_tokens(payload.get("max_tokens"))
    choices = 1
    for name in ("n", "best_of"):
        value = payload.get(name)
        if type(value) is int and 1 <= value <= MAX_CHOICES:
            choices = max(choices, value)
    return limit * choices


@dataclass(slots=True)
class CompletionJob:
    route: RouteMatch
    payload: dict[str, JSON] | None
    estimate: int  # the prompt's tokens, estimated locally (prompt and suffix)
    most: int = 0  # the most output it can have generated (``most_output``); 0: no maximum

    def release(self) -> None:
        self.payload = None

    def expected(self, default_output: int) -> Metered:
        return Metered(prompt_tokens=self.estimate, completion_tokens=self.most or default_output)

    def output_ceiling(self) -> int | None:
        return self.most or None

    def bounded(self, used: Metered) -> Metered:
        """``used``, its output no more than the request's maximum (``policy.spend``)."""
        if self.most and used.completion_tokens > self.most:
            used.completion_tokens = self.most
        return used.classified()


class CompletionsPassthrough(OpenAIPassthrough):
    """A completions stream: chat completions' pass-through, counting ``text`` deltas."""

    __slots__ = ()
    TEXT_MARKS = (b'"text":"', b'"text": "')


class CompletionExchange:
    __slots__ = ("call", "upload", "replayable", "keepalive", "_job", "_ctx", "_errors", "_target")

    def __init__(
        self, job: CompletionJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> None:
        assert job.payload is not None
        body = job.payload if last else dict(job.payload)
        body["model"] = target.model
        output_limit(body, target)
        if target.stream and not job.route.include_usage:
            body["stream_options"] = with_usage(body.get("stream_options"))
        call = UpstreamCall(target.base_url + PATH, headers(target), orjson.dumps(body))
        address = openai_call(channel, target)
        self.call: UpstreamCall | None = call if address is None else address(call)
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self.keepalive = KEEPALIVES[("openai", True)]
        self._job = job
        self._ctx = ctx
        self._errors = openai_errors(channel)
        self._target = target

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._errors(status, raw)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        payload = upstream_json(raw)
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise UpstreamError("the upstream sent a reply that is not a completion")
        if "model" in payload:
            payload["model"] = self._ctx.model
        used = usage_classes(payload.get("usage"))
        if "usage" not in payload or not isinstance(payload.get("usage"), dict):
            used.prompt_tokens = self._job.estimate
        return Reply(orjson.dumps(payload), JSON_TYPE, self._job.bounded(used))

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        return CompletionsPassthrough(self._ctx, self._target)

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        used = usage_classes(stream.usage)
        if not isinstance(stream.usage, dict) or "prompt_tokens" not in stream.usage:
            used.prompt_tokens = self._job.estimate
        if not complete:
            used.completion_tokens = max(used.completion_tokens, min(stream.generated, MAX_TOKENS))
        return self._job.bounded(used)


class CompletionsKind:
    name = "completions"
    capability = "chat"
    billed = True

    def channel_types(self, protocol: str) -> frozenset[str]:
        return OPENAI_TYPES if protocol == "openai" else NO_CHANNEL

    async def read(self, incoming: Incoming) -> CompletionJob:
        raw = await read_body(
            incoming.receive,
            incoming.limits.max_request_bytes,
            incoming.headers.get(b"content-length"),
            incoming.reading,
        )
        return self.job(parse_json(raw))

    def job(self, payload: JSON) -> CompletionJob:
        """The request read from its parsed body (pure: what ``read`` does past the bytes)."""
        body = json_object(payload)
        model = body_model(body)
        check(body)
        stream = body.get("stream") is True
        route = RouteMatch(
            protocol="openai",
            capability=self.name,
            model=model,
            stream=stream,
            include_usage=stream and usage_wanted(body),
        )
        chars = prompt_chars(body["prompt"]) + len(body.get("suffix") or "")
        return CompletionJob(route, body, -(-chars // CHARS_PER_TOKEN), most_output(body))

    def exchange(
        self, job: CompletionJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> CompletionExchange:
        return CompletionExchange(job, channel, chat_target(channel, target), ctx, last)


COMPLETIONS = CompletionsKind()
