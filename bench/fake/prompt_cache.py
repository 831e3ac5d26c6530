"""The providers' prompt caches, as the fake reports them in its usage.

A chat request's prompt is read as a sequence of units in the provider's prefix order, each
with its share of the fake's token estimate (``incoming.Counter``: tool definitions weigh
nothing, as in ``Incoming.prompt_tokens``), and each unit boundary named by a hash chained
over the units before it. The cache holds the hashes of prefixes seen, per upstream
credential and model (a real provider's cache is per organisation or account and model), in
memory, the least recently used dropped past ``MAX_ENTRIES``; entries do not expire.

- Anthropic's Messages API (``/v1/messages``, Bedrock's invoke, Vertex's rawPredict): tools,
  system, then each message's blocks, a block marked ``cache_control`` a breakpoint. Each
  breakpoint looks for the longest cached prefix among the 20 block boundaries ending at it
  (Anthropic's lookback): that is read (``cache_read_input_tokens``); the prefix up to the last
  breakpoint past it is written (``cache_creation_input_tokens``) and kept, the part up to the
  last breakpoint marked ``ttl: "1h"`` written for an hour (``cache_creation``'s
  ``ephemeral_1h_input_tokens``: Anthropic takes 1-hour breakpoints before 5-minute ones; the
  cache keeps both alike). Bedrock Converse
  does the same with its ``cachePoint`` blocks, which mark the block before them.
- OpenAI (chat completions, Responses) and Gemini cache without marks: a prompt's prefixes
  are kept at every message boundary, and a later prompt reads its longest kept prefix
  (OpenAI: ``prompt_tokens_details.cached_tokens`` in steps of 128 tokens; Gemini:
  ``cachedContentTokenCount``, its implicit caching). Nothing is reported as written.

A prefix shorter than ``MIN_TOKENS`` is never cached (the providers' minimum, 1024 tokens for
most models), so a short prompt, or one sent once, reports no cache at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from bench.fake.incoming import Counter, Incoming, anthropic_blocks, gemini_parts, openai_message
from bench.fake.reply import Reply
from bench.fake.responses import chat_messages
from bench.fake.routes import Route

MIN_TOKENS = 1024
OPENAI_STEP = 128  # OpenAI reports cache hits in increments of 128 tokens past the minimum
LOOKBACK = 20  # block boundaries an Anthropic breakpoint looks back over for a hit
MAX_ENTRIES = 65536
IMAGE_CHARS = 4 * 85  # an image part, in the estimate's characters
MARKED = {"anthropic", "converse"}  # the shapes whose caching needs marks
# the shape of a chat request by the fake's (protocol, endpoint kind)
SHAPES = {
    ("anthropic", "messages"): "anthropic",
    ("anthropic", "rawPredict"): "anthropic",
    ("anthropic", "streamRawPredict"): "anthropic",
    ("bedrock", "invoke"): "anthropic",
    ("bedrock", "invoke-with-response-stream"): "anthropic",
    ("bedrock", "converse"): "converse",
    ("bedrock", "converse-stream"): "converse",
    ("openai", "chat"): "openai",
    ("openai", "responses"): "responses",
    ("gemini", "generateContent"): "gemini",
    ("gemini", "streamGenerateContent"): "gemini",
}
CREDENTIAL_HEADERS = ("x-api-key", "api-key", "x-goog-api-key")


@dataclass(frozen=True, slots=True)
class CacheUse:
    """Prompt tokens read from the cache and written to it by one request."""

    read: int = 0
    written: int = 0
    written_1h: int = 0  # of the writes, those up to a breakpoint of an hour


@dataclass(frozen=True, slots=True)
class Unit:
    digest: bytes  # the hash of the prefix ending with this unit
    tokens: int  # the prefix's share of the token estimate
    marked: bool  # a breakpoint (the marked shapes)
    hour: bool = False  # a breakpoint whose entry lasts an hour (Anthropic's ttl "1h")


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _chain(scope: bytes, parts: Iterable[tuple[Any, int, bool | str]]) -> list[Unit]:
    """(what a unit is, its weight in characters, marked: a bool, or a breakpoint's lifetime
    "5m" / "1h", "" for none) -> the units with their prefix hashes and cumulative tokens
    (characters / 4, as the estimate counts)."""
    digest = hashlib.sha256(scope).digest()
    chars = 0
    units: list[Unit] = []
    for value, weight, marked in parts:
        digest = hashlib.sha256(digest + _canonical(value)).digest()
        chars += weight
        units.append(Unit(digest, chars // 4, bool(marked), marked == "1h"))
    return units


def _weigh(count: Counter) -> int:
    return count.chars + IMAGE_CHARS * len(count.images)


def _lifetime(block: dict[str, Any]) -> str:
    """A block's breakpoint: "" (none), "5m" or "1h" (its ``cache_control``'s ``ttl``)."""
    mark = block.get("cache_control")
    if mark is None:
        return ""
    return "1h" if isinstance(mark, dict) and mark.get("ttl") == "1h" else "5m"


def _anthropic_parts(body: Mapping[str, Any]) -> Iterator[tuple[Any, int, str]]:
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            yield ("tool", _unmarked(tool)), 0, _lifetime(tool)
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    for block in system if isinstance(system, list) else ():
        if isinstance(block, dict):
            count = Counter()
            anthropic_blocks([block], count, None)
            yield ("system", _unmarked(block)), _weigh(count), _lifetime(block)
    for msg in body.get("messages") or ():
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict):
                count = Counter()
                anthropic_blocks([block], count, None)
                yield (msg.get("role"), _unmarked(block)), _weigh(count), _lifetime(block)


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    """The block without its mark: moving a breakpoint changes no prefix."""
    if "cache_control" not in block:
        return block
    return {k: v for k, v in block.items() if k != "cache_control"}


def _converse_weight(block: dict[str, Any]) -> int:
    if isinstance(block.get("text"), str):
        return len(block["text"])
    if "image" in block:
        return IMAGE_CHARS
    for key in ("toolUse", "toolResult", "reasoningContent"):
        if key in block:
            return len(_canonical(block[key]))
    return 0


def _converse_parts(body: Mapping[str, Any]) -> Iterator[tuple[Any, int, bool]]:
    """Converse: a ``cachePoint`` block marks the unit before it."""
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    sections: list[tuple[str, Any]] = [("tool", tools), ("system", body.get("system"))]
    for msg in body.get("messages") or ():
        if isinstance(msg, dict):
            sections.append((str(msg.get("role")), msg.get("content")))
    pending: tuple[Any, int] | None = None
    for section, blocks in sections:
        for block in blocks if isinstance(blocks, list) else ():
            if not isinstance(block, dict):
                continue
            if "cachePoint" in block:
                if pending is not None:
                    yield pending[0], pending[1], True
                    pending = None
                continue
            if pending is not None:
                yield pending[0], pending[1], False
            weight = 0 if section == "tool" else _converse_weight(block)
            pending = ((section, block), weight)
    if pending is not None:
        yield pending[0], pending[1], False


def _openai_parts(messages: Any, tools: Any) -> Iterator[tuple[Any, int, bool]]:
    for tool in tools if isinstance(tools, list) else ():
        yield ("tool", tool), 0, False
    for msg in messages if isinstance(messages, list) else ():
        if isinstance(msg, dict):
            count = Counter()
            openai_message(msg, count)
            yield msg, _weigh(count), False


def _gemini_parts(body: Mapping[str, Any]) -> Iterator[tuple[Any, int, bool]]:
    system = body.get("systemInstruction") or body.get("system_instruction")
    if system is not None:
        count = Counter()
        gemini_parts(system, count, None)
        yield ("system", system), _weigh(count), False
    for tool in body.get("tools") or ():
        yield ("tool", tool), 0, False
    for content in body.get("contents") or ():
        count = Counter()
        gemini_parts(content, count, None)
        yield content, _weigh(count), False


def units(shape: str, body: Mapping[str, Any], scope: bytes) -> list[Unit]:
    """The prompt's units in the provider's prefix order (``shape``: anthropic, converse,
    openai, responses or gemini)."""
    if shape == "anthropic":
        return _chain(scope, _anthropic_parts(body))
    if shape == "converse":
        return _chain(scope, _converse_parts(body))
    if shape == "gemini":
        return _chain(scope, _gemini_parts(body))
    if shape == "responses":
        return _chain(scope, _openai_parts(chat_messages(dict(body)), body.get("tools")))
    return _chain(scope, _openai_parts(body.get("messages"), body.get("tools")))


def credential(headers: Mapping[str, str], query: Mapping[str, str], path: str) -> str:
    """Whose cache a request reads: its API key, its AWS access key, or (Vertex, whose
    tokens are renewed) its project and region; hashed, never kept as it came."""
    name = next((headers[h] for h in CREDENTIAL_HEADERS if headers.get(h)), "")
    auth = headers.get("Authorization", "")
    if not name and "Credential=" in auth:
        access, _, rest = auth.partition("Credential=")[2].partition("/")
        name = access + "/" + rest.split("/")[1] if rest.count("/") >= 2 else access
    if not name and "/projects/" in path:
        name = path.partition("/publishers/")[0]
    if not name:
        name = auth or query.get("key", "")
    return hashlib.sha256(name.encode()).hexdigest()


class PromptCache:
    """The prefixes seen, per credential and model; ``use`` answers and remembers one
    request."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def _hit(self, digest: bytes) -> bool:
        if digest in self._seen:
            self._seen.move_to_end(digest)
            return True
        return False

    def _keep(self, digest: bytes) -> None:
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)

    def use(self, shape: str, body: Mapping[str, Any], scope: str) -> CacheUse:
        """What the request reads and writes; ``scope`` names the credential and model."""
        chain = units(shape, body, scope.encode())
        if shape in MARKED:
            return self._marked(chain)
        return self._automatic(chain, step=OPENAI_STEP if shape in ("openai", "responses") else 1)

    def _marked(self, chain: list[Unit]) -> CacheUse:
        marks = [i for i, u in enumerate(chain) if u.marked and u.tokens >= MIN_TOKENS]
        read = 0
        for i in marks:
            for j in range(i, max(-1, i - LOOKBACK), -1):
                if chain[j].tokens > read and self._hit(chain[j].digest):
                    read = chain[j].tokens
                    break
        written = chain[marks[-1]].tokens - read if marks else 0
        hours = [i for i in marks if chain[i].hour]
        written_1h = chain[hours[-1]].tokens - read if hours else 0
        for i in marks:
            if chain[i].tokens > read:
                self._keep(chain[i].digest)
        return CacheUse(read, max(0, written), max(0, written_1h))

    def _automatic(self, chain: list[Unit], step: int) -> CacheUse:
        read = 0
        for unit in reversed(chain):
            if unit.tokens < MIN_TOKENS:
                break
            if self._hit(unit.digest):
                read = MIN_TOKENS + (unit.tokens - MIN_TOKENS) // step * step
                break
        for unit in chain:
            if unit.tokens >= MIN_TOKENS:
                self._keep(unit.digest)
        return CacheUse(read, 0)


def with_cache(
    cache: PromptCache | None,
    request: web.Request,
    where: Route,
    body: Mapping[str, Any],
    reply: Reply,
    incoming: Incoming,
) -> Reply:
    """The reply with the cache's reads and writes for this chat request, unless the reply
    scripts its own token counts or the prompt is too short to cache."""
    shape = SHAPES.get((where.protocol, where.kind or ""))
    if (
        cache is None
        or shape is None
        or reply.prompt_tokens is not None
        or reply.cached_tokens is not None
        or incoming.prompt_tokens < MIN_TOKENS
    ):
        return reply
    who = credential(request.headers, request.query, request.path)
    scope = f"{who}:{where.model or body.get('model')}"
    use = cache.use(shape, body, scope)
    if not use.read and not use.written:
        return reply
    return dataclasses.replace(
        reply,
        cached_tokens=use.read,
        cache_write_tokens=use.written,
        cache_write_1h_tokens=use.written_1h,
    )
