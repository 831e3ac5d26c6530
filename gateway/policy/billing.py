"""What a call costs and what is recorded of it (pure).

Prices in the catalogue are balance units per million tokens, which is exactly micro-units
per token; they are turned once into integer pico-units per token so that a request's cost is
integer arithmetic, rounded half up to micro-units once per request. The usage record holds
call metadata only; the client IP is cut to its /24 (IPv4) or /48 (IPv6) before it is kept.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config import MAX_PRICE, Price
from gateway.types import Usage

PICO_PER_MICRO = 1_000_000


@dataclass(slots=True)
class Metered:
    """What one request used, as the endpoint kind measures it: tokens where the upstream
    reports them; images, seconds of audio or characters spoken where it does not."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0
    audio_seconds: float = 0.0
    speech_chars: int = 0


@dataclass(frozen=True, slots=True)
class Rate:
    """A price in pico-units (1e-12 balance units): per token, per call, per image, per
    second of audio, per character spoken."""

    input: int
    output: int
    request: int
    image: int = 0
    audio_second: int = 0
    speech_char: int = 0

    @classmethod
    def from_price(cls, price: Price) -> Rate:
        per_unit = PICO_PER_MICRO * 1_000_000  # pico-units in one balance unit
        return cls(
            input=round(price.input * PICO_PER_MICRO),
            output=round(price.output * PICO_PER_MICRO),
            request=round(price.request * per_unit),
            image=round(price.image * per_unit),
            audio_second=round(price.audio_second * per_unit),
            speech_char=round(price.speech_char * PICO_PER_MICRO),  # per million characters
        )

    def cost(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Micro-units, rounded half up."""
        pico = prompt_tokens * self.input + completion_tokens * self.output + self.request
        return (pico + PICO_PER_MICRO // 2) // PICO_PER_MICRO

    def cost_of(self, used: Metered) -> int:
        """Micro-units for everything a request used, rounded half up once. With prices at
        most ``config.MAX_PRICE`` and quantities within the ``MAX_*`` below, it stays under
        2**60: a 64-bit integer in every store, with room for sums."""
        pico = used.prompt_tokens * self.input + used.completion_tokens * self.output + self.request
        if used.images or used.speech_chars or used.audio_seconds:  # not chat's
            pico += used.images * self.image + used.speech_chars * self.speech_char
            pico += round(used.audio_seconds * self.audio_second)
        return (pico + PICO_PER_MICRO // 2) // PICO_PER_MICRO


# no request uses this many tokens; an upstream that reports more (or a negative count) is
# broken, and its number must neither credit an account nor overflow the store's integers
MAX_TOKENS = 2**31 - 1
# the same for what is billed where tokens do not apply: images in one reply, seconds of audio
# one transcription reports (11.5 days), characters one speech request holds
MAX_IMAGES = 10_000
MAX_AUDIO_SECONDS = 1_000_000
MAX_SPEECH_CHARS = MAX_TOKENS
# the most one request can cost, in micro-units (``Rate.cost_of``)
MAX_COST = round(
    MAX_PRICE
    * (
        2 * MAX_TOKENS  # input and output, per million tokens
        + (1 + MAX_IMAGES + MAX_AUDIO_SECONDS) * 1_000_000  # per call, image, second
        + MAX_SPEECH_CHARS  # per million characters
    )
)


def billable_tokens(count: object) -> int:
    """A token count as the upstream reported it, if it is one; 0 for anything else (missing,
    text, a bool, NaN, negative, or over ``MAX_TOKENS``). A float is cut to its whole part, as
    the protocol adapters read it (``protocols.base.count``): JSON's ``12.0`` is 12 tokens."""
    if type(count) is int:  # first: what every upstream sends
        return count if 0 <= count <= MAX_TOKENS else 0
    if type(count) is float and math.isfinite(count):
        return billable_tokens(int(count))
    return 0


def billable_seconds(seconds: object) -> float:
    """Seconds of audio as the upstream reported them, if they are a plausible number; 0 for
    anything else (missing, text, a bool, NaN, negative, or over ``MAX_AUDIO_SECONDS``)."""
    if type(seconds) is int:  # before float(): an int past a double's range cannot convert
        return float(seconds) if 0 <= seconds <= MAX_AUDIO_SECONDS else 0.0
    if type(seconds) is float and 0.0 <= seconds <= MAX_AUDIO_SECONDS:  # NaN compares False
        return seconds
    return 0.0


def usage_tokens(usage: Usage | None) -> tuple[int, int]:
    """(prompt, completion) tokens of a chat-completions usage object; 0 where missing or
    not a plausible count (``billable_tokens``); a pass-through's usage is the upstream's, of
    any JSON type."""
    if not usage or not isinstance(usage, dict):
        return 0, 0
    return billable_tokens(usage.get("prompt_tokens")), billable_tokens(
        usage.get("completion_tokens")
    )


def ip_range(ip: str | None) -> str:
    """a.b.c.0/24 for IPv4, the /48 for IPv6; "" when unknown."""
    if not ip:
        return ""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    prefix = 24 if addr.version == 4 else 48
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


RANGE_CACHE_SIZE = 4096


class ClientAddress:
    """The client's IP: the socket peer, or X-Forwarded-For when the peer is a trusted proxy.

    ``range_of`` is on the hot path: the standard library's address parsing costs tens of
    microseconds, so ranges are remembered per (peer, X-Forwarded-For) in memory only.
    """

    __slots__ = ("_trusted", "_ranges")

    def __init__(self, trusted_proxies: Sequence[str]) -> None:
        self._trusted = tuple(ipaddress.ip_network(n, strict=False) for n in trusted_proxies)
        self._ranges: dict[tuple[object, bytes | None], str] = {}

    def range_of(self, client: Sequence[object] | None, forwarded: bytes | None) -> str:
        """The client's /24 or /48 (see ``ip_range``), from the ASGI ``client`` and the first
        X-Forwarded-For header."""
        cache_key = (client[0] if client else None, forwarded)
        found = self._ranges.get(cache_key)
        if found is None:
            found = ip_range(self.of(client, forwarded))
            if len(self._ranges) >= RANGE_CACHE_SIZE:
                self._ranges.clear()
            self._ranges[cache_key] = found
        return found

    def _is_trusted(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self._trusted)

    def of(self, client: Sequence[object] | None, forwarded: bytes | None) -> str | None:
        peer: str | None = str(client[0]) if client else None
        if peer is None or not self._trusted or not self._is_trusted(peer):
            return peer
        if forwarded is None:
            return peer
        # the right-most address not itself a trusted proxy is the client
        hops = [h.strip() for h in forwarded.decode("latin-1").split(",") if h.strip()]
        for hop in reversed(hops):
            if not self._is_trusted(hop):
                return hop
        return hops[0] if hops else peer
