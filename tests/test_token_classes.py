"""Token classes end to end, pure: what each channel reports is read by class (cache reads,
cache writes, reasoning), kept on the usage record, priced each at its own price, and shown to
every client in its own protocol's fields.

- The fixtures' ``usage_classes`` and ``stream_usage_classes`` cases (every client x upstream
  pair, the pass-throughs included) name in ``meta.json`` the record's classes (``record``);
  their cost is checked exactly (``Decimal``) against a price table.
- Property tests (hypothesis) over every pair, whole replies and streams: no class negative,
  the parts never more than the totals the upstream reported (cache reads and writes within
  the prompt, reasoning within the output), nothing counted twice, and the client's usage in
  its protocol's own fields, telling the record's classes as that protocol can.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Price
from gateway.kinds.chat import chat_used
from gateway.observe.metrics import Metrics
from gateway.policy.billing import PICO_PER_MICRO, Metered, Rate, cache_prices, usage_classes
from gateway.protocols import ADAPTERS, CLIENTS
from gateway.protocols.anthropic.reply import decode_usage
from gateway.protocols.base import Ctx, Passthrough, RouteMatch, UpstreamTarget
from gateway.protocols.converse.reply import decode_usage as converse_usage
from gateway.protocols.responses import ResponsesAdapter
from gateway.protocols.sse import SSEParser
from tests.fixture_tree import FixtureCase
from tests.mutation import BOUNDED
from tests.test_conversion import Case, case_dirs, load, run_stream

CLASSES = ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens",
           "reasoning_tokens")  # fmt: skip
# balance units per million tokens, each class its own
PRICES = {"input": "3", "output": "15", "cache_read": "0.3", "cache_write": "3.75"}
PRICE = Price(**{k: float(v) for k, v in PRICES.items()})
MICRO = Decimal(1_000_000)


def record_of(used: Metered) -> dict[str, int]:
    return {name: getattr(used, name) for name in CLASSES}


def exact_cost(used: Metered, prices: dict[str, str]) -> Decimal:
    """Balance units, in decimal arithmetic: each class at its price per million tokens."""
    read = Decimal(prices.get("cache_read", prices["input"]))
    write = Decimal(prices.get("cache_write", prices["input"]))
    return (
        used.fresh_input_tokens * Decimal(prices["input"])
        + used.cache_read_tokens * read
        + used.cache_write_tokens * write
        + used.completion_tokens * Decimal(prices["output"])
    ) / MICRO


def billed(used: Metered, price: Price, ratio: Fraction | int = 1) -> Decimal:
    charge = Rate.from_price(price).charge(used, ratio)
    assert 0 <= charge.pico < PICO_PER_MICRO
    return (charge.micro * MICRO + charge.pico) / (MICRO * MICRO)


# -- the fixtures ----------------------------------------------------------------------------


def class_cases() -> list[Any]:
    return [
        pytest.param(p, id=f"{p.parent.name}/{p.name}")
        for p in case_dirs()
        if "record" in FixtureCase(p).manifest
    ]


def fixture_used(path: Path) -> Metered:
    """What the relay bills a fixture case for: the usage the attempt read, by class (the
    kind's exchange chooses the pass-through or the conversion, as the relay's does)."""
    c = Case(path)
    if c.stream:
        _, usage = run_stream(c, c.files.reply(".sse").read_bytes())
        return chat_used(usage)
    exchange = c.attempt()
    return exchange.reply(c.files.reply(".json").read_bytes(), {}).used


def test_every_pair_has_token_class_cases_whole_and_streamed() -> None:
    names = {(p.values[0].parent.name, p.values[0].name) for p in class_cases()}
    pairs = {f"{c}__{u}" for c in CLIENTS for u in ADAPTERS}
    assert names == {(p, n) for p in pairs for n in ("usage_classes", "stream_usage_classes")}


@pytest.mark.parametrize("path", class_cases())
def test_fixture_records_keep_every_class_at_its_own_price(path: Path) -> None:
    used = fixture_used(path)
    assert record_of(used) == FixtureCase(path).manifest["record"]
    assert billed(used, PRICE) == exact_cost(used, PRICES)
    # cache prices left unset: the input price (``billing.cache_prices``)
    unset = {"input": "3", "output": "15"}
    assert billed(used, Price(input=3, output=15)) == exact_cost(used, unset)


# -- prices ----------------------------------------------------------------------------------


def test_an_unset_cache_price_is_the_input_price() -> None:
    assert cache_prices(Price(input=2)) == (2, 2, 2)
    assert cache_prices(Price(input=2, cache_read=0.2, cache_write=0)) == (0.2, 0, 0)
    free_writes = Rate.from_price(Price(input=2, cache_write=0))
    assert (free_writes.cache_read, free_writes.cache_write) == (2_000_000, 0)
    # no table row and no price of its own: a 1-hour write costs what a write costs
    assert cache_prices(Price(input=2, cache_write=2.5)) == (2, 2.5, 2.5)
    assert cache_prices(Price(input=2, cache_write=2.5, cache_write_1h=4)) == (2, 2.5, 4)


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (1, Decimal("0.00456")),  # 1000 fresh at 3, 200 read at 0.3, 100 out at 15 (/ 1e6)
        (Fraction(3, 2), Decimal("0.00684")),
        (Fraction(1, 3), Decimal("0.00152")),
        (Fraction(1, 7), Decimal("0.000651428571")),  # 651,428,571.43 pico-units: rounded
    ],
)
def test_a_ratio_multiplies_the_exact_cost(ratio: Fraction | int, expected: Decimal) -> None:
    used = Metered(prompt_tokens=1200, completion_tokens=100, cache_read_tokens=200)
    assert billed(used, Price(input=3, output=15, cache_read=0.3), ratio) == expected


@given(
    st.integers(0, 10**7),
    st.integers(0, 10**7),
    st.integers(0, 10**7),
    st.integers(0, 10**7),
    st.sampled_from(["0.01", "0.3", "3", "3.75", "0.000001", "1234.5678"]),
)
@BOUNDED
def test_every_charge_is_exact_and_never_zero(
    fresh: int, read: int, write: int, out: int, each: str
) -> None:
    used = Metered(
        prompt_tokens=fresh + read + write,
        completion_tokens=out,
        cache_read_tokens=read,
        cache_write_tokens=write,
    )
    prices = {"input": each, "output": each, "cache_read": each, "cache_write": each}
    price = Price(**{k: float(v) for k, v in prices.items()})
    assert billed(used, price) == exact_cost(used, prices)
    assert (billed(used, price) > 0) == (fresh + read + write + out > 0)


# -- what each upstream reports, by class ----------------------------------------------------

Counts = dict[str, int]
counts = st.integers(0, 2**31 - 1)


def openai_usage(n: Counts) -> Any:
    return {
        "prompt_tokens": n["prompt"],
        "completion_tokens": n["completion"],
        "total_tokens": n["prompt"] + n["completion"],
        "prompt_tokens_details": {"cached_tokens": n["read"], "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": n["reasoning"], "audio_tokens": 0},
    }


def anthropic_usage(n: Counts) -> Any:
    return {
        "input_tokens": n["fresh"],
        "cache_read_input_tokens": n["read"],
        "cache_creation_input_tokens": n["write"],
        "output_tokens": n["completion"],
    }


def gemini_usage(n: Counts) -> Any:
    return {
        "promptTokenCount": n["prompt"],
        "cachedContentTokenCount": n["read"],
        "candidatesTokenCount": n["candidates"],
        "thoughtsTokenCount": n["reasoning"],
        "totalTokenCount": n["prompt"] + n["candidates"] + n["reasoning"],
    }


def expected_record(upstream: str, n: Counts) -> dict[str, int]:
    """The record's classes from what the upstream reported: its totals as they are, the
    parts cut to fit them."""
    if upstream == "anthropic":
        prompt = n["fresh"] + n["read"] + n["write"]
        return dict(zip(CLASSES, (prompt, n["completion"], n["read"], n["write"], 0), strict=True))
    completion = n["completion"] if upstream == "openai" else n["candidates"] + n["reasoning"]
    read = min(n["read"], n["prompt"])
    reasoning = min(n["reasoning"], completion)
    return dict(zip(CLASSES, (n["prompt"], completion, read, 0, reasoning), strict=True))


def reported(upstream: str) -> st.SearchStrategy[Counts]:
    """Counts an upstream of this protocol may report: its parts within its totals or (a
    broken upstream) not."""
    if upstream == "anthropic":
        return st.fixed_dictionaries(
            {"fresh": counts, "read": counts, "write": counts, "completion": counts}
        ).filter(lambda n: n["fresh"] + n["read"] + n["write"] < 2**31)
    names = ("prompt", "read", "reasoning", "completion" if upstream == "openai" else "candidates")
    return st.fixed_dictionaries(dict.fromkeys(names, counts)).filter(
        lambda n: sum(n.values()) < 2**31
    )


ENCODED_FIELDS = {  # the usage fields each client protocol has, and no other
    "openai": {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
               "completion_tokens_details"},
    "anthropic": {"input_tokens", "output_tokens", "cache_read_input_tokens",
                  "cache_creation_input_tokens"},
    "gemini": {"promptTokenCount", "candidatesTokenCount", "totalTokenCount",
               "cachedContentTokenCount", "thoughtsTokenCount"},
    "responses": {"input_tokens", "input_tokens_details", "output_tokens",
                  "output_tokens_details", "total_tokens"},
}  # fmt: skip
# the classes each client protocol has fields for (the rest are in its totals only)
SHOWN = {
    "openai": {"prompt_tokens", "completion_tokens", "cache_read_tokens", "reasoning_tokens"},
    "anthropic": {"prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens"},
    "gemini": {"prompt_tokens", "completion_tokens", "cache_read_tokens", "reasoning_tokens"},
    "responses": set(CLASSES),
}


def _get(obj: Any, *keys: str) -> int:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    assert obj is None or (type(obj) is int and obj >= 0), (keys, obj)
    return obj or 0


def client_classes(protocol: str, usage: Any) -> dict[str, int]:
    """The classes as a client of ``protocol`` reads them from its usage object."""
    if protocol == "openai":
        read = _get(usage, "prompt_tokens_details", "cached_tokens")
        reasoning = _get(usage, "completion_tokens_details", "reasoning_tokens")
        values = (_get(usage, "prompt_tokens"), _get(usage, "completion_tokens"), read, 0)
        return dict(zip(CLASSES, (*values, reasoning), strict=True))
    if protocol == "anthropic":
        read, write = (
            _get(usage, "cache_read_input_tokens"),
            _get(usage, "cache_creation_input_tokens"),
        )
        prompt = _get(usage, "input_tokens") + read + write
        return dict(
            zip(CLASSES, (prompt, _get(usage, "output_tokens"), read, write, 0), strict=True)
        )
    if protocol == "gemini":
        thoughts = _get(usage, "thoughtsTokenCount")
        completion = _get(usage, "candidatesTokenCount") + thoughts
        prompt, read = _get(usage, "promptTokenCount"), _get(usage, "cachedContentTokenCount")
        return dict(zip(CLASSES, (prompt, completion, read, 0, thoughts), strict=True))
    return dict(zip(CLASSES, (
        _get(usage, "input_tokens"),
        _get(usage, "output_tokens"),
        _get(usage, "input_tokens_details", "cached_tokens"),
        _get(usage, "input_tokens_details", "cache_write_tokens"),
        _get(usage, "output_tokens_details", "reasoning_tokens"),
    ), strict=True))  # fmt: skip


def fits(classes: dict[str, int]) -> bool:
    """No class negative, parts within their totals."""
    return (
        min(classes.values()) >= 0
        and classes["cache_read_tokens"] + classes["cache_write_tokens"] <= classes["prompt_tokens"]
        and classes["reasoning_tokens"] <= classes["completion_tokens"]
    )


def consistent(upstream: str, n: Counts) -> bool:
    """Whether the upstream's parts were within its totals (a pass-through forwards its
    counts as they came, a broken upstream's too)."""
    if upstream == "anthropic":
        return True  # its prompt is the sum of its parts
    completion = n["completion"] if upstream == "openai" else n["candidates"] + n["reasoning"]
    return n["read"] <= n["prompt"] and n["reasoning"] <= completion


