"""The bare relay: the least a Python relay can do, as the yardstick for the gateway.

Raw ASGI; orjson parses the body and rewrites ``model``; one shared aiohttp ClientSession posts
upstream; the reply goes back chunk by chunk. BARE_UPSTREAMS maps model -> upstream base URL.
``/v1/embeddings`` goes to ``{base}/embeddings``, every other path to ``{base}/chat/completions``.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import orjson

UPSTREAMS: dict[str, str] = orjson.loads(os.environ.get("BARE_UPSTREAMS", "{}"))
# the client's path -> the path under the upstream's base URL (chat for any other path)
PATHS = {"/v1/chat/completions": "/chat/completions", "/v1/embeddings": "/embeddings"}
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-upstream-bench"}
session: aiohttp.ClientSession | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global session
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if session is not None:
                await session.close()
            await send({"type": "lifespan.shutdown.complete"})
        return
    if session is None:
        pool = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=pool, timeout=aiohttp.ClientTimeout(None, 5, 60))
    body, more = b"", True
    while more:
        msg = await receive()
        body, more = body + msg.get("body", b""), msg.get("more_body", False)
    payload = orjson.loads(body)
    url = UPSTREAMS[payload["model"]] + PATHS.get(scope["path"], "/chat/completions")
    payload["model"] = "upstream-model"
    async with session.post(url, data=orjson.dumps(payload), headers=HEADERS) as resp:
        ctype = resp.headers.get("content-type", "application/json").encode()
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", ctype)]})  # fmt: skip
        async for chunk in resp.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
