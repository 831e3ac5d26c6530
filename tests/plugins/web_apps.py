"""A test's own aiohttp app (an upstream of a route or a few, answering as the test needs)
served on 127.0.0.1 at an ephemeral port for the length of a block."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

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


def self_signed(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1, made in ``folder``: a server's context for
    ``served`` and a client's that trusts it (and nothing else)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))