def check_client(client: str, upstream: str, usage: Any, n: Counts) -> None:
    """The client's usage: its protocol's fields only (a pass-through: the upstream's own, as
    sent), the parts within the totals, and, where the upstream was consistent, every class
    the protocol has a field for equal to the record's: none lost, none counted twice."""
    record = expected_record(upstream, n)
    got = client_classes(client, usage)
    if client != upstream:
        assert set(usage) <= ENCODED_FIELDS[client], usage
        assert fits(got), (got, usage)
    if client != upstream or consistent(upstream, n):
        for name in SHOWN[client]:
            assert got[name] == record[name], (name, got, record)


CTX = Ctx(request_id="req", model="m", created=1700000000, include_usage=True)
TARGET = UpstreamTarget("test", "http://up.test", "key", "up-model", 4096, False)
FIXTURES = Path(__file__).parent / "fixtures" / "conversion"


def whole_reply(upstream: str, n: Counts) -> Any:
    reply = load(FIXTURES / "replies" / upstream / "usage_classes.json")
    if upstream == "openai":
        reply["usage"] = openai_usage(n)
    elif upstream == "anthropic":
        reply["usage"] = anthropic_usage(n)
    else:
        reply["usageMetadata"] = gemini_usage(n)
    return reply


def client_usage(client: str, out: Any) -> Any:
    return out.get("usageMetadata") if client == "gemini" else out.get("usage")


