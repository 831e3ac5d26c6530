"""One log line per request (``logging: {access: true, format: json|text}``): time, request id,
key id, model, channel, protocol, endpoint, status, latency, tokens and cost, and the client's
/24 (or /48); never a prompt, a reply, a key or a full address.

In text, the model (the client's own name for it) is written as a JSON string when it holds
a space or anything unprintable, so that no name can split a line or forge one.

The hot path pays one ``orjson.dumps`` (or one f-string) appended to one buffer (a list of
small bytes objects cost more, in allocations, than the encoding); the lines go out in one
``write()`` to standard error about five times a second and when the process stops, not
through ``logging`` (its handler locks and flushes on every record).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import orjson

from gateway.store import MICRO, UsageRecord

FLUSH_EVERY = 0.2  # seconds


class AccessLog:
    __slots__ = ("_json", "_fd", "_buffer")

    def __init__(self, fmt: str = "json", fd: int = 2) -> None:
        self._json = fmt == "json"
        self._fd = fd
        self._buffer = bytearray()

    def write(self, rec: UsageRecord, reply_id: str) -> None:
        if self._json:
            line = orjson.dumps(
                {
                    "time": rec.time,
                    "request_id": rec.request_id,
                    "reply_id": reply_id,
                    "key_id": rec.key_id,
                    "account": rec.account,
                    "model": rec.model,
                    "channel": rec.channel,
                    "protocol": rec.protocol,
                    "endpoint": rec.endpoint,
                    "status": rec.status,
                    "latency_ms": rec.latency_ms,
                    "prompt_tokens": rec.prompt_tokens,
                    "completion_tokens": rec.completion_tokens,
                    "cost": rec.cost / MICRO,
                    "ip_range": rec.ip_range,
                },
                option=orjson.OPT_APPEND_NEWLINE,
            )
        else:
            line = (
                f"{rec.time.isoformat()} {rec.request_id} {rec.status} {rec.protocol} "
                f"{rec.endpoint} model={_token(rec.model)} channel={rec.channel or '-'} "
                f"key={rec.key_id} {rec.latency_ms}ms in={rec.prompt_tokens} "
                f"out={rec.completion_tokens} cost={rec.cost / MICRO:g}\n"
            ).encode()
        self._buffer += line

    def flush(self) -> None:
        if not self._buffer:
            return
        pending, self._buffer = self._buffer, bytearray()
        data = memoryview(pending)
        with contextlib.suppress(OSError):  # a closed stderr is no reason to fail
            while data:
                data = data[os.write(self._fd, data) :]

    async def run(self) -> None:
        """Flush every ``FLUSH_EVERY`` seconds, and once more when cancelled."""
        try:
            while True:
                await asyncio.sleep(FLUSH_EVERY)
                self.flush()
        finally:
            self.flush()


def _token(text: str) -> str:
    """``text`` as it is when it is one printable word, else quoted and escaped (JSON)."""
    if text.isprintable() and " " not in text:
        return text
    return orjson.dumps(text).decode()
