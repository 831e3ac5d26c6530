"""A test's own aiohttp app (an upstream of a route or a few, answering as the test needs)
served on 127.0.0.1 at an ephemeral port for the length of a block."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def served(app: web.Application, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """``app`` served until the block ends; yields its base URL (``http://127.0.0.1:<port>``,
    ``https`` with ``tls``, the server's context)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    scheme = "https" if tls else "http"
    try:
        yield f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
