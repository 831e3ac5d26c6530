"""The OpenAPI document (``gateway/operator/openapi.json``, served at ``/openapi.json``): the
file is what ``gateway.operator.openapi`` builds, every route is in it with its methods and
nothing in it is unrouted, and the admin part is shown only with the admin token."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from starlette.routing import Match, Mount, Route

from gateway.edge.routes import ROUTES, Router
from gateway.operator.admin import admin_routes
from gateway.operator.openapi import document
from tests.plugins.servers import ADMIN_TOKEN, ServedGateway

FILE = Path(__file__).resolve().parent.parent / "gateway" / "operator" / "openapi.json"
METHODS = {"get", "post", "put", "patch", "delete"}


def test_the_file_is_what_the_module_builds() -> None:
    assert orjson.loads(FILE.read_bytes()) == orjson.loads(orjson.dumps(document())), (
        "run: python -m gateway.operator.openapi > gateway/operator/openapi.json"
    )


def operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (path, method.upper())
        for path, item in doc["paths"].items()
        for method in item
        if method in METHODS
    }


def admin_operations() -> set[tuple[str, str]]:
    out = set()
    for route in admin_routes():
        assert isinstance(route, Route)
        if "{path:path}" in route.path:
            continue  # the catch-all: 404 in our shape for what is not here
        for method in route.methods or ():
            if method != "HEAD":
                out.add(("/admin" + route.path.replace(":path}", "}"), method))
    return out


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x-1", path)


def test_every_route_is_documented_and_nothing_else() -> None:
    documented = operations(document())
    routed = {(spec.path, spec.method) for spec in ROUTES} | admin_operations()
    routed |= {("/healthz", "GET"), ("/readyz", "GET"), ("/metrics", "GET")}
    assert routed - documented == set(), "routes missing from the document"
    assert documented - routed == set(), "documented but not routed"
    router = Router()
    for path, method in documented:  # each documented client path reaches its route
        if not path.startswith(("/admin", "/healthz", "/readyz", "/metrics")):
            found = router.match(method, concrete(path))
            assert found is not None and found[0].path == path


def test_admin_paths_exist_in_the_app() -> None:
    mount = Mount("/admin", routes=admin_routes())
    for path, method in admin_operations():
        scope = {"type": "http", "path": concrete(path), "method": method, "root_path": ""}
        match, _ = mount.matches(scope)
        assert match == Match.FULL, path


async def test_served_with_the_admin_part_only_for_the_admin(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/openapi.json") as r:
            public = await r.json()
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.get(gateway.url + "/openapi.json", headers=admin) as r:
            whole = await r.json()
    assert public["openapi"].startswith("3.1")
    assert not any(p.startswith("/admin") for p in public["paths"])
    assert "/admin/keys" in whole["paths"]
    assert "/v1/chat/completions" in public["paths"]


def test_a_model_id_with_colons_is_read_not_taken_for_an_action() -> None:
    """Found by the schemathesis run: OpenAI's fine-tuned ids (ft:base:org::id) were taken
    for a generate-content action and answered 404 in Gemini's shape."""
    router = Router()
    found = router.match("GET", "/v1/models/ft:gpt-4o-mini:acme::a1b2")
    assert found is not None
    spec, model = found
    assert (spec.kind, spec.protocol, model) == ("model", "openai", "ft:gpt-4o-mini:acme::a1b2")
    found = router.match("POST", "/v1/models/gemini-small:generateContent")
    assert found is not None and found[0].action == "generateContent"
    import pytest

    from gateway.errors import UnknownURLError

    with pytest.raises(UnknownURLError):
        router.match("POST", "/v1/models/gemini-small:fly")
