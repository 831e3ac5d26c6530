"""Served gateways for end-to-end tests: the fake upstream and the gateway on real sockets.

``fake`` is the bundled fake upstream on an ephemeral port; ``gateway`` is the app served by
the suite's server (``GATEWAY_TEST_SERVER``, uvicorn unless set) on an ephemeral port in
the test's event loop, configured by ``make_config`` against
that upstream and the store of ``store_url`` (so every end-to-end test runs on both stores).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from gateway.app import GatewayApp, Services, create_app
from gateway.config import Settings, parse_settings
from tests.plugins.embedded import listening

if TYPE_CHECKING:
    from bench.fake_upstream import FakeUpstream

ADMIN_TOKEN = "admin-test-token"
KEYS = {
    "alice": "sk-alice-0000000000000001",
    "vip": "sk-vip-00000000000000002",
    "disabled": "sk-disabled-000000000003",
    "expired": "sk-expired-0000000000004",
    "broke": "sk-broke-000000000000005",
}
PRICE = {"input": 1.0, "output": 2.0}  # micro-units per token: easy sums
# each configured gateway journals into a directory of its own, removed when the tests end: a
# record one test's gateway left must never be adopted into another test's store
JOURNALS = tempfile.TemporaryDirectory(prefix="gw-test-journals-")


def make_config(upstream_url: str, store_url: str, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "store": store_url,
        "journal": tempfile.mkdtemp(dir=JOURNALS.name),
        "admin_token": ADMIN_TOKEN,
        "groups": ["default", "vip"],
        "models": [
            {"name": "chat-small", "capabilities": ["chat", "vision", "tools"], "price": PRICE},
            {"name": "claude-small", "capabilities": ["chat", "vision", "tools"], "price": PRICE},
            {"name": "gemini-small", "capabilities": ["chat", "vision", "tools"], "price": PRICE},
            {"name": "vip-model", "capabilities": ["chat"], "price": PRICE},
        ],
        "channels": [
            {
                "name": "oa",
                "type": "openai",
                "base_url": upstream_url + "/v1",
                "api_key": "upstream-key",
                "groups": ["default", "vip"],
                "models": ["chat-small"],
                "model_map": {"chat-small": "up-small"},
            },
            {
                "name": "an",
                "type": "anthropic",
                "base_url": upstream_url,
                "api_key": "upstream-key",
                "groups": ["default", "vip"],
                "models": ["claude-small"],
            },
            {
                "name": "gm",
                "type": "gemini",
                "base_url": upstream_url,
                "api_key": "upstream-key",
                "groups": ["default", "vip"],
                "models": ["gemini-small"],
            },
            {
                "name": "vip-only",
                "type": "openai",
                "base_url": upstream_url + "/v1",
                "api_key": "upstream-key",
                "groups": ["vip"],
                "models": ["vip-model"],
            },
        ],
        "accounts": [{"id": "alice", "balance": 10.0}, {"id": "broke", "balance": 0}],
        "keys": [
            {"id": "k-alice", "key": KEYS["alice"], "account": "alice", "group": "default"},
            {"id": "k-vip", "key": KEYS["vip"], "account": "alice", "group": "vip"},
            {
                "id": "k-disabled",
                "key": KEYS["disabled"],
                "account": "alice",
                "group": "default",
                "status": "disabled",
            },
            {
                "id": "k-expired",
                "key": KEYS["expired"],
                "account": "alice",
                "group": "default",
                "expires_at": "2020-01-01T00:00:00Z",
            },
            {"id": "k-broke", "key": KEYS["broke"], "account": "broke", "group": "default"},
        ],
    }
    cfg.update(overrides)
    return cfg


@dataclass
class ServedGateway:
    url: str
    app: GatewayApp
    settings: Settings

    @property
    def state(self) -> Services:
        return self.app.state.gateway  # type: ignore[no-any-return]

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextlib.asynccontextmanager
async def serve_app(settings: Settings) -> AsyncIterator[ServedGateway]:
    """Serve a gateway on an ephemeral port until the block ends, by the server the suite
    runs on (``GATEWAY_TEST_SERVER``, ``tests.plugins.embedded``)."""
    app = create_app(settings)
    async with listening(app, settings) as port:
        yield ServedGateway(url=f"http://127.0.0.1:{port}", app=app, settings=settings)


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    from bench.fake_upstream import FakeUpstream

    async with FakeUpstream() as f:
        yield f


@pytest.fixture
def gateway_factory(
    fake: FakeUpstream, store_url: str
) -> Callable[..., contextlib.AbstractAsyncContextManager[ServedGateway]]:
    """``async with gateway_factory(**config_overrides) as gw:`` for tests that change config."""

    def factory(**overrides: Any) -> contextlib.AbstractAsyncContextManager[ServedGateway]:
        return serve_app(parse_settings(make_config(fake.url, store_url, **overrides)))

    return factory


@pytest.fixture
async def gateway(
    gateway_factory: Callable[..., contextlib.AbstractAsyncContextManager[ServedGateway]],
) -> AsyncIterator[ServedGateway]:
    async with gateway_factory() as gw:
        yield gw