@pytest.mark.parametrize("upstream", list(ADAPTERS))
@given(data=st.data())
@BOUNDED
def test_whole_replies_keep_every_class_once(upstream: str, data: st.DataObject) -> None:
    n = data.draw(reported(upstream))
    for client, adapter in CLIENTS.items():
        body = whole_reply(upstream, n)
        if client == upstream:
            out, usage = cast(Passthrough, adapter).passthrough_response(body, CTX)
        else:
            resp = ADAPTERS[upstream].decode_response(body)
            usage = resp.get("usage")
            out = adapter.encode_response(orjson.loads(orjson.dumps(resp)), CTX)
        record = record_of(chat_used(usage))
        assert fits(record) and record == expected_record(upstream, n), (client, record)
        check_client(client, upstream, client_usage(client, out), n)


def upstream_stream(upstream: str, n: Counts) -> bytes:
    """The case's upstream stream with these counts where its usage was."""
    raw = FIXTURES / "replies" / upstream / "stream_usage_classes.sse"
    events = []
    for block in raw.read_text().split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        name = lines[0][len("event: ") :] if lines[0].startswith("event: ") else None
        data = lines[-1][len("data: ") :]
        if data != "[DONE]":
            payload = json.loads(data)
            if upstream == "openai" and payload.get("usage"):
                payload["usage"] = openai_usage(n)
            elif upstream == "gemini" and "usageMetadata" in payload:
                payload["usageMetadata"] = gemini_usage(n)
            elif name == "message_start":
                payload["message"]["usage"] = {**anthropic_usage(n), "output_tokens": 1}
            elif name == "message_delta":
                payload["usage"] = {"output_tokens": n["completion"]}
            data = json.dumps(payload)
        events.append((f"event: {name}\n" if name else "") + f"data: {data}\n\n")
    return "".join(events).encode()


