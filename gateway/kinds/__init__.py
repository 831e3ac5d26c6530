"""The endpoint kinds, by the name the route table and usage records use."""

from __future__ import annotations

from typing import Any

from gateway.kinds.audio import TRANSCRIPTION
from gateway.kinds.base import Kind
from gateway.kinds.chat import ChatKind, CountKind
from gateway.kinds.embeddings import EmbeddingsKind
from gateway.kinds.media import IMAGES, RERANK, SPEECH

KINDS: dict[str, Kind[Any]] = {
    "chat": ChatKind(),
    "count_tokens": CountKind(),
    "embeddings": EmbeddingsKind(),
    "images": IMAGES,
    "rerank": RERANK,
    "audio_speech": SPEECH,
    "audio_transcription": TRANSCRIPTION,
}

__all__ = ["KINDS", "Kind"]
