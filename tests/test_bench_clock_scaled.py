"""bench.clock_scaled: each clock-driven interval of the gateway that it knows of is stretched."""

from __future__ import annotations

import pytest

from bench import clock_scaled
from gateway.edge import asgi
from gateway.observe import access_log, metrics
from gateway.policy import health
from gateway.relay import pipeline as relay
from gateway.server import gc_tuning
from gateway.store import cache, writer

INTERVALS = [
    (writer, "LINGER"),
    (asgi, "WATCH_TICK"),
    (relay, "STREAM_WATCH_DELAY"),
    (relay, "REPLY_WATCH_DELAY"),
    (gc_tuning, "COLLECT_EVERY"),
    (gc_tuning, "FULL_EVERY"),
    (cache, "DEFAULT_INTERVAL"),
    (health, "SHARE_INTERVAL"),
    (writer, "SYNC_INTERVAL"),
    (access_log, "FLUSH_EVERY"),
    (metrics, "SNAPSHOT_EVERY"),
]


def test_every_interval_is_stretched_by_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {(m.__name__, name): getattr(m, name) for m, name in INTERVALS}
    for module, name in INTERVALS:  # restored after the test
        monkeypatch.setattr(module, name, getattr(module, name))

    clock_scaled.stretch(40)

    for module, name in INTERVALS:
        assert getattr(module, name) == pytest.approx(before[(module.__name__, name)] * 40)
    reloading = cache.Cache(store=None)  # type: ignore[arg-type]
    assert reloading._interval == pytest.approx(before[(cache.__name__, "DEFAULT_INTERVAL")] * 40)