def sent_usage(client: str, sent: bytes) -> Any:
    """The usage a client of ``client`` reads from the stream it was sent (the messages
    protocol's: message_start's, updated by message_delta's)."""
    parser = SSEParser()
    usage: Any = None
    for event in [*parser.feed(sent), *parser.close()]:
        if event.data == b"[DONE]":
            continue
        payload = orjson.loads(event.data)
        if client == "openai" and payload.get("usage"):
            usage = payload["usage"]
        elif client == "gemini" and "usageMetadata" in payload:
            usage = payload["usageMetadata"]
        elif client == "responses" and payload.get("type") == "response.completed":
            usage = payload["response"]["usage"]
        elif client == "anthropic" and payload.get("type") == "message_start":
            usage = dict(payload["message"]["usage"])
        elif client == "anthropic" and payload.get("type") == "message_delta":
            usage.update(payload["usage"])
    if client == "anthropic" and isinstance(usage, dict):
        usage = {k: v for k, v in usage.items() if k in ENCODED_FIELDS["anthropic"]}
    return usage


@pytest.mark.parametrize("upstream", list(ADAPTERS))
@given(data=st.data())
@BOUNDED
def test_streams_keep_every_class_once(upstream: str, data: st.DataObject) -> None:
    n = data.draw(reported(upstream))
    raw = upstream_stream(upstream, n)
    for client in CLIENTS:
        case = Case(FIXTURES / f"{client}__{upstream}" / "stream_usage_classes")
        sent, usage = run_stream(case, raw)
        record = record_of(chat_used(usage))
        assert fits(record) and record == expected_record(upstream, n), (client, record)
        check_client(client, upstream, sent_usage(client, sent), n)


