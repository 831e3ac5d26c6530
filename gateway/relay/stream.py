"""The one stream loop: upstream chunks -> a ``RelayStream`` -> ``send``.

One loop in the request's task, no queue, no read-ahead: a slow client blocks ``send``, the
loop stops reading, and aiohttp pauses the upstream socket. The stream's last read goes out
with the end of the response (one send less per stream). The request is settled (billed and
recorded) before the last bytes leave, so a client that reads its balance right after the
stream ends sees the cost; a failure after the stream started is sent inside it, in the
client protocol's form, after what was converted before it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.errors import GatewayError
from gateway.protocols.base import RelayStream
from gateway.types import Send
from gateway.upstream import UpstreamResponse

# a reverse proxy in front (nginx) must not buffer a stream
STREAM_HEADERS = [(b"x-accel-buffering", b"no")]


async def pump(
    resp: UpstreamResponse,
    stream: RelayStream,
    send: Send,
    settle: Callable[[int], Awaitable[None] | None],
) -> GatewayError | None:
    """Relay the upstream's stream to the client through ``stream``; ``settle(status)`` is
    called once, and what it returns awaited, before the last bytes are sent. Returns the
    error that ended the stream early (already sent to the client in its protocol's form),
    or None."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", stream.content_type.encode()), *STREAM_HEADERS],
        }
    )
    out = b""  # converted, not yet sent: the last read's goes out with the end
    try:
        while True:
            raw = await resp.chunk()
            if not raw:
                break
            out += stream.feed(raw)
            if out and not resp.at_eof():
                body, out = out, b""
                await send({"type": "http.response.body", "body": body, "more_body": True})
        out += stream.finish()
    except GatewayError as err:
        durable = settle(err.status)
        if durable is not None:
            await durable
        tail = stream.error(err)
        await send({"type": "http.response.body", "body": out + tail, "more_body": False})
        return err
    durable = settle(200)
    if durable is not None:
        await durable
    await send({"type": "http.response.body", "body": out, "more_body": False})
    return None
