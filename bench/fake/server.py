"""The fake upstream's HTTP side: one aiohttp app answering the providers' paths.

Per request: find the route, check the provider's auth, read and record the body, take the
next queued ``Reply`` (else the body's ``[[fake ...]]`` directive, else the demo reply), wait
``first_ms``, then answer in the provider's format. Stream events are written one
``await resp.write`` each, so pacing is real and a slow reader holds the writer back.

``disconnects`` counts requests whose client went away before the answer was complete (a
stream cut short, or a client that gave up on a hanging or slow request); a connection the fake
closes itself (``drop_after``) is not counted. Nothing is logged per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from bench.fake import (
    anthropic,
    aws_auth,
    azure,
    bedrock,
    clouds,
    completions,
    gemini,
    google_auth,
    media,
    openai,
    responses,
    vertex,
)
from bench.fake.incoming import Incoming, RequestShapeError
from bench.fake.plan import CONTENT, HEAD, TAIL, Defaults, Plan, make_plan
from bench.fake.prompt_cache import PromptCache, with_cache
from bench.fake.reply import DirectiveError, Reply, find_directive
from bench.fake.routes import (
    CHAT_KINDS,
    TOKEN_PATH,
    UPLOADS,
    Route,
    bad_json_message,
    bearer,
    directive_text,
    incoming_for,
    multipart,
    route,
)

JSON_TYPE = "application/json"
FORMATS = {"responses": responses, "completions": completions}  # OpenAI's other text APIs
AUDIO_PIECE = 8192
DEMO_TRANSCRIPT = "This is the demo transcription."


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    headers: CIMultiDict[str]  # case-insensitive
    body: bytes
    json: Any  # the decoded body, or None when it is not JSON
    form: Mapping[str, str]  # multipart text fields


class FakeUpstream:
    """A scripted upstream; ``async with FakeUpstream() as fake:`` serves on an ephemeral port.

    ``fake.url`` is the root (OpenAI channels append ``/v1``); ``fake.queue(Reply(...))`` scripts
    the next requests; ``fake.requests`` records what arrived and ``fake.streamed`` the bytes of
    each stream written, in the order they ended (``record=False`` for long runs);
    ``fake.require_key`` may be changed at any time (None: any non-empty key);
    ``fake.aws_credentials`` (access key -> secret; ``aws_auth.CREDENTIALS`` unless given)
    are the keys whose SigV4 signatures the Bedrock paths accept; ``fake.azure_keys``
    (``azure.AZURE_KEY`` unless given) the ``api-key`` values the Azure paths accept;
    ``fake.service_account()`` is the key file of a service account the token endpoint
    (``/token``) knows, ``fake.google`` the issuer of the tokens the Vertex paths accept;
    ``fake.disconnects``, ``await fake.wait_disconnect()`` and ``fake.open_streams`` observe
    clients that leave; ``fake.prompt_cache`` (``prompt_cache=False``: None) is the providers'
    prompt caches its usage reports (``bench.fake.prompt_cache``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        require_key: str | None = None,
        defaults: Defaults | None = None,
        record: bool = True,
        aws_credentials: Mapping[str, str] | None = None,
        azure_keys: Iterable[str] | None = None,
        prompt_cache: bool = True,
    ) -> None:
        self.host = host
        self.aws_credentials = dict(aws_credentials or aws_auth.CREDENTIALS)
        self.azure_keys = frozenset(azure_keys or (azure.AZURE_KEY,))
        self.google = google_auth.TokenIssuer()
        self.port = port
        self.require_key = require_key
        self.defaults = defaults or Defaults()
        self.record = record
        self.prompt_cache = PromptCache() if prompt_cache else None
        self.requests: list[RecordedRequest] = []
        self.streamed: list[bytes] = []
        self.disconnects = 0
        self.open_streams = 0
        self._replies: deque[Reply] = deque()
        self._seen_disconnects = 0
        self._disconnect_event = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dropped: set[int] = set()  # id() of requests whose connection the fake closed
        self._closing = False
        self._counter = 0
        self._runner: web.AppRunner | None = None
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def service_account(self) -> dict[str, str]:
        """The key file's JSON of a service account the token endpoint knows (the process's
        test account, its key generated on first use), ``token_uri`` this fake's ``/token``."""
        account = google_auth.default_account()
        self.google.add(account)
        return account.info(self.url + TOKEN_PATH)

    def queue(self, *replies: Reply) -> None:
        """Replies for the next requests, first in first out, on any endpoint."""
        self._replies.extend(replies)

    async def wait_disconnect(self, timeout: float = 5.0) -> bool:
        """True once per client disconnect, in order of arrival; False if none came in time."""

        async def wait() -> None:
            while self.disconnects <= self._seen_disconnects:
                self._disconnect_event.clear()
                await self._disconnect_event.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            return False
        self._seen_disconnects += 1
        return True

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- request handling ---------------------------------------------------------------

    def _disconnected(self) -> None:
        self.disconnects += 1
        self._disconnect_event.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            return await self._serve(request)
        except asyncio.CancelledError:
            if not self._closing and id(request) not in self._dropped:
                self._disconnected()
            raise
        finally:
            self._dropped.discard(id(request))
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith("/files/"):
            return web.Response(body=media.PNG, content_type="image/png")
        where = route(request.method, request.path, request.headers)
        if where.kind is None:
            message = f"Invalid URL ({request.method} {request.path})"
            return self._error(where.protocol, 404, None, message, cloud=where.cloud)
        raw = await request.read() if request.can_read_body else b""
        payload: Any = None
        form: dict[str, str] = {}
        files: dict[str, bytes] = {}
        if where.kind in UPLOADS:
            form, files = multipart(request.headers.get("Content-Type", ""), raw)
        elif raw:
            try:
                payload = orjson.loads(raw)
            except orjson.JSONDecodeError:
                payload = None
        if self.record:
            self.requests.append(
                RecordedRequest(
                    request.method,
                    request.path,
                    dict(request.query),
                    CIMultiDict(request.headers),
                    raw,
                    payload,
                    form,
                )
            )
        if where.cloud == "google":
            status, granted = self.google.grant(clouds.form(raw), self.url + TOKEN_PATH)
            return web.json_response(granted, status=status)
        rejected = self._check_auth(where, request, raw)
        if rejected is not None:
            return rejected
        if request.method == "POST" and where.kind not in UPLOADS:
            if not isinstance(payload, dict):
                message = bad_json_message(where.protocol)
                return self._error(where.protocol, 400, None, message, cloud=where.cloud)
        body: dict[str, Any] = payload if isinstance(payload, dict) else {}
        try:
            incoming = incoming_for(where, body)
            reply, incoming = self._next_reply(where, body, form, incoming)
        except RequestShapeError as exc:
            return self._error(
                where.protocol, 400, None, str(exc), param=exc.param, cloud=where.cloud
            )
        except DirectiveError as exc:
            return self._error(where.protocol, 400, None, str(exc), cloud=where.cloud)
        first_ms = reply.first_ms if reply.first_ms is not None else self.defaults.first_ms
        if first_ms > 0:
            await asyncio.sleep(first_ms / 1000)
        if reply.hang:
            await asyncio.Event().wait()
        if reply.status >= 400:
            return self._error(
                where.protocol,
                reply.status,
                reply.error_type,
                reply.error_message,
                retry_after=reply.retry_after,
                headers=reply.headers,
                cloud=where.cloud,
            )
        return await self._answer(request, where, body, form, files, reply, incoming)

    def _next_reply(
        self, where: Route, body: dict[str, Any], form: dict[str, str], incoming: Incoming | None
    ) -> tuple[Reply, Incoming | None]:
        """The queued reply, else the directive's, else the demo; and the request seen without
        its directive (what ``echo`` repeats)."""
        if incoming is not None:
            text = incoming.last_user_text
            default_tool = incoming.first_tool
        else:
            text = directive_text(where, body, form)
            default_tool = None
        queued = self._replies.popleft() if self._replies else None
        try:
            found = find_directive(text, default_tool) if text else None
        except DirectiveError:
            if queued is None:
                raise
            found = None
        if found is not None and incoming is not None:
            incoming = dataclasses.replace(incoming, last_user_text=found.rest)
        if queued is not None:
            return queued, incoming
        return (found.reply if found is not None else Reply()), incoming

    def _check_auth(self, where: Route, request: web.Request, raw: bytes) -> web.Response | None:
        want = self.require_key
        protocol = where.protocol
        if where.cloud:
            refused = clouds.refusal(where.cloud, request, self.google, self.azure_keys)
            if refused is None:
                return None
            status, payload = refused
            return web.Response(status=status, body=orjson.dumps(payload), content_type=JSON_TYPE)
        if protocol == "bedrock":
            why = aws_auth.verify(
                request.method, request.raw_path, request.headers, raw, self.aws_credentials
            )
            if why is not None:
                return self._error("bedrock", why.status, why.error_type, why.message)
        elif protocol == "openai":
            key = bearer(request)
            if not key:
                return self._error("openai", 401, None, openai.MISSING_KEY, code="")
            if want is not None and key != want:
                shown = key[:3] + "*" * 4 + key[-2:] if len(key) > 6 else "*" * len(key)
                message = f"Incorrect API key provided: {shown}."
                return self._error("openai", 401, None, message, code="invalid_api_key")
        elif protocol == "anthropic":
            # x-api-key, or Bearer (what recent versions of the official SDK send)
            key = request.headers.get("x-api-key", "") or bearer(request)
            if not key:
                return self._error("anthropic", 401, None, "x-api-key header is required")
            if want is not None and key != want:
                return self._error("anthropic", 401, None, "invalid x-api-key")
            if not request.headers.get("anthropic-version"):
                message = "anthropic-version: header is required"
                return self._error("anthropic", 400, None, message)
        else:
            key = request.headers.get("x-goog-api-key") or request.query.get("key", "")
            if not key:
                return self._error("gemini", 403, None, gemini.MISSING_KEY)
            if want is not None and key != want:
                return self._error("gemini", 400, None, gemini.BAD_KEY, reason="API_KEY_INVALID")
        return None

    def _error(
        self,
        protocol: str,
        status: int,
        error_type: str | None,
        message: str | None,
        *,
        retry_after: int | None = None,
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
        reason: str | None = None,
        cloud: str = "",
    ) -> web.Response:
        out: dict[str, str] = {}
        wait = retry_after if retry_after is not None else 1
        if cloud == "azure":
            payload = azure.error_payload(status, error_type, message)
        elif protocol == "openai":
            payload = openai.error_payload(status, error_type, message, code or None, param)
            if code == "":
                payload["error"]["code"] = None
        elif protocol == "anthropic":
            payload = anthropic.error_payload(
                status, error_type, message, f"req_{self._request_id()}"
            )
        elif protocol == "bedrock":
            error_type = bedrock.error_type(status, error_type)
            payload = bedrock.error_payload(error_type, message)
            out.update(bedrock.error_headers(error_type))
            out["x-amzn-RequestId"] = self._request_id()
        else:
            retry = wait if status == 429 else None
            payload = gemini.error_payload(
                status, error_type, message, reason=reason, retry_after=retry
            )
        if status == 429 and protocol not in ("gemini", "bedrock"):
            out["Retry-After"] = str(wait)
        if headers:
            out.update(headers)
        return web.Response(
            status=status, body=orjson.dumps(payload), content_type=JSON_TYPE, headers=out
        )

    def _request_id(self) -> str:
        self._counter += 1
        return f"fake{self._counter:012x}"

    # ---- answers ----------------------------------------------------------------------------

    async def _answer(
        self,
        request: web.Request,
        where: Route,
        body: dict[str, Any],
        form: dict[str, str],
        files: dict[str, bytes],
        reply: Reply,
        incoming: Incoming | None,
    ) -> web.StreamResponse:
        kind = where.kind
        headers = dict(reply.headers)
        if incoming is not None and kind in CHAT_KINDS:
            reply = with_cache(self.prompt_cache, request, where, body, reply, incoming)
            if where.protocol == "bedrock":
                return await self._bedrock(request, where, body, reply, incoming, headers)
            if kind in ("streamGenerateContent", "streamRawPredict") or (
                kind != "generateContent" and body.get("stream")
            ):
                return await self._chat_stream(request, where, body, reply, incoming)
            return self._json(self._chat_body(where, body, reply, incoming), headers)
        if incoming is not None and kind in ("count_tokens", "countTokens"):
            count = incoming.prompt_tokens
            if where.protocol == "anthropic":
                return self._json(orjson.dumps({"input_tokens": count}), headers)
            details = [{"modality": "TEXT", "tokenCount": count}]
            out = {"totalTokens": count, "promptTokensDetails": details}
            return self._json(orjson.dumps(out), headers)
        if kind == "models":
            if where.protocol == "openai":
                return self._json(media.openai_models(), headers)
            if where.protocol == "anthropic":
                return self._json(media.anthropic_models(), headers)
            return self._json(media.gemini_models(), headers)
        if kind == "embeddings":
            return self._json(media.openai_embeddings(body), headers)
        if kind == vertex.PREDICT:
            return self._json(vertex.predict_reply(body), headers)
        if kind == "embedContent":
            out = {"embedding": media.gemini_embedding(body)}
            return self._json(orjson.dumps(out), headers)
        if kind == "batchEmbedContents":
            requests = body.get("requests")
            items = requests if isinstance(requests, list) else []
            out = {"embeddings": [media.gemini_embedding(r) for r in items if isinstance(r, dict)]}
            return self._json(orjson.dumps(out), headers)
        if kind == "images":
            base = f"{request.scheme}://{request.host}"
            return self._json(media.images(body, base, int(time.time())), headers)
        if kind == "rerank":
            return self._json(media.rerank(body, self._request_id()), headers)
        if kind in UPLOADS:
            audio = files.get("file", b"")
            text = reply.text if reply.text is not None else DEMO_TRANSCRIPT
            seconds = media.audio_seconds(audio)
            raw, content_type = media.transcription(
                text, seconds, form.get("response_format", "json")
            )
            return web.Response(body=raw, headers={"Content-Type": content_type, **headers})
        # speech: binary audio, streamed in pieces
        spoken = body.get("input")
        audio, content_type = media.speech(
            spoken if isinstance(spoken, str) else "", str(body.get("response_format") or "mp3")
        )
        pieces = [audio[i : i + AUDIO_PIECE] for i in range(0, len(audio), AUDIO_PIECE)]
        events = [(CONTENT, piece) for piece in pieces]
        return await self._stream(request, events, content_type, None, reply)

    def _json(self, raw: bytes, headers: dict[str, str]) -> web.Response:
        return web.Response(body=raw, content_type=JSON_TYPE, headers=headers or None)

    def _plan_for(
        self, where: Route, body: dict[str, Any], reply: Reply, incoming: Incoming
    ) -> Plan:
        model = where.model or body.get("model")  # a path's (Gemini, Bedrock, the clouds')
        model = str(model or "")
        return make_plan(
            reply, incoming, self.defaults, model or "", self._request_id(), int(time.time())
        )

    def _chat_body(
        self, where: Route, body: dict[str, Any], reply: Reply, incoming: Incoming
    ) -> bytes:
        plan = self._plan_for(where, body, reply, incoming)
        if where.kind in FORMATS:
            return FORMATS[where.kind].render(plan, body)
        if where.protocol == "openai":
            raw = openai.render(plan)
            return azure.chat_reply(raw) if where.cloud == "azure" else raw
        if where.protocol == "anthropic":
            return anthropic.render(plan)
        raw = gemini.render(plan)
        return vertex.gemini_reply(raw) if where.cloud == "vertex" else raw

    async def _chat_stream(
        self,
        request: web.Request,
        where: Route,
        body: dict[str, Any],
        reply: Reply,
        incoming: Incoming,
    ) -> web.StreamResponse:
        plan = self._plan_for(where, body, reply, incoming)
        if where.kind in FORMATS:
            api = FORMATS[where.kind]
            events = api.stream(plan, body)
            return await self._stream(request, events, api.SSE_TYPE, api.stream_error, reply)
        if where.protocol == "openai":
            options = body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            events = openai.stream(plan, usage)
            if where.cloud == "azure":
                events = azure.chat_events(events)
            return await self._stream(request, events, openai.SSE_TYPE, openai.stream_error, reply)
        if where.protocol == "anthropic":
            events = anthropic.stream(plan)
            return await self._stream(
                request, events, anthropic.SSE_TYPE, anthropic.stream_error, reply
            )
        sse = request.query.get("alt") == "sse"
        events = gemini.stream(plan, sse)
        if where.cloud == "vertex":
            events = vertex.gemini_events(events, sse)

        def error(error_type: str | None, message: str | None, written: int) -> bytes:
            return gemini.stream_error(error_type, message, written, sse)

        content_type = gemini.SSE_TYPE if sse else gemini.JSON_TYPE
        return await self._stream(request, events, content_type, error, reply)

    async def _bedrock(
        self,
        request: web.Request,
        where: Route,
        body: dict[str, Any],
        reply: Reply,
        incoming: Incoming,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        plan = self._plan_for(where, body, reply, incoming)
        if where.kind == "converse":
            return self._json(bedrock.converse_render(plan), headers)
        if where.kind == "invoke":
            return self._json(anthropic.render(plan), {**bedrock.invoke_headers(plan), **headers})
        events = (
            bedrock.converse_stream(plan)
            if where.kind == "converse-stream"
            else bedrock.invoke_stream(plan)
        )
        return await self._stream(request, events, bedrock.STREAM_TYPE, bedrock.stream_error, reply)

    async def _stream(
        self,
        request: web.Request,
        events: list[tuple[int, bytes]],
        content_type: str,
        error: Callable[[str | None, str | None, int], bytes] | None,
        reply: Reply,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": content_type, "Cache-Control": "no-cache", **reply.headers}
        )
        delay = (reply.delay_ms if reply.delay_ms is not None else self.defaults.delay_ms) / 1000
        limit = reply.drop_after if reply.drop_after is not None else reply.error_after
        self.open_streams += 1
        sent: list[bytes] = []
        try:
            await resp.prepare(request)
            written = 0
            content = 0
            for kind, data in events:
                if kind != HEAD:
                    if limit is not None and (content >= limit or kind == TAIL):
                        sent.append(await self._cut(request, resp, reply, error, written))
                        return resp
                    if kind != TAIL:
                        if content and delay > 0:
                            await asyncio.sleep(delay)
                        content += 1
                await resp.write(data)
                sent.append(data)
                written += 1
            if limit is not None:
                sent.append(await self._cut(request, resp, reply, error, written))
                return resp
            await resp.write_eof()
        except ConnectionResetError:
            if id(request) not in self._dropped:
                self._disconnected()
        finally:
            self.open_streams -= 1
            if self.record:
                self.streamed.append(b"".join(sent))
        return resp

    async def _cut(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        reply: Reply,
        error: Callable[[str | None, str | None, int], bytes] | None,
        written: int,
    ) -> bytes:
        """Drop the connection, or end the stream with the error event; what was written."""
        if reply.drop_after is not None or error is None:
            self._dropped.add(id(request))
            transport = request.transport
            if transport is not None:
                transport.close()
            return b""
        data = error(reply.error_type, reply.error_message, written)
        await resp.write(data)
        await resp.write_eof()
        return data
