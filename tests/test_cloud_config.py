"""The cloud channel types' configuration, model aliases and the output-limit field (pure):
every mistake names its field and never echoes a secret; base URLs default to the region's;
what the store keeps of a channel parses back to the same channel; an alias finds its model
the way routing does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.fake.google_auth import default_account
from gateway.config import ConfigError, parse_channel, parse_model, parse_settings
from gateway.policy.routing import Catalogue
from gateway.protocols.base import UpstreamTarget
from gateway.protocols.openai.request import encode_request
from gateway.store.catalogue import API, FILE, body_of, channel_record
from tests.plugins.servers import make_config

MODELS = {"m1", "m2"}
GROUPS = {"default"}
KEY_FILE = default_account().info("https://oauth2.googleapis.com/token")


def channel(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "models": ["m1"], **fields}


AZURE = channel(type="azure", base_url="https://res.openai.azure.com", api_version="2024-10-21")
BEDROCK = channel(
    type="bedrock", region="eu-west-1", aws_access_key_id="AKIA1", aws_secret_access_key="s3cr3t"
)
VERTEX = channel(
    type="vertex", project="proj-1", region="europe-west4", credentials=json.dumps(KEY_FILE)
)


def parsed(body: dict[str, Any]) -> Any:
    return parse_channel(body, "channels[3]", GROUPS, MODELS)


def refused(body: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parsed(body)
    return str(caught.value)


def test_each_cloud_type_parses_with_its_fields() -> None:
    azure = parsed(AZURE)
    assert (azure.cloud.api_version, azure.speaks) == ("2024-10-21", frozenset({"openai"}))
    bedrock = parsed(BEDROCK)
    assert bedrock.base_url == "https://bedrock-runtime.eu-west-1.amazonaws.com"
    assert bedrock.cloud.aws_access_key_id == "AKIA1" and "s3cr3t" not in repr(bedrock)
    vertex = parsed(VERTEX)
    assert vertex.base_url == "https://europe-west4-aiplatform.googleapis.com"
    assert vertex.speaks == frozenset({"anthropic", "gemini"})
    assert "PRIVATE" not in repr(vertex)
    assert parsed({**VERTEX, "region": "global"}).base_url == "https://aiplatform.googleapis.com"
    assert parsed({**VERTEX, "region": "eu"}).base_url == "https://aiplatform.eu.rep.googleapis.com"
    assert parsed({**BEDROCK, "base_url": "http://127.0.0.1:9001/"}).base_url == (
        "http://127.0.0.1:9001"
    )
    chain = parsed(channel(type="bedrock", region="us-east-1"))  # the environment's chain
    assert chain.cloud.aws_access_key_id == ""
    assert parsed({**AZURE, "responses": True}).speaks == frozenset({"openai", "responses"})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**AZURE, "api_version": None}, "channels[3].api_version: must be a non-empty string"),
        ({**AZURE, "base_url": None}, "channels[3].base_url: must be a non-empty string"),
        ({**BEDROCK, "region": None}, "channels[3].region: must be a non-empty string"),
        ({**BEDROCK, "region": "us east"}, "channels[3].region: 'us east' is not a valid region"),
        (
            {**BEDROCK, "aws_secret_access_key": None},
            "channels[3].aws_secret_access_key: required with the other",
        ),
        (
            channel(type="bedrock", region="us-east-1", aws_session_token="t"),
            "channels[3].aws_session_token: only with aws_access_key_id",
        ),
        (
            {**BEDROCK, "aws_session_token": "s3cr3t-token\n"},
            "channels[3].aws_session_token: holds a line break or another control character",
        ),
        (
            {**BEDROCK, "aws_access_key_id": "AKIA1\r"},
            "channels[3].aws_access_key_id: holds a line break or another control character",
        ),
        (
            {**AZURE, "api_key": "s3cr3t\x00"},
            "channels[3].api_key: holds a line break or another control character",
        ),
        ({**VERTEX, "project": None}, "channels[3].project: must be a non-empty string"),
        ({**VERTEX, "credentials": None}, "channels[3].credentials: must be a non-empty string"),
        ({**VERTEX, "credentials": "{not json"}, "channels[3].credentials: not a service account"),
        (
            {**VERTEX, "credentials": json.dumps({**KEY_FILE, "type": "user"})},
            "channels[3].credentials: not a service account key (type",
        ),
        (
            {**VERTEX, "credentials": json.dumps({**KEY_FILE, "private_key": ""})},
            "channels[3].credentials: the service account key has no private_key",
        ),
        (
            {**VERTEX, "credentials": "/nonexistent/key.json"},
            "channels[3].credentials: cannot read '/nonexistent/key.json'",
        ),
        (
            channel(type="openai", base_url="http://x/v1", region="us-east-1"),
            "channels[3].region: only bedrock, vertex channels take it",
        ),
        ({**AZURE, "project": "p"}, "channels[3].project: only vertex channels take it"),
        ({**BEDROCK, "responses": True}, "channels[3].responses: only an openai or azure"),
        (
            channel(type="anthropic", base_url="http://x", max_tokens_field="max_tokens"),
            "channels[3].max_tokens_field: only openai and azure channels take it",
        ),
        ({**AZURE, "max_tokens_field": "limit"}, "channels[3].max_tokens_field: must be"),
    ],
)
def test_each_mistake_names_its_field(body: dict[str, Any], message: str) -> None:
    error = refused(body)
    assert error.startswith(message), error
    assert "s3cr3t" not in error and "PRIVATE" not in error


def test_a_key_file_is_read_from_its_path(tmp_path: Path) -> None:
    path = tmp_path / "key.json"
    path.write_text(json.dumps(KEY_FILE))
    assert parsed({**VERTEX, "credentials": str(path)}).cloud.credentials == str(path)
    path.write_bytes(b"\xff\xfe")
    assert "not a JSON key file" in refused({**VERTEX, "credentials": str(path)})


@pytest.mark.parametrize("body", [AZURE, BEDROCK, VERTEX])
@pytest.mark.parametrize("origin", [API, FILE])
def test_the_stored_record_parses_back_to_the_channel(body: dict[str, Any], origin: str) -> None:
    ch = parsed({**body, "api_key": "k" if body is AZURE else ""})
    record = channel_record(ch, origin, 7)
    again = body_of(record)
    if origin == FILE:  # a file's credentials stay in its file
        assert "aws_secret_access_key" not in record and "credentials" not in record
        assert "api_key" not in record
        return
    assert parsed(again) == ch
    if body is not AZURE:  # the region's base URL is not kept: a new region brings its own
        assert "base_url" not in record
        moved = parsed({**again, "region": "us-west-2"})
        assert "us-west-2" in moved.base_url


def test_output_limit_field_by_channel_and_model_name() -> None:
    openai = parsed(channel(type="openai", base_url="http://x/v1"))
    assert openai.output_limit_field("gpt-4o") == "max_tokens"
    for name in ("o1-mini", "o3", "o4-mini", "gpt-5-codex"):
        assert openai.output_limit_field(name) == "max_completion_tokens"
    azure = parsed({**AZURE, "max_tokens_field": "max_completion_tokens"})
    assert azure.output_limit_field("my-deployment") == "max_completion_tokens"


def test_the_openai_adapter_moves_max_tokens_where_the_target_says() -> None:
    target = UpstreamTarget(
        channel="c", base_url="http://x/v1", api_key="k", model="o3", default_max_tokens=9,
        stream=False, max_tokens_field="max_completion_tokens",
    )  # fmt: skip
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    body = orjson.loads(encode_request(req, target).body)  # type: ignore[arg-type]
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    target.max_tokens_field = "max_tokens"
    body = orjson.loads(encode_request(req, target).body)  # type: ignore[arg-type]
    assert body["max_tokens"] == 50 and "max_completion_tokens" not in body


# -- aliases ---------------------------------------------------------------------------------


def test_aliases_are_names_or_patterns_and_never_a_models_own() -> None:
    model = parse_model({"name": "m1", "aliases": ["claude-sonnet-4-5", "claude-*"]})
    assert model.aliases == ("claude-sonnet-4-5", "claude-*")
    with pytest.raises(ConfigError, match=r"models\[0\].aliases\[0\]: 'm1' is the model's own"):
        parse_model({"name": "m1", "aliases": ["m1"]}, "models[0]")
    with pytest.raises(ConfigError, match=r"aliases\[0\]: 'a b' is not a valid"):
        parse_model({"name": "m1", "aliases": ["a b"]}, "models[0]")


def settings_with(models: list[dict[str, Any]], channels: list[dict[str, Any]]) -> Any:
    cfg = make_config("http://up.test", "sqlite:///unused.db")
    return parse_settings({**cfg, "models": models, "channels": channels, "keys": []})


def model(name: str, *aliases: str) -> dict[str, Any]:
    return {"name": name, "price": {"input": 1}, "aliases": list(aliases)}


def serving(name: str, models: list[str], groups: list[str]) -> dict[str, Any]:
    return {"name": name, "type": "openai", "base_url": "http://up.test/v1", "models": models,
            "groups": groups}  # fmt: skip


def test_an_exact_alias_is_one_models_and_no_models_name() -> None:
    with pytest.raises(ConfigError, match=r"models\[1\].aliases\[0\]: 'a' is the name of a model"):
        settings_with([model("a"), model("b", "a")], [serving("c", ["a", "b"], ["default"])])
    with pytest.raises(ConfigError, match=r"models\[1\].aliases\[0\]: 'x' is already an alias"):
        settings_with([model("a", "x"), model("b", "x")], [serving("c", ["a", "b"], ["default"])])


def test_resolve_finds_the_model_a_client_means() -> None:
    settings = settings_with(
        [
            model("sonnet", "claude-sonnet-4-5", "claude-*"),
            model("haiku", "claude-3-5-haiku-*"),
            model("vip-sonnet", "claude-opus-*"),
            model("gem", "gemini-*"),
        ],
        [
            serving("c", ["sonnet", "haiku", "gem"], ["default", "vip"]),
            serving("v", ["vip-sonnet"], ["vip"]),
        ],
    )
    cat = Catalogue(settings)
    assert cat.resolve("default", "claude-sonnet-4-5") == "sonnet"  # exact
    assert cat.resolve("default", "claude-3-5-haiku-20241022") == "haiku"  # the most specific
    assert cat.resolve("default", "claude-opus-4-1") == "sonnet"  # vip-sonnet: not its group
    assert cat.resolve("vip", "claude-opus-4-1") == "vip-sonnet"
    assert cat.resolve("vip", "claude-2") == "sonnet"
    assert cat.resolve("default", "gemini-2.5-pro") == "gem"
    assert cat.resolve("default", "haiku") == "haiku"  # a catalogue name is its own model
    assert cat.resolve("default", "gpt-4o") == "gpt-4o"  # nothing: the name as asked (404)
    names = [a for m in cat.group_models("default") for a in cat.aliases(m)]
    assert names == ["claude-sonnet-4-5"]  # the list shows exact aliases, not patterns
