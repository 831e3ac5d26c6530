"""upstream.py in isolation: how connection failures map to gateway errors (aioresponses
raises them; the request's shape, timing and the pool are tested over real sockets against
the fake upstream, since aioresponses cannot build replies for this aiohttp version)."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from aioresponses import aioresponses

from gateway.config import UpstreamSettings
from gateway.errors import GatewayOverloadedError, UpstreamError, UpstreamTimeoutError
from gateway.protocols.base import UpstreamCall
from gateway.upstream import Upstream

URL = "http://upstream.test/v1/chat/completions"
CALL = UpstreamCall(URL, {"Authorization": "Bearer up-key"}, b'{"model":"m"}')


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    u = Upstream(UpstreamSettings())
    await u.start()
    yield u
    await u.stop()


def connector_error(code: int) -> aiohttp.ClientConnectorError:
    key = ConnectionKey("upstream.test", 80, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, OSError(code, "simulated"))


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (connector_error(errno.ECONNREFUSED), UpstreamError),  # the upstream is down
        (connector_error(errno.EMFILE), GatewayOverloadedError),  # we are out of sockets
        (connector_error(errno.EADDRNOTAVAIL), GatewayOverloadedError),
        (TimeoutError(), UpstreamTimeoutError),
        (aiohttp.ServerDisconnectedError(), UpstreamError),
    ],
)
async def test_failures_map_to_gateway_errors(upstream: Upstream, exc, error) -> None:
    with aioresponses() as m:
        m.post(URL, exception=exc)
        with pytest.raises(error) as got:
            await upstream.open(CALL)
    # our own exhaustion is neither retried on another channel nor held against this one
    assert got.value.retryable is (error is not GatewayOverloadedError)
