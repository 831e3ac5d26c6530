"""What a call costs and what is recorded of it (pure).

Prices in the catalogue are balance units per million tokens, which is exactly micro-units
per token; they are turned once into integer pico-units (1e-12 balance units) per token, per
call, per image, ... (``Rate``), so that a request's cost is integer arithmetic. Each class of
token has its own price (CONTRACT §6): fresh input (the prompt less its cache reads and writes)
at ``input``, cache reads at ``cache_read``, cache writes at ``cache_write`` (those written for
an hour, Anthropic's ``ttl: "1h"``, at ``cache_write_1h``: 2 times the input price where
5-minute writes cost 1.25 times), all output (reasoning included) at ``output``; a cache price
left unset is the input price times the price table's ratio for the model's upstream name,
else the input price, and for 1-hour writes the 5-minute write's (``cache_prices``, the one
place that decides it).

A request's cost is exact to the pico-unit and is never rounded to micro-units (``Charge``):
its usage record keeps the whole micro-units (``cost``) and the pico-units below them
(``cost_pico``, 0 to 999,999). Settlement debits the whole micro-units at once and carries
the pico-units per account in the store, debiting one micro-unit more each time the carry
reaches one (``store.Account.carry``). So a request with a non-zero price is never billed
0 (1 token at 0.01 per million costs 10,000 pico-units, kept on its record and in the
carry), and what an account is debited stays within one micro-unit of the exact sum of its
records' costs, however many requests it makes. A group's ``ratio`` multiplies the exact cost
in one place (``Rate.charge``).

The usage record holds call metadata only; the client IP is cut to its /24 (IPv4) or /48 (IPv6)
before it is kept.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from gateway.config import MAX_PRICE, Price
from gateway.policy.prices import TablePrice
from gateway.types import Usage

PICO_PER_MICRO = 1_000_000
PICO_PER_UNIT = PICO_PER_MICRO * 1_000_000  # pico-units in one balance unit
# the cache prices' fields, in ``cache_prices``' order
CACHE_PRICE_FIELDS = ("cache_read", "cache_write", "cache_write_1h")


@dataclass(slots=True)
class Metered:
    """What one request used, as the endpoint kind measures it: tokens where the upstream
    reports them; images, seconds of audio or characters spoken where it does not.

    ``prompt_tokens`` is every input token, cache reads and writes included;
    ``completion_tokens`` every output token, reasoning included: the classes are parts of
    them (``classified`` keeps them so), never more."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0
    audio_seconds: float = 0.0
    speech_chars: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_1h_tokens: int = 0  # of the cache writes, those written for an hour

    def classified(self) -> Metered:
        """Itself with its classes cut to fit: cache reads at most the prompt, cache writes
        at most what is left of it (1-hour writes at most the writes), reasoning at most the
        output (an upstream that reports more is broken: nothing is counted twice)."""
        prompt = self.prompt_tokens
        read = min(self.cache_read_tokens, prompt)
        self.cache_read_tokens = read
        write = min(self.cache_write_tokens, prompt - read)
        self.cache_write_tokens = write
        if self.cache_write_1h_tokens:
            self.cache_write_1h_tokens = min(self.cache_write_1h_tokens, write)
        self.reasoning_tokens = min(self.reasoning_tokens, self.completion_tokens)
        return self

    @property
    def fresh_input_tokens(self) -> int:
        """The prompt tokens neither read from nor written to a cache."""
        return self.prompt_tokens - self.cache_read_tokens - self.cache_write_tokens


def cache_prices(price: Price, row: TablePrice | None = None) -> tuple[float, float, float]:
    """The prices of cache reads, cache writes and 1-hour cache writes: the model's own;
    else (unset) its input price times the price table's ratio for its upstream model
    (``row``: Anthropic's writes cost 1.25 times its input, 1-hour writes 2 times, reads 0.1
    times); else its input price, and for 1-hour writes the writes' price (a provider with no
    such write bills none). The one place that decides the default."""
    ratios = (
        (None, None, None)
        if row is None
        else (row.ratio(row.cache_read), row.ratio(row.cache_write), row.ratio(row.cache_write_1h))
    )
    read = _cache_price(price.cache_read, price.input, ratios[0], price.input)
    write = _cache_price(price.cache_write, price.input, ratios[1], price.input)
    return read, write, _cache_price(price.cache_write_1h, price.input, ratios[2], write)


