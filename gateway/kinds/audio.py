"""The transcription kinds: ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``
(speech to English text), a multipart upload relayed to an openai-type channel (openai, or
azure at its deployment's address) as it arrives, never held whole in memory.

The text fields may come before or after the file (the Python SDK sends them first, others
may not): the body is read until the ``model`` field is complete, the bytes read so far are
kept in a spooled temporary file (in memory up to ``SPOOL_MEMORY``, on disk past it), and once
a channel is chosen the upload goes out chunked: those bytes, then the rest as the client
sends it, rewritten on the way (``multipart.MultipartRewriter``) so that ``model`` names the
upstream's model. Bounded by ``limits.max_upload_bytes`` (413: at once when Content-Length
says so, else as soon as the count passes it). Every other field (``response_format``,
``language``, ``prompt``, ``stream``, ...) goes through as the client sent it.

An upload can be sent once: another channel is tried only when the first could not be
reached before any of it went out. Billed by what the upstream reports: tokens
(``usage.input_tokens``/``output_tokens``), or seconds of audio (``usage.seconds``, or a
``verbose_json`` reply's ``duration``) at the ``audio_second`` price, each bounded as
``billing`` bounds them (an implausible count bills nothing); plain-text formats report
neither, and cost the ``request`` price alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import IO

import orjson

from gateway.config import Channel
from gateway.edge.asgi import BodyRead, ClientGone
from gateway.edge.multipart import MultipartRewriter, boundary_of
from gateway.errors import GatewayError, InvalidRequestError, PayloadTooLargeError
from gateway.kinds.base import Incoming, Reply, ReplyHeaders
from gateway.kinds.media import NO_CHANNEL, OPENAI_TYPES, RawStream
from gateway.kinds.wire import openai_call, openai_errors
from gateway.policy.billing import Metered, billable_seconds, billable_tokens
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.types import Receive

SPOOL_MEMORY = 1024 * 1024  # bytes read ahead for the fields kept in memory; past it, on disk
SPOOL_CHUNK = 64 * 1024  # bytes of the spool sent upstream at a time


def header(scope_headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in scope_headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"The upload is larger than {limit} bytes.")


@dataclass(slots=True)
class TranscriptionJob:
    route: RouteMatch
    boundary: bytes
    receive: Receive
    limit: int
    spool: IO[bytes] | None  # the body read so far, while the fields were looked for
    size: int  # bytes of the body read so far
    more: bool  # the client has more of the body to send
    started: bool = field(default=False)  # the upload began going out: it cannot be replayed
    # the client's fault found while the upload went out (it grew past the limit): the upload
    # is cut short and this, not the upstream's answer to the cut body, is the reply
    failure: GatewayError | None = None
    reading: BodyRead | None = None  # the body's deadline, told of each piece that arrives

    def release(self) -> None:
        pass  # the spool is let go as the upload sends it

    def expected(self, default_output: int) -> Metered:
        return Metered()  # the audio's length is the upstream's to tell: the floor is held

    def output_ceiling(self) -> int | None:
        return 0  # billed by what it sends or receives, not by output tokens

    async def upload(self, model: str) -> AsyncIterator[bytes]:
        """The body for the upstream, ``model`` in place of the client's, as it arrives."""
        self.started = True
        rewriter = MultipartRewriter(self.boundary, replace={"model": model})
        spool, self.spool = self.spool, None
        if spool is not None:
            spool.seek(0)
            with spool:
                while piece := spool.read(SPOOL_CHUNK):
                    if out := rewriter.feed(piece):
                        yield out
        # a failure here stops the upload rather than raising into the HTTP client, which
        # would report it as the upstream's; the disconnect watch stops a client that left
        while self.more:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            self.more = message.get("more_body", False)
            self.size += len(body)
            if self.reading is not None:
                self.reading.received = self.size
                if not self.more:
                    self.reading.finish()
            if self.size > self.limit:
                self.failure = too_large(self.limit)
                return
            if body:
                try:
                    out = rewriter.feed(body)
                except InvalidRequestError as err:
                    self.failure = err
                    return
                if out:
                    yield out
        try:
            out = rewriter.close()
        except InvalidRequestError as err:
            self.failure = err
            return
        if out:
            yield out


