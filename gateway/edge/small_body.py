"""Small request bodies outside the relay (the admin API, the console's sign-in), read
bounded in size and in time: a client cannot hold a task with a huge or dripping body.

``read_small_body`` answers 413 past ``limit`` bytes (from the Content-Length before reading,
else as soon as the count passes it) and 408 when the body takes longer than ``timeout``
seconds plus one for every ``BODY_MIN_RATE`` bytes it sent, as the client paths' bodies do
(``asgi.BodyDeadlines``; 0: no limit).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from gateway.edge.asgi import BODY_MIN_RATE, too_slow
from gateway.errors import PayloadTooLargeError


async def read_small_body(request: Request, limit: int, timeout: float) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body: at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout_at(started + timeout if timeout > 0 else None) as deadline:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(f"request body: at most {limit} bytes")
                chunks.append(chunk)
                if timeout > 0:
                    deadline.reschedule(started + timeout + size / BODY_MIN_RATE)
    except TimeoutError:
        raise too_slow() from None
    return b"".join(chunks)
