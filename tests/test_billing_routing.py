"""Pure parts of the hot path: prices, client ranges, channel order (table-driven)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.config import Price, parse_settings
from gateway.errors import NotFoundError, UpstreamUnavailableError
from gateway.policy.billing import MAX_TOKENS, ClientAddress, Metered, Rate, ip_range, usage_tokens
from gateway.policy.routing import Catalogue, candidates

ALL = frozenset({"openai", "anthropic", "gemini"})


@pytest.mark.parametrize(
    ("price", "prompt", "completion", "charge"),
    [
        (Price(input=1, output=2), 100, 50, (200, 0)),
        (Price(input=0.5, output=1.5), 1, 9, (14, 0)),  # 0.5 + 13.5
        (Price(input=0.1, output=0.2), 3, 0, (0, 300_000)),  # 0.3 micro-units, kept
        (Price(input=0.25, output=0), 2, 0, (0, 500_000)),
        (Price(input=3, output=15, request=0.001), 1000, 1000, (19_000, 0)),
        (Price(input=0.0375, output=0), 1_000_000, 0, (37_500, 0)),  # no float drift
        (Price(input=0.01), 1, 0, (0, 10_000)),  # never 0 for a non-zero price
        (Price(input=1e-9), 1, 0, (0, 1)),  # below a pico-unit per token: one
    ],
)
def test_cost_is_exact_micro_and_pico_units(price, prompt, completion, charge) -> None:
    used = Metered(prompt_tokens=prompt, completion_tokens=completion)
    got = Rate.from_price(price).charge(used)
    assert (got.micro, got.pico) == charge


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 3}, (12, 3)),
        (None, (0, 0)),
        ({}, (0, 0)),
        ({"prompt_tokens": None, "completion_tokens": "7"}, (0, 0)),
        ({"prompt_tokens": 2.0, "completion_tokens": True}, (2, 0)),  # 2.0 is 2; a bool is not
        ({"prompt_tokens": 7.9, "completion_tokens": 1e300}, (7, 0)),  # cut, as the adapters do
        ({"prompt_tokens": float("nan"), "completion_tokens": float("inf")}, (0, 0)),
        ({"prompt_tokens": -0.5, "completion_tokens": -2.0}, (0, 0)),
        ({"prompt_tokens": -40, "completion_tokens": -1}, (0, 0)),  # would credit the account
        ({"prompt_tokens": MAX_TOKENS, "completion_tokens": MAX_TOKENS + 1}, (MAX_TOKENS, 0)),
        ({"prompt_tokens": 10**19, "completion_tokens": 0}, (0, 0)),  # past SQLite's integers
    ],
)
def test_only_plausible_token_counts_are_billed(usage, tokens) -> None:
    assert usage_tokens(usage) == tokens


@pytest.mark.parametrize(
    ("ip", "expected"),
    [
        ("203.0.113.77", "203.0.113.0/24"),
        ("2001:db8:abcd:12::1", "2001:db8:abcd::/48"),
        ("::ffff:198.51.100.9", "198.51.100.0/24"),
        ("not-an-ip", ""),
        (None, ""),
    ],
)
def test_ip_range(ip, expected) -> None:
    assert ip_range(ip) == expected


@pytest.mark.parametrize(
    ("peer", "xff", "expected"),
    [
        ("127.0.0.1", b"203.0.113.77", "203.0.113.0/24"),  # trusted proxy: believed
        ("127.0.0.1", b"198.51.100.1, 203.0.113.77", "203.0.113.0/24"),  # right-most hop
        ("192.0.2.10", b"203.0.113.77", "192.0.2.0/24"),  # untrusted peer: ignored
        ("127.0.0.1", None, "127.0.0.0/24"),
    ],
)
def test_client_range_trusts_only_configured_proxies(peer, xff, expected) -> None:
    addr = ClientAddress(["127.0.0.1/32"])
    assert addr.range_of((peer, 1234), xff) == expected
    assert addr.range_of((peer, 1234), xff) == expected  # remembered, same answer


def catalogue() -> Catalogue:
    ch = {"type": "openai", "base_url": "http://u/v1", "groups": ["default"], "models": ["m"]}
    return Catalogue(
        parse_settings(
            {
                "groups": ["default", "vip"],
                "models": [
                    {"name": "m", "price": {"input": 1}},
                    {"name": "e", "capabilities": ["embeddings"], "price": {"input": 1}},
                ],
                "channels": [
                    {**ch, "name": "a", "priority": 0, "weight": 3},
                    {**ch, "name": "b", "priority": 0, "weight": 1},
                    {**ch, "name": "c", "priority": 1},
                    {**ch, "name": "d", "priority": 0, "weight": 0},
                    {**ch, "name": "v", "groups": ["vip"], "models": ["e"]},
                ],
            }
        )
    )


def test_priority_first_then_weighted_share() -> None:
    cat, rng = catalogue(), random.Random(7)
    firsts = Counter()
    for _ in range(4000):
        order = [c.name for c in candidates(cat, "default", "m", "chat", ALL, rng)]
        assert order[-1] == "c"  # the lower priority comes after every priority-0 channel
        assert order[-2] == "d"  # weight 0 is a standby within its priority
        firsts[order[0]] += 1
    assert 0.70 < firsts["a"] / 4000 < 0.80  # weight 3 of 4


@pytest.mark.parametrize(
    ("group", "model", "capability", "types"),
    [
        ("default", "nope", "chat", ALL),  # no such model
        ("default", "e", "embeddings", ALL),  # the model lacks the capability
        ("vip", "e", "chat", ALL),  # outside the group
        ("default", "m", "chat", frozenset({"gemini"})),  # no channel of a type that serves it
    ],
)
def test_not_found(group, model, capability, types) -> None:
    with pytest.raises(NotFoundError):
        candidates(catalogue(), group, model, capability, types, random.Random())


def test_cooling_channels_are_skipped_and_all_cooling_is_503() -> None:
    cat = catalogue()
    order = candidates(cat, "default", "m", "chat", ALL, random.Random(), {"a": 10.0}, now=5.0)
    assert "a" not in [c.name for c in order]
    cooling = dict.fromkeys("abcd", 10.0)
    cooling["c"] = 8.0  # the first one back, 3 s from now
    with pytest.raises(UpstreamUnavailableError) as got:
        candidates(cat, "default", "m", "chat", ALL, random.Random(), cooling, now=5.0)
    assert got.value.retry_after == 3.0  # sent as Retry-After
    assert candidates(cat, "default", "m", "chat", ALL, random.Random(), cooling, now=11.0)
