"""The catalogue at run time (contract §5): channels, models and groups through the admin API on
both stores, the file's entries kept by the file (409), serving from the live catalogue on
this instance and on another one, and the channel test."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import parse_settings
from gateway.store import Store
from gateway.store import catalogue as store_catalogue
from gateway.store.backends import open_store
from gateway.store.catalogue import CHANNEL, CatalogueEdit, CatalogueRecords
from gateway.store.catalogue import MODEL as MODEL_KIND
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway, make_config, serve_app
from tests.test_instances import propagated
from tests.test_relay import dead_port

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CLIENT = {"Authorization": f"Bearer {KEYS['alice']}"}
SECRET = "sk-upstream-made-at-run-time-7f3e"


class AdminClient:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.raw: list[bytes] = []  # every reply body, to look for secrets in

    async def __call__(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=body, headers=ADMIN) as r:
            raw = await r.read()
            self.raw.append(raw)
            return r.status, await r.json(content_type=None)

    async def chat(self, model: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers=CLIENT
        ) as r:
            await r.read()
            return r.status

    async def model_ids(self) -> list[str]:
        async with self.http.get(self.url + "/v1/models", headers=CLIENT) as r:
            return [m["id"] for m in (await r.json())["data"]]


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession() as s:
        yield s


def channel(fake_url: str, name: str = "c-api", **kw: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "type": "openai",
        "base_url": fake_url + "/v1",
        "api_key": SECRET,
        "groups": ["default"],
        "models": ["m-api"],
    }
    body.update(kw)
    return body


MODEL = {"name": "m-api", "capabilities": ["chat"], "price": {"input": 1.0, "output": 2.0}}


def error_of(reply: tuple[int, Any], status: int) -> dict[str, Any]:
    got, body = reply
    assert got == status, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "code"}
    return err


# ---- admin rows --------------------------------------------------------------------------


async def test_lists_show_the_file_entries_without_credentials(
    gateway: ServedGateway, http: aiohttp.ClientSession
) -> None:
    admin = AdminClient(http, gateway.url)
    status, channels = await admin("GET", "/admin/channels")
    assert status == 200
    assert [c["name"] for c in channels["data"]] == ["oa", "an", "gm", "vip-only"]
    oa = channels["data"][0]
    assert oa["origin"] == "file" and oa["status"] == "enabled" and "api_key" not in oa
    assert oa["model_map"] == {"chat-small": "up-small"}
    status, models = await admin("GET", "/admin/models")
    assert [m["name"] for m in models["data"]][:1] == ["chat-small"]
    assert models["data"][0]["origin"] == "file"
    assert [g["name"] for g in (await admin("GET", "/admin/groups"))[1]["data"]] == [
        "default",
        "vip",
    ]
    assert all(b"upstream-key" not in raw for raw in admin.raw)


async def test_channel_rows_validation_and_conflicts(
    gateway: ServedGateway, http: aiohttp.ClientSession, fake: Any
) -> None:
    admin = AdminClient(http, gateway.url)
    assert (await admin("POST", "/admin/models", MODEL))[0] == 201
    status, made = await admin("POST", "/admin/channels", channel(fake.url))
    assert status == 201, made
    assert made["name"] == "c-api" and made["origin"] == "api" and made["status"] == "enabled"
    assert "api_key" not in made and made["api_key_hint"] == "sk-…7f3e"
    assert (await admin("GET", "/admin/channels/c-api"))[1] == made
    err = error_of(await admin("POST", "/admin/channels", channel(fake.url)), 409)
    assert err["type"] == "conflict_error"

    # a clear 400 naming the field, by the config file's own rules
    for body, field in [
        (channel(fake.url, "c2", type="grpc"), "type"),
        (channel(fake.url, "c2", base_url="not-a-url"), "base_url"),
        (channel(fake.url, "c2", models=["nowhere"]), "models[0]"),
        (channel(fake.url, "c2", models=[]), "models"),
        (channel(fake.url, "c2", groups=["gold"]), "groups[0]"),
        (channel(fake.url, "c2", weight=-1), "weight"),
        (channel(fake.url, "c2", priority="high"), "priority"),
        (channel(fake.url, "c2", status="paused"), "status"),
        (channel(fake.url, "c2", responses=True, type="anthropic"), "responses"),
        (channel(fake.url, "c2", timeouts={"idle": 0}), "timeouts.idle"),
        (channel(fake.url, "c2", colour="blue"), "colour"),
        (channel(fake.url, "bad name"), "name"),
        ({**channel(fake.url, "c2"), "api_key": 7}, "api_key"),
    ]:
        err = error_of(await admin("POST", "/admin/channels", body), 400)
        assert err["message"].startswith(f"{field}:"), (field, err)
        assert err["type"] == "invalid_request_error"
    async with http.post(gateway.url + "/admin/channels", data=b"{", headers=ADMIN) as r:
        assert r.status == 400
    assert len((await admin("GET", "/admin/channels"))[1]["data"]) == 5

    # PATCH: the fields given, validated as a whole
    status, changed = await admin("PATCH", "/admin/channels/c-api", {"weight": 3, "priority": 2})
    assert status == 200 and (changed["weight"], changed["priority"]) == (3, 2)
    assert changed["api_key_hint"] == "sk-…7f3e"  # kept
    err = error_of(await admin("PATCH", "/admin/channels/c-api", {"base_url": "x"}), 400)
    assert err["message"].startswith("base_url:")
    err = error_of(await admin("PATCH", "/admin/channels/c-api", {"name": "other"}), 400)
    assert err["message"].startswith("name:")
    error_of(await admin("PATCH", "/admin/channels/missing", {"weight": 1}), 404)
    status, rotated = await admin("PATCH", "/admin/channels/c-api", {"api_key": SECRET + "-2"})
    assert status == 200 and rotated["api_key_hint"] == "sk-…3e-2"

    # the file's entries are the file's
    for method, body in (("PATCH", {"weight": 5}), ("DELETE", None)):
        err = error_of(await admin(method, "/admin/channels/oa", body), 409)
        assert err["code"] == "defined_in_config"
    error_of(await admin("PATCH", "/admin/models/chat-small", {"default_max_tokens": 9}), 409)
    error_of(await admin("DELETE", "/admin/models/chat-small"), 409)
    error_of(await admin("DELETE", "/admin/groups/vip"), 409)

    # the api_key never comes back, not even in an error
    assert all(SECRET.encode() not in raw and b"upstream-key" not in raw for raw in admin.raw)

    assert (await admin("DELETE", "/admin/channels/c-api")) == (
        200, {"name": "c-api", "deleted": True},
    )  # fmt: skip
    error_of(await admin("DELETE", "/admin/channels/c-api"), 404)
    error_of(await admin("GET", "/admin/channels/c-api"), 404)


async def test_model_and_group_rows(
    gateway: ServedGateway, http: aiohttp.ClientSession, fake: Any
) -> None:
    admin = AdminClient(http, gateway.url)
    status, made = await admin("POST", "/admin/models", MODEL)
    assert status == 201 and made["origin"] == "api"
    assert made["price"]["input"] == 1.0 and made["capabilities"] == ["chat"]
    error_of(await admin("POST", "/admin/models", MODEL), 409)
    for body, field in [
        ({**MODEL, "name": "m2", "capabilities": ["telepathy"]}, "capabilities[0]"),
        ({**MODEL, "name": "m2", "price": {"input": -1}}, "price.input"),
        # past the bound every instance's billing can hold (an overflow on every reload)
        ({**MODEL, "name": "m2", "price": {"input": 1e308}}, "price.input"),
        ({**MODEL, "name": "m2", "price": {"audio_second": 1_000_001}}, "price.audio_second"),
        ({**MODEL, "name": "m2", "default_max_tokens": 2**31}, "default_max_tokens"),
        ({**MODEL, "name": "m2", "price": {"per_token": 1}}, "price.per_token"),
        ({**MODEL, "name": "m2", "default_max_tokens": 0}, "default_max_tokens"),
        ({**MODEL, "name": ""}, "name"),
        ({"capabilities": ["chat"]}, "name"),
    ]:
        err = error_of(await admin("POST", "/admin/models", body), 400)
        assert err["message"].startswith(f"{field}:"), (field, err)
        if field in ("price.input", "price.audio_second"):  # the bound is said
            assert err["message"] == f"{field}: must be a number from 0 to 1000000"
    status, changed = await admin("PATCH", "/admin/models/m-api", {"price": {"input": 4}})
    assert status == 200 and changed["price"]["input"] == 4 and changed["price"]["output"] == 0
    error_of(await admin("PATCH", "/admin/models/m-api", {"capabilities": "chat"}), 400)

    # groups: made, used by a channel and by a key, then free to go
    assert (await admin("POST", "/admin/groups", {"name": "team"})) == (
        201, {"name": "team", "ratio": 1.0, "tool": None, "origin": "api"},
    )  # fmt: skip
    error_of(await admin("POST", "/admin/groups", {"name": "team"}), 409)
    error_of(await admin("POST", "/admin/groups", {"name": "a b"}), 400)
    error_of(await admin("POST", "/admin/groups", {"name": "x", "colour": 1}), 400)
    groups = (await admin("GET", "/admin/groups"))[1]["data"]
    assert [(g["name"], g["origin"]) for g in groups] == [
        ("default", "file"),
        ("vip", "file"),
        ("team", "api"),
    ]
    assert (await admin("POST", "/admin/channels", channel(fake.url, groups=["team"])))[0] == 201
    err = error_of(await admin("DELETE", "/admin/models/m-api"), 409)
    assert err["code"] == "in_use" and "c-api" in err["message"]
    err = error_of(await admin("DELETE", "/admin/groups/team"), 409)
    assert err["code"] == "in_use" and "c-api" in err["message"]
    assert (await admin("DELETE", "/admin/channels/c-api"))[0] == 200
    status, key = await admin("POST", "/admin/keys", {"account": "alice", "group": "team"})
    assert status == 201, key  # a key may use a group made at run time
    err = error_of(await admin("DELETE", "/admin/groups/team"), 409)
    assert key["id"] in err["message"]
    assert (await admin("DELETE", f"/admin/keys/{key['id']}"))[0] == 200
    assert (await admin("DELETE", "/admin/groups/team"))[0] == 200
    error_of(await admin("DELETE", "/admin/groups/team"), 404)
    assert (await admin("DELETE", "/admin/models/m-api"))[0] == 200
    error_of(await admin("DELETE", "/admin/models/m-api"), 404)


# ---- serving from the live catalogue -------------------------------------------------------


async def test_an_api_channel_serves_and_a_disabled_or_deleted_one_does_not(
    gateway: ServedGateway, http: aiohttp.ClientSession, fake: Any
) -> None:
    admin = AdminClient(http, gateway.url)
    assert await admin.chat("m-api") == 404
    assert (await admin("POST", "/admin/models", MODEL))[0] == 201
    assert (await admin("POST", "/admin/channels", channel(fake.url)))[0] == 201
    assert await admin.chat("m-api") == 200  # this instance: at once
    sent = fake.requests[-1]
    assert sent.headers["authorization"] == f"Bearer {SECRET}"
    assert sent.json["model"] == "m-api"
    assert "m-api" in await admin.model_ids()
    await gateway.state.writer.flush()
    records = [r for r in await gateway.state.store.usage("alice", 10) if r.model == "m-api"]
    assert [(r.channel, r.status) for r in records] == [("c-api", 200), (None, 404)]
    assert records[0].cost > 0

    assert (await admin("PATCH", "/admin/channels/c-api", {"status": "disabled"}))[0] == 200
    asked = len(fake.requests)
    assert await admin.chat("m-api") == 404
    assert "m-api" not in await admin.model_ids()
    assert (await admin("PATCH", "/admin/channels/c-api", {"status": "enabled"}))[0] == 200
    assert await admin.chat("m-api") == 200
    assert (await admin("DELETE", "/admin/channels/c-api"))[0] == 200
    assert await admin.chat("m-api") == 404
    assert len(fake.requests) == asked + 1  # only the one while it was enabled reached it


async def test_a_change_on_one_instance_serves_on_another(
    fake: Any, store_url: str, http: aiohttp.ClientSession
) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        on_a, on_b = AdminClient(http, a.url), AdminClient(http, b.url)
        assert (await on_a("POST", "/admin/models", MODEL))[0] == 201
        assert (await on_a("POST", "/admin/channels", channel(fake.url)))[0] == 201
        await propagated(lambda: on_b.chat("m-api"), 200)
        assert fake.requests[-1].headers["authorization"] == f"Bearer {SECRET}"
        assert (await on_a("PATCH", "/admin/channels/c-api", {"status": "disabled"}))[0] == 200
        await propagated(lambda: on_b.chat("m-api"), 404)
        assert (await on_b("PATCH", "/admin/channels/c-api", {"status": "enabled"}))[0] == 200
        await propagated(lambda: on_a.chat("m-api"), 200)
        assert (await on_b("DELETE", "/admin/channels/c-api"))[0] == 200
        await propagated(lambda: on_a.chat("m-api"), 404)
        # both list the same catalogue
        assert (await on_a("GET", "/admin/models"))[1] == (await on_b("GET", "/admin/models"))[1]


async def test_a_request_in_flight_keeps_its_catalogue(
    gateway: ServedGateway, http: aiohttp.ClientSession, fake: Any
) -> None:
    """The relay reads one immutable catalogue per request: swapping in another (here: the
    channel deleted) leaves the old object whole for whoever still holds it."""
    admin = AdminClient(http, gateway.url)
    assert (await admin("POST", "/admin/models", MODEL))[0] == 201
    assert (await admin("POST", "/admin/channels", channel(fake.url)))[0] == 201
    held = gateway.state.catalogue.current
    (ch,) = held.channels("default", "m-api")
    assert (await admin("DELETE", "/admin/channels/c-api"))[0] == 200
    assert gateway.state.catalogue.current is not held
    assert held.channels("default", "m-api") == (ch,)
    assert gateway.state.catalogue.current.channels("default", "m-api") == ()


# ---- channel test --------------------------------------------------------------------------


async def test_channel_test_against_the_fake_upstream(
    gateway: ServedGateway, http: aiohttp.ClientSession, fake: Any
) -> None:
    admin = AdminClient(http, gateway.url)
    for name, path in (("oa", "/v1/chat/completions"), ("an", "/v1/messages"),
                       ("gm", "/v1beta/models/gemini-small:generateContent")):  # fmt: skip
        status, result = await admin("POST", f"/admin/channels/{name}/test")
        assert status == 200, result
        assert result["ok"] is True and result["status"] == 200, result
        assert isinstance(result["latency_ms"], int) and "error" not in result
        assert fake.requests[-1].path == path
    sent = fake.requests[-3].json
    assert sent["model"] == "up-small" and sent["max_tokens"] == 1  # model_map applies
    assert fake.requests[-2].json["max_tokens"] == 1
    await gateway.state.writer.flush()
    assert await gateway.state.store.usage(None, 10) == []  # not recorded
    error_of(await admin("POST", "/admin/channels/missing/test"), 404)


async def test_channel_test_against_a_dead_port(
    gateway: ServedGateway, http: aiohttp.ClientSession
) -> None:
    admin = AdminClient(http, gateway.url)
    store = gateway.state.store
    before = await store.get_account("alice")
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    body = {**channel("", "c-dead", base_url=dead), "models": ["chat-small"]}
    assert (await admin("POST", "/admin/channels", body))[0] == 201
    status, result = await admin("POST", "/admin/channels/c-dead/test")
    assert status == 200
    assert result["ok"] is False and result["status"] is None
    assert result["error"] and isinstance(result["latency_ms"], int)
    assert SECRET.encode() not in admin.raw[-1]
    await gateway.state.writer.flush()
    assert await store.usage(None, 10) == []
    assert await store.get_account("alice") == before


async def test_a_bad_stored_record_is_left_out_and_the_rest_served(
    store_url: str,
    fake: Any,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store an older version wrote may hold a record today's rules refuse (a price past the
    bound): the catalogue loads without it, logged once, and keys and changes still apply."""
    store = open_store(store_url)
    await store.open()
    bad = {**MODEL, "name": "m-bad", "price": {"input": 1e308}, "origin": "api", "seq": 1_000_000}
    good = {**MODEL, "origin": "api", "seq": 1_000_001}
    serving = {**channel(fake.url), "origin": "api", "seq": 1_000_000}

    def plant(records: CatalogueRecords) -> CatalogueEdit:
        return CatalogueEdit(
            put={
                (MODEL_KIND, "m-bad"): bad,
                (MODEL_KIND, "m-api"): good,
                (CHANNEL, "c-api"): serving,
            }
        )

    try:
        await store.edit_catalogue(plant)
    finally:
        await store.close()
    monkeypatch.setattr(store_catalogue, "_WARNED", set(), raising=False)  # this test's lines
    caplog.set_level("WARNING", logger="gateway.store.catalogue")
    async with serve_app(parse_settings(make_config(fake.url, store_url))) as gw:
        admin = AdminClient(http, gw.url)
        async with http.get(gw.url + "/readyz") as r:
            assert r.status == 200
        names = [m["name"] for m in (await admin("GET", "/admin/models"))[1]["data"]]
        assert "m-api" in names and "m-bad" not in names
        assert await admin.chat("m-api") == 200
        # changes still reach every cache: a group made, a key made and used at once
        assert (await admin("POST", "/admin/groups", {"name": "team"}))[0] == 201
        status, key = await admin("POST", "/admin/keys", {"account": "alice", "group": "default"})
        assert status == 201, key
        body = {"model": "m-api", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {key['key']}"}
        async with http.post(gw.v1 + "/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
    lines = [r.getMessage() for r in caplog.records if "catalogue.bad_record" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "m-bad" in lines[0] and "price.input" in lines[0]


def test_records_that_are_not_objects_are_left_out() -> None:
    records = CatalogueRecords.decode(
        [("model:a", b"{"), ("model:b", b"[1]"), ("model:c", b'{"x": 1}'),
         ("model:m-api", orjson.dumps(MODEL))]
    )  # fmt: skip
    assert list(records.entries[MODEL_KIND]) == ["m-api"]


# ---- the store -----------------------------------------------------------------------------


async def test_seed_writes_the_file_and_keeps_its_secrets_out(store: Store) -> None:
    cfg = make_config("http://127.0.0.1:9", "sqlite:///unused.db")
    await store.seed(parse_settings(cfg))
    records = await store.load_catalogue()
    assert sorted(records.entries[CHANNEL]) == ["an", "gm", "oa", "vip-only"]
    assert all(r["origin"] == "file" and "api_key" not in r for r in records.of(CHANNEL))

    # made at run time: stored with its key
    def add(records: CatalogueRecords) -> CatalogueEdit:
        rec = {**channel("http://x", "c-api", models=["chat-small"]), "origin": "api", "seq": 1}
        return CatalogueEdit(put={(CHANNEL, "c-api"): rec})

    version = await store.version()
    await store.edit_catalogue(add)
    assert await store.version() != version
    got = (await store.load_catalogue()).get(CHANNEL, "c-api")
    assert got is not None and got["api_key"] == SECRET

    # a later file without "gm": gone; what the API made stays; nothing changed, no new version
    cfg["channels"] = [c for c in cfg["channels"] if c["name"] != "gm"]
    await store.seed(parse_settings(cfg))
    assert sorted((await store.load_catalogue()).entries[CHANNEL]) == [
        "an", "c-api", "oa", "vip-only",
    ]  # fmt: skip
    version = await store.version()
    await store.seed(parse_settings(cfg))
    assert await store.version() == version

    def refuse(records: CatalogueRecords) -> CatalogueEdit:
        raise ValueError("no")

    with pytest.raises(ValueError):
        await store.edit_catalogue(refuse)
    assert await store.version() == version
