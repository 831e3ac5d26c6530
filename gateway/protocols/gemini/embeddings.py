"""The `gemini` protocol's embeddings: ``:embedContent`` and ``:batchEmbedContents``, both sides.

Client side: two paths, told apart by ``route.action``; the model comes from the path (a
``models/`` prefix dropped), never from the body.

- ``embedContent``: ``{"content": {"parts": [{"text"}]}, "taskType"?, "title"?,
  "outputDimensionality"?}`` -> one input (``single``); reply ``{"embedding": {"values"}}``.
- ``batchEmbedContents`` (what google-genai's ``embed_content`` calls on the Gemini API):
  ``{"requests": [{"model", "content", "taskType"?, "title"?, "outputDimensionality"?}]}``
  -> one input per request; reply ``{"embeddings": [{"values"}]}``.

A content is one input: the text of its parts joined with nothing between them (as
google-genai's ``.text`` joins a content's text parts). Keys may come in proto spelling
(``output_dimensionality``) as well as JSON spelling. A part other than text is refused (400):
no other upstream can embed it. The reply carries ``usageMetadata.promptTokenCount`` when the
upstream reported usage.

Upstream side: always ``{base_url}/v1beta/models/{model}:batchEmbedContents`` with
``x-goog-api-key``, one request per input. Gemini's reply usually carries no usage (newer
models may send ``usageMetadata.promptTokenCount``, read when present); without it the response
has none and the gateway estimates.

Passthrough (gemini client, gemini channel): the body goes to the client's own action with the
model renamed in the path, in each batch request's ``model`` and in a top-level ``model``; the
reply goes back unchanged, its ``usageMetadata`` read when present.

Not carried across (G>X: from a Gemini client toward an openai channel; X>G: the reverse):

| field                                   | dir | why                                        |
|-----------------------------------------|-----|--------------------------------------------|
| ``title``                               | G>X | OpenAI has no title                        |
| ``taskType``                            | G>X | OpenAI has no task types                   |
| per-request ``outputDimensionality``    | G>X | one ``dimensions`` per call: requests that |
|                                         |     | differ get 400                             |
| each batch request's ``model``          | G>X | the path names the model                   |
| token-array ``input``                   | X>G | Gemini embeds text only (400)              |
| ``user``, ``encoding_format``           | X>G | none; floats come back, encoded for the    |
|                                         |     | client as it asked                         |
"""

from __future__ import annotations

from typing import ClassVar

import orjson

from gateway.errors import GatewayError, InvalidRequestError, NotFoundError, UpstreamError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget, count
from gateway.protocols.embeddings import (
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    check_order,
    vector,
)
from gateway.protocols.gemini.dialect import json_fields
from gateway.protocols.gemini.reply import error_from_payload
from gateway.types import JSON

JSON_HEADERS = {"content-type": "application/json"}
SINGLE = "embedContent"
BATCH = "batchEmbedContents"
ACTIONS = (SINGLE, BATCH)


def _model_name(model: str | None) -> str:
    name = (model or "").removeprefix("models/")
    if not name:
        raise InvalidRequestError("the path must name a model")
    return name


def _text(content: JSON, what: str) -> str:
    """A content's text: its parts' texts joined. Non-text parts: 400."""
    content = json_fields(content, what)
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise InvalidRequestError(f"{what}.parts must be a non-empty array")
    texts: list[str] = []
    for i, part in enumerate(parts):
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str):
            raise InvalidRequestError(f"{what}.parts[{i}]: only text parts can be embedded")
        texts.append(text)
    return texts[0] if len(texts) == 1 else "".join(texts)


def _options(body: dict[str, JSON], what: str) -> tuple[str | None, int | None]:
    """An embed request's taskType and outputDimensionality, checked."""
    task_type = body.get("taskType")
    if task_type is not None and not isinstance(task_type, str):
        raise InvalidRequestError(f"{what}taskType must be a string")
    dimensions = body.get("outputDimensionality")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise InvalidRequestError(f"{what}outputDimensionality must be a positive integer")
    title = body.get("title")
    if title is not None and not isinstance(title, str):
        raise InvalidRequestError(f"{what}title must be a string")
    return task_type, dimensions


def _usage(payload: dict[str, JSON]) -> EmbeddingsUsage | None:
    meta = payload.get("usageMetadata")
    if not isinstance(meta, dict):
        return None
    prompt = count(meta.get("promptTokenCount"))
    return {"prompt_tokens": prompt, "total_tokens": count(meta.get("totalTokenCount")) or prompt}


def _url(base_url: str, model: str, action: str) -> str:
    return f"{base_url.rstrip('/')}/v1beta/models/{model}:{action}"