def transcription_used(reply: object) -> Metered:
    if not isinstance(reply, dict):
        return Metered()
    usage = reply.get("usage")
    if isinstance(usage, dict):
        if usage.get("type") == "duration" or "seconds" in usage:
            seconds = usage.get("seconds")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool):
                return Metered(audio_seconds=billable_seconds(seconds))
        if "input_tokens" in usage or "output_tokens" in usage:
            return Metered(
                prompt_tokens=billable_tokens(usage.get("input_tokens")),
                completion_tokens=billable_tokens(usage.get("output_tokens")),
            )
    duration = reply.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        return Metered(audio_seconds=billable_seconds(duration))
    return Metered()


class TranscriptionExchange:
    __slots__ = ("call", "upload", "keepalive", "_job", "_errors")

    def __init__(
        self, job: TranscriptionJob, path: str, channel: Channel, target: UpstreamTarget
    ) -> None:
        call = UpstreamCall(
            url=target.base_url + path,
            headers={
                "Authorization": f"Bearer {target.api_key}",
                "Content-Type": f"multipart/form-data; boundary={job.boundary.decode()}",
            },
            body=b"",
        )
        address = openai_call(channel, target)
        self.call: UpstreamCall | None = call if address is None else address(call)
        self.upload: AsyncIterable[bytes] | None = job.upload(target.model)
        self.keepalive = b""
        self._job = job
        self._errors = openai_errors(channel)

    @property
    def replayable(self) -> bool:
        return not self._job.started

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._job.failure or self._errors(status, raw)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        if self._job.failure is not None:
            raise self._job.failure
        content_type = headers.get("content-type", "application/json")
        used = Metered()
        if content_type.startswith("application/json"):
            try:
                used = transcription_used(orjson.loads(raw))
            except orjson.JSONDecodeError:
                pass  # passed on as the upstream sent it; nothing to bill beyond the call
        return Reply(raw, content_type.encode("latin-1"), used)

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        if self._job.failure is not None:
            raise self._job.failure
        return RawStream(headers.get("content-type", "text/event-stream"))

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return Metered()


class TranscriptionKind:
    """Speech to text: ``path`` is the endpoint under an openai-type channel's base URL."""

    capability = "audio"
    billed = True

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path

    def channel_types(self, protocol: str) -> frozenset[str]:
        return OPENAI_TYPES if protocol == "openai" else NO_CHANNEL

    async def read(self, incoming: Incoming) -> TranscriptionJob:
        limit = incoming.limits.max_upload_bytes
        declared = incoming.headers.get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise too_large(limit)
            except ValueError:
                raise InvalidRequestError("bad Content-Length") from None
        content_type = header(incoming.scope["headers"], b"content-type")
        boundary = boundary_of(content_type or "")
        fields = MultipartRewriter(boundary)
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # noqa: SIM115
        size, more = 0, True
        try:
            while more and "model" not in fields.fields:
                message = await incoming.receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone()
                body = message.get("body", b"")
                more = message.get("more_body", False)
                size += len(body)
                if incoming.reading is not None:
                    incoming.reading.received = size
                if size > limit:
                    raise too_large(limit)
                spool.write(body)
                fields.feed(body)
            if not more:
                fields.close()
        except BaseException:
            spool.close()
            raise
        model = fields.fields.get("model")
        if not model:
            spool.close()
            raise InvalidRequestError("'model' is required: a form field of the upload")
        route = RouteMatch(
            protocol=incoming.spec.protocol,
            capability=self.name,
            model=model,
            stream=fields.fields.get("stream", "").lower() == "true",
        )
        reading = incoming.reading
        if reading is not None and not more:
            reading.finish()
        return TranscriptionJob(
            route, boundary, incoming.receive, limit, spool, size, more, reading=reading
        )

    def exchange(
        self, job: TranscriptionJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> TranscriptionExchange:
        return TranscriptionExchange(job, self.path, channel, target)


TRANSCRIPTION = TranscriptionKind("audio_transcription", "/audio/transcriptions")
TRANSLATION = TranscriptionKind("audio_translation", "/audio/translations")
