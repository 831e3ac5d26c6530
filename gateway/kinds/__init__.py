"""The endpoint kinds, by the name the route table uses; a kind's ``name`` is its usage
records' ``endpoint`` (``rerank_v2``, Cohere's shape of the request, is recorded as rerank)."""

from __future__ import annotations

from typing import Any

from gateway.kinds.audio import TRANSCRIPTION, TRANSLATION
from gateway.kinds.base import Kind
from gateway.kinds.chat import ChatKind, CountKind
from gateway.kinds.completions import COMPLETIONS
from gateway.kinds.embeddings import EmbeddingsKind
from gateway.kinds.media import IMAGES, RERANK, SPEECH

KINDS: dict[str, Kind[Any]] = {
    "chat": ChatKind(),
    "count_tokens": CountKind(),
    "embeddings": EmbeddingsKind(),
    "images": IMAGES,
    "rerank": RERANK,
    "rerank_v2": RERANK,
    "audio_speech": SPEECH,
    "audio_transcription": TRANSCRIPTION,
    "audio_translation": TRANSLATION,
    "completions": COMPLETIONS,
}

__all__ = ["KINDS", "Kind"]