class GeminiEmbeddings:
    name: ClassVar[str] = "gemini"

    # client side -------------------------------------------------------------------------
    def match_embeddings(self, payload: JSON, route: RouteMatch) -> RouteMatch:
        if route.action not in ACTIONS:
            raise NotFoundError(f"unknown embeddings action {route.action!r}")
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        return RouteMatch(
            protocol=route.protocol,
            capability=route.capability,
            model=_model_name(route.model),
            stream=False,
            action=route.action,
        )

    def decode_embeddings(self, payload: JSON, route: RouteMatch) -> EmbeddingsRequest:
        payload = json_fields(payload, "the request body")
        model = _model_name(route.model)
        if route.action == SINGLE:
            if "content" not in payload:
                raise InvalidRequestError("content is required")
            task_type, dimensions = _options(payload, "")
            req: EmbeddingsRequest = {
                "model": model,
                "input": [_text(payload["content"], "content")],
                "single": True,
            }
        elif route.action == BATCH:
            requests = payload.get("requests")
            if not isinstance(requests, list) or not requests:
                raise InvalidRequestError("requests must be a non-empty array")
            texts: list[str] = []
            task_type = dimensions = None
            for i, item in enumerate(requests):
                what = f"requests[{i}]"
                item = json_fields(item, what)
                if "content" not in item:
                    raise InvalidRequestError(f"{what}.content is required")
                texts.append(_text(item["content"], f"{what}.content"))
                task, dims = _options(item, f"{what}.")
                if i == 0:
                    task_type, dimensions = task, dims
                elif dims != dimensions:
                    raise InvalidRequestError(
                        f"{what}.outputDimensionality must be the same in every request"
                    )
            req = {"model": model, "input": texts}
        else:
            raise NotFoundError(f"unknown embeddings action {route.action!r}")
        if task_type is not None:
            req["task_type"] = task_type
        if dimensions is not None:
            req["dimensions"] = dimensions
        return req

    def encode_embeddings(self, resp: EmbeddingsResponse, req: EmbeddingsRequest, ctx: Ctx) -> JSON:
        out: dict[str, JSON]
        if req.get("single"):
            if len(resp["data"]) != 1:
                raise UpstreamError(f"upstream sent {len(resp['data'])} embeddings for 1 input")
            out = {"embedding": {"values": resp["data"][0]["embedding"]}}
        else:
            out = {"embeddings": [{"values": item["embedding"]} for item in resp["data"]]}
        usage = resp.get("usage")
        if usage:
            out["usageMetadata"] = {"promptTokenCount": usage["prompt_tokens"]}
        return out

    # upstream side -----------------------------------------------------------------------
    def embeddings_request(self, req: EmbeddingsRequest, target: UpstreamTarget) -> UpstreamCall:
        model = f"models/{target.model}"
        options: dict[str, JSON] = {}
        if "dimensions" in req:
            options["outputDimensionality"] = req["dimensions"]
        if "task_type" in req:
            options["taskType"] = req["task_type"]
        requests: list[JSON] = []
        for text in req["input"]:
            if not isinstance(text, str):
                raise InvalidRequestError("'input': a gemini channel takes text, not token arrays")
            requests.append({"model": model, "content": {"parts": [{"text": text}]}, **options})
        return UpstreamCall(
            url=_url(target.base_url, target.model, BATCH),
            headers={**JSON_HEADERS, "x-goog-api-key": target.api_key},
            body=orjson.dumps({"requests": requests}),
        )

    def decode_embeddings_response(
        self, payload: JSON, req: EmbeddingsRequest
    ) -> EmbeddingsResponse:
        items = payload.get("embeddings") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            raise UpstreamError("upstream sent a malformed embeddings reply (no 'embeddings')")
        data: list[Embedding] = []
        for i, item in enumerate(items):
            values = item.get("values") if isinstance(item, dict) else None
            data.append({"index": i, "embedding": vector(values, f"embeddings[{i}].values")})
        resp: EmbeddingsResponse = {"data": check_order(data, len(req["input"]))}
        usage = _usage(payload)
        if usage is not None:
            resp["usage"] = usage
        return resp

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        try:
            payload = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            payload = None
        return error_from_payload(status, payload)

    # passthrough -------------------------------------------------------------------------
    def embeddings_passthrough(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        if route.action not in ACTIONS:
            raise NotFoundError(f"unknown embeddings action {route.action!r}")
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        model = f"models/{target.model}"
        if "model" in payload:
            payload["model"] = model
        requests = payload.get("requests")
        if isinstance(requests, list):
            payload["requests"] = [
                {**item, "model": model} if isinstance(item, dict) and "model" in item else item
                for item in requests
            ]
        return UpstreamCall(
            url=_url(target.base_url, target.model, route.action),
            headers={**JSON_HEADERS, "x-goog-api-key": target.api_key},
            body=orjson.dumps(payload),
        )

    def embeddings_passthrough_response(
        self, payload: JSON, ctx: Ctx
    ) -> tuple[JSON, EmbeddingsUsage | None]:
        # embedContent's one ``embedding``, batchEmbedContents' ``embeddings``
        if not isinstance(payload, dict) or not (
            isinstance(payload.get("embedding"), dict)
            or isinstance(payload.get("embeddings"), list)
        ):
            raise UpstreamError("upstream sent a malformed embeddings reply (no embeddings)")
        return payload, _usage(payload)


GEMINI_EMBEDDINGS = GeminiEmbeddings()
