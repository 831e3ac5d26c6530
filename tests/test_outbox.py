"""The sends of streams whose reads are direct, made at the end of the event loop's turn
(``relay.stream.Outbox``, ``Relaying.flush``): a turn's reads of a stream go out in one send,
in order, stream after stream; a send that fails reaches the stream's task, which raises it,
and the other streams of the turn are sent all the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.relay.stream import Relaying


class Direct:
    """``DirectReads`` as ``Relaying`` uses it, without a connection."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None

    def relay(self, on_read: Any) -> asyncio.Future[None]:
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def stop(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def wait(self, done: asyncio.Future[None]) -> None:
        await done


class Passing:
    """A stream conversion that passes each read on as it came."""

    usage = None
    generated = 0

    def feed(self, raw: bytes) -> bytes:
        return raw


def relaying(send: Any) -> tuple[Relaying, asyncio.Future[None]]:
    r = Relaying(Direct(), Passing(), send, None, None)  # type: ignore[arg-type]
    done = r.start()
    assert done is not None
    return r, done


async def test_a_turn_s_reads_go_out_in_one_send_each_stream_in_turn() -> None:
    sent: list[tuple[str, bytes]] = []

    def sender(name: str) -> Any:
        async def send(message: dict[str, Any]) -> None:
            sent.append((name, message["body"]))

        return send

    a, _ = relaying(sender("a"))
    b, _ = relaying(sender("b"))
    assert a.on_read(b"a1 ") and b.on_read(b"b1 ") and a.on_read(b"a2 ")
    assert sent == []  # nothing before the turn ends
    await asyncio.sleep(0)
    assert sent == [("a", b"a1 a2 "), ("b", b"b1 ")]
    assert a.on_read(b"a3 ")
    await asyncio.sleep(0)
    assert sent[-1] == ("a", b"a3 ")


async def test_a_send_that_fails_is_raised_by_its_stream_and_the_others_go_out() -> None:
    sent: list[bytes] = []

    async def failing(message: dict[str, Any]) -> None:
        raise OSError("the client is gone")

    async def sending(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    bad, bad_done = relaying(failing)
    good, _ = relaying(sending)
    assert bad.on_read(b"lost") and good.on_read(b"kept")
    with pytest.raises(OSError, match="the client is gone"):
        await asyncio.wait_for(bad.stopped(bad_done), 5)
    assert sent == [b"kept"]
