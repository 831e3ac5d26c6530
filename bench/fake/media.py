"""Deterministic bodies for the non-chat endpoints: models, embeddings, images, audio, rerank.

Vectors come from a hash of the input (same text, same unit vector); audio is silence of a
length that follows the input; rerank scores are word overlap with the query.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

import orjson

OPENAI_MODELS = ("demo-chat", "demo-embed", "demo-image", "demo-whisper", "demo-tts", "demo-rerank")
ANTHROPIC_MODELS = ("claude-demo",)
GEMINI_MODELS = ("gemini-demo", "gemini-demo-embedding")
DEFAULT_DIMENSIONS = 256
CREATED = 1_700_000_000
# 1x1 transparent PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
SPEECH_CHARS_PER_SECOND = 15
SAMPLE_RATE = 24_000
# one silent MPEG-1 layer III frame: 128 kbit/s, 44.1 kHz, 417 bytes, 26 ms
MP3_FRAME = b"\xff\xfb\x90\x64" + bytes(413)
MP3_FRAMES_PER_SECOND = 38
AUDIO_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def vector(text: str, dimensions: int) -> list[float]:
    seed = hashlib.sha256(text.encode()).digest()
    raw = (seed * (dimensions * 2 // len(seed) + 1))[: dimensions * 2]
    values = [(raw[2 * i] * 256 + raw[2 * i + 1]) / 32768.0 - 1.0 for i in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        return [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]
    return []


def openai_models() -> bytes:
    data = [
        {"id": m, "object": "model", "created": CREATED, "owned_by": "fake"} for m in OPENAI_MODELS
    ]
    return orjson.dumps({"object": "list", "data": data})


def anthropic_models() -> bytes:
    data = [
        {
            "type": "model",
            "id": m,
            "display_name": m,
            "created_at": "2024-01-01T00:00:00Z",
        }
        for m in ANTHROPIC_MODELS
    ]
    return orjson.dumps(
        {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}
    )


def gemini_models() -> bytes:
    models = [
        {
            "name": f"models/{m}",
            "version": "001",
            "displayName": m,
            "description": "A model of the fake upstream.",
            "inputTokenLimit": 1_048_576,
            "outputTokenLimit": 8192,
            "supportedGenerationMethods": ["embedContent", "batchEmbedContents"]
            if "embedding" in m
            else ["generateContent", "countTokens"],
        }
        for m in GEMINI_MODELS
    ]
    return orjson.dumps({"models": models})


def embedding_texts(payload: dict[str, Any]) -> list[str]:
    return _inputs(payload.get("input"))


def openai_embeddings(payload: dict[str, Any]) -> bytes:
    texts = _inputs(payload.get("input"))
    dims = payload.get("dimensions")
    dims = dims if isinstance(dims, int) and dims > 0 else DEFAULT_DIMENSIONS
    as_base64 = payload.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(texts):
        values = vector(text, dims)
        embedding: Any = values
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{dims}f", *values)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    used = sum(tokens(t) for t in texts)
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": payload.get("model"),
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )


def gemini_content_text(content: Any) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ""
    return "\n".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def gemini_embedding(request: dict[str, Any]) -> dict[str, Any]:
    dims = request.get("outputDimensionality")
    dims = dims if isinstance(dims, int) and dims > 0 else DEFAULT_DIMENSIONS
    return {"values": vector(gemini_content_text(request.get("content")), dims)}


def images(payload: dict[str, Any], base_url: str, now: int) -> bytes:
    n = payload.get("n")
    n = n if isinstance(n, int) and 0 < n <= 10 else 1
    if payload.get("response_format") == "b64_json":
        item: dict[str, Any] = {"b64_json": base64.b64encode(PNG).decode()}
    else:
        item = {"url": f"{base_url}/files/image.png"}
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        item["revised_prompt"] = prompt
    return orjson.dumps({"created": now, "data": [dict(item) for _ in range(n)]})


def audio_seconds(raw: bytes) -> float:
    """A WAV file's own duration; anything else as 128 kbit/s audio."""
    if len(raw) >= 44 and raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        byte_rate: int = struct.unpack_from("<I", raw, 28)[0]
        if byte_rate:
            return round((len(raw) - 44) / byte_rate, 3)
    return round(len(raw) / 16_000, 3)


def transcription(text: str, seconds: float, response_format: str) -> tuple[bytes, str]:
    if response_format == "text":
        return text.encode(), "text/plain; charset=utf-8"
    if response_format in ("srt", "vtt"):
        end = _clock(seconds, "," if response_format == "srt" else ".")
        start = _clock(0.0, "," if response_format == "srt" else ".")
        if response_format == "srt":
            body = f"1\n{start} --> {end}\n{text}\n\n"
        else:
            body = f"WEBVTT\n\n{start} --> {end}\n{text}\n\n"
        return body.encode(), "text/plain; charset=utf-8"
    if response_format == "verbose_json":
        payload: dict[str, Any] = {
            "task": "transcribe",
            "language": "english",
            "duration": seconds,
            "text": text,
            "segments": [
                {"id": 0, "seek": 0, "start": 0.0, "end": seconds, "text": text, "tokens": []}
            ],
            "usage": {"type": "duration", "seconds": math.ceil(seconds)},
        }
    else:
        payload = {"text": text, "usage": {"type": "duration", "seconds": math.ceil(seconds)}}
    return orjson.dumps(payload), "application/json"


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def speech(text: str, response_format: str) -> tuple[bytes, str]:
    seconds = max(1, math.ceil(len(text) / SPEECH_CHARS_PER_SECOND))
    content_type = AUDIO_TYPES.get(response_format, "audio/mpeg")
    if response_format in ("wav", "pcm"):
        pcm = bytes(SAMPLE_RATE * 2 * seconds)
        if response_format == "pcm":
            return pcm, content_type
        header = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
        header += struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
        return header + b"data" + struct.pack("<I", len(pcm)) + pcm, content_type
    return MP3_FRAME * (MP3_FRAMES_PER_SECOND * seconds), content_type


def rerank(payload: dict[str, Any], request_id: str) -> bytes:
    query = payload.get("query")
    query_words = set(str(query or "").lower().split())
    docs = payload.get("documents")
    texts = []
    for doc in docs if isinstance(docs, list) else []:
        if isinstance(doc, dict):
            doc = doc.get("text", "")
        texts.append(str(doc))
    scored = []
    for i, text in enumerate(texts):
        words = set(text.lower().split())
        overlap = len(query_words & words) / len(query_words) if query_words else 0.0
        scored.append((round(overlap * 0.9 + 0.1 / (i + 2), 6), i))
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    top_n = payload.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        scored = scored[:top_n]
    with_docs = bool(payload.get("return_documents"))
    results = []
    for score, i in scored:
        item: dict[str, Any] = {"index": i, "relevance_score": score}
        if with_docs:
            item["document"] = {"text": texts[i]}
        results.append(item)
    used = tokens(str(query or "")) + sum(tokens(t) for t in texts)
    return orjson.dumps(
        {
            "id": request_id,
            "model": payload.get("model"),
            "results": results,
            "usage": {"total_tokens": used},
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        }
    )
