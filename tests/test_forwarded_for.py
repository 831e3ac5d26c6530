"""Which address a request comes from, behind a proxy that appends a line of its own: every
X-Forwarded-For line counts, in order, and the right-most address that is not a trusted proxy
is the client's (a line the client wrote itself is never believed); Forwarded (RFC 7239)
``for=`` the same when there is no X-Forwarded-For. A key's ``allowed_ips`` and the usage
record's ``ip_range`` both follow it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from gateway.edge.asgi import forwarded_for, request_headers
from gateway.policy.billing import ClientAddress
from tests.plugins.servers import ADMIN_TOKEN, ServedGateway
from tests.test_key_limits import CHAT, make_key

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SPOOFED = "198.51.100.7"  # what the client wrote in front of the proxy
REAL = "203.0.113.9"  # what HAProxy's ``option forwardfor`` appends, on a line of its own


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"headers": list(headers)}


def test_every_forwarded_for_line_is_read_in_order() -> None:
    found = request_headers(
        scope(
            (b"x-forwarded-for", SPOOFED.encode()),
            (b"authorization", b"Bearer sk-first"),
            (b"x-forwarded-for", REAL.encode()),
            (b"authorization", b"Bearer sk-second"),
        )
    )
    assert found[b"x-forwarded-for"] == f"{SPOOFED}, {REAL}".encode()
    assert found[b"authorization"] == b"Bearer sk-first"  # other names: the first, as before
    one = request_headers(scope((b"x-forwarded-for", REAL.encode())))
    assert one[b"x-forwarded-for"] == REAL.encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"for=192.0.2.60;proto=http;by=203.0.113.43", b"192.0.2.60"),
        (b'for="[2001:db8:cafe::17]:4711"', b"2001:db8:cafe::17"),
        (b'for="192.0.2.43:47011", for=198.51.100.17', b"192.0.2.43, 198.51.100.17"),
        (b"For=_hidden, for=unknown, proto=https", b"_hidden, unknown, unknown"),
    ],
)
def test_forwarded_nodes_in_x_forwarded_for_s_form(value: bytes, expected: bytes) -> None:
    assert forwarded_for(value) == expected


def test_forwarded_lines_stand_in_only_without_x_forwarded_for() -> None:
    both = request_headers(
        scope(
            (b"forwarded", f"for={SPOOFED}".encode()),
            (b"forwarded", f"for={REAL}".encode()),
        )
    )
    assert both[b"x-forwarded-for"] == f"{SPOOFED}, {REAL}".encode()
    # a proxy that appends X-Forwarded-For: a Forwarded line the client wrote is not read
    xff = request_headers(
        scope((b"forwarded", f"for={SPOOFED}".encode()), (b"x-forwarded-for", REAL.encode()))
    )
    assert xff[b"x-forwarded-for"] == REAL.encode()


def test_the_right_most_untrusted_address_of_the_joined_lines() -> None:
    address = ClientAddress(["127.0.0.1/32", "10.0.0.0/8"])
    joined = request_headers(
        scope(
            (b"x-forwarded-for", SPOOFED.encode()),
            (b"x-forwarded-for", f"{REAL}, 10.1.1.1".encode()),  # and a second, inner proxy
        )
    )[b"x-forwarded-for"]
    assert address.of(("127.0.0.1", 1), joined) == REAL
    assert address.range_of(("127.0.0.1", 1), joined) == "203.0.113.0/24"


async def chat(gw: ServedGateway, key: str, headers: CIMultiDict[str]) -> int:
    headers.add("Authorization", f"Bearer {key}")
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.v1 + "/chat/completions", json=CHAT, headers=headers) as r:
            await r.read()
            return r.status


async def last_ip_range(gw: ServedGateway, key_id: str) -> str:
    await gw.state.writer.flush()
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/admin/usage?key={key_id}&limit=1", headers=ADMIN) as r:
            [record] = (await r.json())["data"]
            return str(record["ip_range"])


@pytest.mark.parametrize("name", ["X-Forwarded-For", "Forwarded"])
async def test_a_client_s_own_line_before_the_proxy_s_is_not_believed(
    gateway: ServedGateway, name: str
) -> None:
    """The gateway's peer (127.0.0.1) is a trusted proxy that appended the real address on a
    second line; the client's first line named an address inside the key's range."""

    def lines() -> CIMultiDict[str]:
        form = "for={}" if name == "Forwarded" else "{}"
        return CIMultiDict([(name, form.format(SPOOFED)), (name, form.format(REAL))])

    async with aiohttp.ClientSession() as s:
        fenced = await make_key(s, gateway, allowed_ips=["198.51.100.0/24"])
        free = await make_key(s, gateway)
    assert await chat(gateway, fenced["key"], lines()) == 403
    assert await chat(gateway, free["key"], lines()) == 200
    assert await last_ip_range(gateway, free["id"]) == "203.0.113.0/24"
    # one line, as most proxies write it, still reads the same
    one = CIMultiDict([("X-Forwarded-For", f"{SPOOFED}, {REAL}")])
    assert await chat(gateway, fenced["key"], one) == 403
