"""The fixture trees (tests/fixtures/README.md): where a case's inputs are and what it says.

A tree (``conversion``, ``embeddings``) holds its cases under ``<client>__<upstream>/<case>/``
and their inputs once per protocol: the client's bodies under ``requests/<client>/``, the
upstream's replies and errors under ``replies/<protocol>/`` (a protocol the channel speaks). A
case's ``case.json`` names the inputs it takes, by their path in the tree, beside the facts of
its request and channel; its golden files (what the gateway writes) sit in its directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.config import Channel, parse_channel

FIXTURES = Path(__file__).parent / "fixtures"
CONVERSION_TREE = FIXTURES / "conversion"
EMBEDDINGS_TREE = FIXTURES / "embeddings"
MANIFEST = "case.json"
# the manifest's keys that name an input, and where in the tree that input lives
INPUT_DIRS = {"request": "requests", "upstream_response": "replies", "upstream_error": "replies"}


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def case_dirs(tree: Path) -> list[Path]:
    """Every case of a tree, pair by pair, in name order."""
    return [
        case
        for pair in sorted(p for p in tree.iterdir() if "__" in p.name)
        for case in sorted(p for p in pair.iterdir() if p.is_dir())
    ]


def channel(channel_type: str, base_url: str, entry: dict[str, Any] | None = None) -> Channel:
    """A test channel, read as the config reads a ``channels[]`` entry (so ``responses: true``
    means what it means there)."""
    fields = {
        "name": "test",
        "type": channel_type,
        "base_url": base_url,
        "api_key": "up-key",
        "models": ["test-model"],
        **(entry or {}),
    }
    return parse_channel(fields, "channel", {"default"}, {"test-model"})


class FixtureCase:
    """One case directory: its manifest, and the input files it names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = path.parent.parent
        self.pair = path.parent.name
        self.id = f"{self.pair}/{path.name}"
        self.client, self.upstream = self.pair.split("__")
        self.manifest: dict[str, Any] = load(path / MANIFEST)

    def input(self, key: str) -> Path | None:
        """The file the manifest names under ``key`` (``request``, ``upstream_response``,
        ``upstream_error``), or None when it names none."""
        name = self.manifest.get(key)
        return None if name is None else self.tree / name

    def channel(self, base_url: str) -> Channel:
        """The channel the case's upstream is: its type, and what the manifest's ``channel``
        adds (``responses: true``)."""
        return channel(self.upstream, base_url, self.manifest.get("channel", {}))

    @property
    def meta(self) -> dict[str, Any]:
        """What the manifest says besides the inputs it names."""
        return {k: v for k, v in self.manifest.items() if k not in INPUT_DIRS}

    @property
    def request(self) -> Any:
        path = self.input("request")
        assert path is not None, f"{self.id}: no request"
        return load(path)

    @property
    def upstream_error(self) -> Any:
        """The upstream's error (``{status, body}``), None when it answers with a reply."""
        path = self.input("upstream_error")
        return None if path is None else load(path)

    def has_reply(self, suffix: str) -> bool:
        """Whether the upstream answers with a ``suffix`` file (``.json`` whole, ``.sse`` a
        stream)."""
        path = self.input("upstream_response")
        return path is not None and path.suffix == suffix

    def reply(self, suffix: str) -> Path:
        """The upstream's reply, a ``suffix`` file."""
        path = self.input("upstream_response")
        assert path is not None and path.suffix == suffix, f"{self.id}: no {suffix} reply"
        return path

    @property
    def reply_protocol(self) -> str:
        """The protocol the upstream answers in: its reply's directory (a channel answers in
        a protocol it speaks, its type's or, with ``responses: true``, the Responses API)."""
        path = self.input("upstream_response") or self.input("upstream_error")
        assert path is not None, f"{self.id}: no reply"
        return path.parent.name

    def misplaced_inputs(self) -> list[str]:
        """The inputs named outside their protocol's directory, or missing: the request under
        its client's protocol, the reply under one its channel speaks."""
        speaks = self.channel("http://upstream.test").speaks
        out = []
        for key, folder in INPUT_DIRS.items():
            path = self.input(key)
            if path is None:
                continue
            protocols = {self.client} if key == "request" else speaks
            placed = path.parent.parent == self.tree / folder and path.parent.name in protocols
            if not placed or not path.is_file():
                out.append(f"{key}: {self.manifest[key]}")
        return out


def shared_inputs(tree: Path) -> set[Path]:
    """Every input file of a tree."""
    return {p for folder in set(INPUT_DIRS.values()) for p in (tree / folder).glob("*/*")}


def used_inputs(tree: Path) -> set[Path]:
    """The input files the tree's cases name."""
    out = set()
    for path in case_dirs(tree):
        case = FixtureCase(path)
        out |= {p for key in INPUT_DIRS if (p := case.input(key)) is not None}
    return out
