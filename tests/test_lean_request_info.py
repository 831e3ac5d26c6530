"""A started upstream response lets go of its request's headers (``upstream.lean_request_info``):
under the mend the upstream still gets every header the gateway sends, the reply arrives whole
with its own headers, and the response no longer holds the request's headers (the upstream's
credentials among them); without the mend, aiohttp's response is as aiohttp made it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.config import UpstreamSettings
from gateway.protocols.base import UpstreamCall
from gateway.server import mends
from gateway.upstream import lean_request_info
from gateway.upstream.pool import Upstream
from tests.plugins.web_apps import served

SENT = {"Authorization": "Bearer up-key", "X-Trace": "t-1"}


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    """An upstream that answers with the headers it got, and rate-limit headers of its own."""

    async def handler(request: web.Request) -> web.Response:
        got = {name: request.headers.get(name, "") for name in SENT}
        headers = {"x-ratelimit-remaining-requests": "7", "x-request-id": "up-1"}
        return web.json_response(got, headers=headers)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with served(app) as url:
        yield url + "/v1/chat/completions"


@pytest.mark.parametrize("mended", [True, False])
async def test_the_response_keeps_its_reply_not_its_request_s_headers(
    monkeypatch: pytest.MonkeyPatch, echo: str, mended: bool
) -> None:
    monkeypatch.setattr(lean_request_info, "_on", False)
    monkeypatch.setattr(mends, "_left_out", set())
    if not mended:  # an aiohttp whose RequestInfo the mend does not know: left out
        monkeypatch.setattr(lean_request_info, "FIELDS", ("url", "method", "headers"))
    upstream = Upstream(UpstreamSettings())
    await upstream.start()
    try:
        assert lean_request_info.LEAN_REQUEST_INFO.in_place() is mended
        resp = await upstream.request(UpstreamCall(echo, dict(SENT), b"{}"))
        assert resp.status == 200
        assert resp.headers["X-Ratelimit-Remaining-Requests"] == "7"
        assert resp.headers.get("content-type") == "application/json; charset=utf-8"
        assert await resp.read() == b'{"Authorization": "Bearer up-key", "X-Trace": "t-1"}'
        info = resp._resp.request_info
        assert (str(info.url), info.method, str(info.real_url)) == (echo, "POST", echo)
        kept = {name: info.headers.get(name) for name in SENT}
        assert kept == (dict.fromkeys(SENT) if mended else SENT)
        resp.close()
    finally:
        await upstream.stop()