def _cache_price(own: float | None, input_price: float, ratio: float | None, other: float) -> float:
    """A cache price: the model's own, else its input price times the table's ``ratio``, else
    ``other``."""
    if own is not None:
        return own
    return other if ratio is None else input_price * ratio


def cache_price_map(price: Price, row: TablePrice | None = None) -> dict[str, float]:
    """``cache_prices`` by the names of the price fields (the console's model square and
    ``gateway prices diff`` show them)."""
    return dict(zip(CACHE_PRICE_FIELDS, cache_prices(price, row), strict=True))


def _pico(price: float, pico_per_priced: float) -> int:
    """A price as whole pico-units per thing priced; a price above 0 is at least 1 pico-unit
    (a price too small to count must not make a request free)."""
    if price <= 0:
        return 0
    return max(1, round(price * pico_per_priced))


@dataclass(frozen=True, slots=True)
class Charge:
    """What a request costs, exactly: ``micro`` whole micro-units and ``pico`` pico-units
    below them (0 to 999,999)."""

    micro: int
    pico: int

    @classmethod
    def of(cls, pico: int) -> Charge:
        micro, rest = divmod(pico, PICO_PER_MICRO)
        return cls(micro, rest)


FREE = Charge(0, 0)


@dataclass(frozen=True, slots=True)
class Rate:
    """A price in pico-units (1e-12 balance units): per token of each class, per call, per
    image, per second of audio, per character spoken."""

    input: int
    output: int
    request: int
    image: int = 0
    audio_second: int = 0
    speech_char: int = 0
    cache_read: int = 0  # ``from_price`` fills every field
    cache_write: int = 0
    cache_write_1h: int = 0

    @classmethod
    def from_price(cls, price: Price, row: TablePrice | None = None) -> Rate:
        """``row``: the price table's row for the model's upstream name (``Model.table``),
        whose ratios price the cache classes the model leaves unset."""
        per_token = PICO_PER_MICRO  # a price per million tokens is micro-units per token
        read, write, write_1h = cache_prices(price, row)
        return cls(
            input=_pico(price.input, per_token),
            output=_pico(price.output, per_token),
            request=_pico(price.request, PICO_PER_UNIT),
            image=_pico(price.image, PICO_PER_UNIT),
            audio_second=_pico(price.audio_second, PICO_PER_UNIT),
            speech_char=_pico(price.speech_char, per_token),  # per million characters
            cache_read=_pico(read, per_token),
            cache_write=_pico(write, per_token),
            cache_write_1h=_pico(write_1h, per_token),
        )

    def pico_of(self, used: Metered) -> int:
        """Pico-units for everything a request used, exactly: each class of token at its own
        price. With prices at most ``config.MAX_PRICE`` and quantities within the ``MAX_*``
        below, it stays under ``MAX_COST`` micro-units."""
        read, write = used.cache_read_tokens, used.cache_write_tokens
        pico = (
            (used.prompt_tokens - read - write) * self.input
            + read * self.cache_read
            + write * self.cache_write
            + used.completion_tokens * self.output
            + self.request
        )
        if used.cache_write_1h_tokens:  # Anthropic's alone: the writes' part at its own price
            pico += used.cache_write_1h_tokens * (self.cache_write_1h - self.cache_write)
        if used.images or used.speech_chars or used.audio_seconds:  # not chat's
            pico += used.images * self.image + used.speech_chars * self.speech_char
            pico += round(used.audio_seconds * self.audio_second)
        return pico

    def charge(self, used: Metered, ratio: Fraction | int = 1) -> Charge:
        """What a request that used ``used`` is billed, times ``ratio`` (its group's; the
        one place a ratio multiplies a cost), rounded half up to the pico-unit."""
        pico = self.pico_of(used)
        if ratio != 1:
            scaled = pico * ratio
            pico = math.floor(scaled + Fraction(1, 2))
        return Charge.of(pico)

    def cost_of(self, used: Metered) -> int:
        """Micro-units, rounded up: what a request expected to use this holds."""
        return -(-self.pico_of(used) // PICO_PER_MICRO)


# no request uses this many tokens; an upstream that reports more (or a negative count) is
# broken, and its number must neither credit an account nor overflow the store's integers
MAX_TOKENS = 2**31 - 1
# the same for what is billed where tokens do not apply: images in one reply, seconds of audio
# one transcription reports (11.5 days), characters one speech request holds
MAX_IMAGES = 10_000
MAX_AUDIO_SECONDS = 1_000_000
MAX_SPEECH_CHARS = MAX_TOKENS
# the most one request can cost, in micro-units (``Rate.charge``, at ratio 1)
MAX_COST = round(
    MAX_PRICE
    * (
        2 * MAX_TOKENS  # input (of any class) and output, per million tokens
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


def _detail(details: object, name: str) -> int:
    return billable_tokens(details.get(name)) if isinstance(details, dict) else 0


def usage_classes(usage: Usage | None) -> Metered:
    """The tokens of a chat-completions usage object by class: prompt (cache reads and writes
    included), completion (reasoning included), cache reads
    (``prompt_tokens_details.cached_tokens``), cache writes (``cache_creation_tokens``, the
    internal shape's field for Anthropic's; those written for an hour
    ``cache_creation_1h_tokens``), reasoning
    (``completion_tokens_details.reasoning_tokens``); each a plausible count
    (``billable_tokens``) and the classes cut to fit their totals (``Metered.classified``)."""
    if not usage or not isinstance(usage, dict):
        return Metered()
    write = billable_tokens(usage.get("cache_creation_tokens"))
    return Metered(
        prompt_tokens=billable_tokens(usage.get("prompt_tokens")),
        completion_tokens=billable_tokens(usage.get("completion_tokens")),
        cache_read_tokens=_detail(usage.get("prompt_tokens_details"), "cached_tokens"),
        cache_write_tokens=write,
        reasoning_tokens=_detail(usage.get("completion_tokens_details"), "reasoning_tokens"),
        cache_write_1h_tokens=(
            billable_tokens(usage.get("cache_creation_1h_tokens")) if write else 0
        ),
    ).classified()


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
    """The client's IP: the socket peer, or X-Forwarded-For when the peer is a trusted proxy
    (every line of it, joined in order, or Forwarded's ``for=`` nodes in its form when there
    is none: ``edge.asgi.request_headers``); of its addresses, the right-most that is not a
    trusted proxy itself, so that what a client wrote in front of a proxy's own is never
    believed.

    ``range_of`` is on the hot path: the standard library's address parsing costs tens of
    microseconds, so ranges are remembered per (peer, X-Forwarded-For) in memory only.
    """

    __slots__ = ("_trusted", "_ranges")

    def __init__(self, trusted_proxies: Sequence[str]) -> None:
        self._trusted = tuple(ipaddress.ip_network(n, strict=False) for n in trusted_proxies)
        self._ranges: dict[tuple[object, bytes | None], str] = {}

    def range_of(self, client: Sequence[object] | None, forwarded: bytes | None) -> str:
        """The client's /24 or /48 (see ``ip_range``), from the ASGI ``client`` and the
        X-Forwarded-For list (``edge.asgi.request_headers``)."""
        cache_key = (client[0] if client else None, forwarded)
        found = self._ranges.get(cache_key)
        if found is None:
            found = ip_range(self.of(client, forwarded))
            if len(self._ranges) >= RANGE_CACHE_SIZE:
                self._ranges.clear()
            self._ranges[cache_key] = found
        return found

    def from_proxy(self, client: Sequence[object] | None) -> bool:
        """Whether the socket peer is a trusted proxy, whose forwarded headers are believed
        (X-Forwarded-For here, X-Forwarded-Proto by the console's cookie)."""
        if not client or not self._trusted:
            return False
        return self._is_trusted(str(client[0]))

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