# -- the Responses pass-through (a Responses client on a channel that speaks it) ---------------


def test_the_responses_pass_through_reads_every_class() -> None:
    usage = {
        "input_tokens": 2006,
        "input_tokens_details": {"cached_tokens": 1536},
        "output_tokens": 320,
        "output_tokens_details": {"reasoning_tokens": 256},
        "total_tokens": 2326,
    }
    response = {"object": "response", "id": "resp_1", "model": "up", "output": [], "usage": usage}
    _, got = ResponsesAdapter().passthrough_response(dict(response), CTX)
    expected = dict(zip(CLASSES, (2006, 320, 1536, 0, 256), strict=True))
    assert record_of(usage_classes(got)) == expected

    route = RouteMatch(protocol="responses", capability="chat", model="m", stream=True)
    stream = ResponsesAdapter().passthrough_stream(CTX, route, TARGET)
    done = {"type": "response.completed", "sequence_number": 1, "response": response}
    stream.feed(b"event: response.completed\ndata: " + orjson.dumps(done) + b"\n\n")
    stream.finish()
    assert record_of(usage_classes(stream.usage)) == expected


# -- metrics ---------------------------------------------------------------------------------


def test_metrics_count_each_class_as_a_token_type_and_the_exact_cost() -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.observe.metrics import registry_for
    from tests.plugins.records import usage_record

    metrics = Metrics(["chat-small"])
    rec = usage_record(
        prompt_tokens=2006,
        completion_tokens=320,
        cache_read_tokens=1536,
        cache_write_tokens=400,
        reasoning_tokens=256,
        cost=5,
        cost_pico=500_000,
    )
    for _ in range(2):
        metrics.observe(rec, 0.5, None, upstream=0.4)
    text = generate_latest(registry_for(metrics)).decode()
    sums = {
        (s.name, s.labels.get("gen_ai_token_type", s.labels.get("model"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("gen_ai_client_token_usage_sum", "gateway_cost_total")
    }
    assert sums == {
        ("gen_ai_client_token_usage_sum", "input"): 2 * 2006,
        ("gen_ai_client_token_usage_sum", "output"): 2 * 320,
        ("gen_ai_client_token_usage_sum", "cache_read"): 2 * 1536,
        ("gen_ai_client_token_usage_sum", "cache_write"): 2 * 400,
        ("gen_ai_client_token_usage_sum", "reasoning"): 2 * 256,
        ("gateway_cost_total", "chat-small"): 0.000011,  # 2 x 5.5 micro-units
    }


@pytest.mark.parametrize(
    ("usage", "write", "hour"),
    [
        ({"cache_creation_input_tokens": 100, "cache_creation": {"ephemeral_1h_input_tokens": 40,
          "ephemeral_5m_input_tokens": 60}}, 100, 40),
        ({"cache_creation_input_tokens": 100, "cache_creation": {"ephemeral_1h_input_tokens": 500}},
         100, 100),  # never more than the writes
        ({"cache_creation_input_tokens": 100, "cache_creation": {"ephemeral_1h_input_tokens": -5}},
         100, 0),
        ({"cache_creation_input_tokens": 100, "cache_creation": {"ephemeral_1h_input_tokens": "9"}},
         100, 0),
        ({"cache_creation_input_tokens": 100, "cache_creation": [40]}, 100, 0),
        ({"cache_creation_input_tokens": 0, "cache_creation": {"ephemeral_1h_input_tokens": 40}},
         0, 0),  # no writes, no 1-hour ones
        ({"cache_creation_input_tokens": 100}, 100, 0),  # before the lifetimes were reported
    ],
)  # fmt: skip
def test_anthropic_one_hour_writes_are_a_part_of_the_writes(
    usage: dict[str, Any], write: int, hour: int
) -> None:
    internal = decode_usage({"input_tokens": 10, "output_tokens": 5, **usage})
    used = usage_classes(internal)
    assert (used.prompt_tokens, used.cache_write_tokens, used.cache_write_1h_tokens) == (
        10 + write,
        write,
        hour,
    )
    # priced: 5-minute writes at 1.25, 1-hour ones at 2, per million tokens
    price = Price(input=1, output=2, cache_write=1.25, cache_write_1h=2)
    assert (
        billed(used, price)
        == (Decimal(10) + Decimal("1.25") * (write - hour) + 2 * hour + 2 * 5) / MICRO
    )


def test_one_hour_writes_are_cut_to_the_writes_the_prompt_leaves() -> None:
    used = Metered(prompt_tokens=100, cache_read_tokens=80, cache_write_tokens=50,
                   cache_write_1h_tokens=50).classified()  # fmt: skip
    assert (used.cache_read_tokens, used.cache_write_tokens, used.cache_write_1h_tokens) == (
        80, 20, 20
    )  # fmt: skip


@pytest.mark.parametrize(
    ("details", "hour"),
    [
        ([{"ttl": "1h", "inputTokens": 40}, {"ttl": "5m", "inputTokens": 60}], 40),
        ([{"ttl": "5m", "inputTokens": 100}], 0),
        ([{"ttl": "1h", "inputTokens": 400}], 100),  # never more than the writes
        ([{"ttl": "1h", "inputTokens": -4}, {"ttl": "1h", "inputTokens": 30}], 30),
        ([{"ttl": "1h"}, "1h", None], 0),
        ({"ttl": "1h", "inputTokens": 40}, 0),  # not a list
    ],
)  # fmt: skip
def test_converse_one_hour_writes_are_read_from_its_cache_details(details: Any, hour: int) -> None:
    internal = converse_usage({"inputTokens": 10, "outputTokens": 5, "cacheWriteInputTokens": 100,
                               "cacheDetails": details})  # fmt: skip
    used = usage_classes(internal)
    assert (used.prompt_tokens, used.cache_write_tokens, used.cache_write_1h_tokens) == (
        110, 100, hour
    )  # fmt: skip
