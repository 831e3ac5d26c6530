"""Embeddings on a ``vertex`` channel: Google's embedding models through Vertex's ``:predict``.

Upstream side only (no client speaks it): ``{"instances": [{"content": text, "task_type"?}],
"parameters"?: {"outputDimensionality"}}`` to
``{root}/v1/projects/{project}/locations/{region}/publishers/google/models/{model}:predict``
(``predict_call`` puts a call there, ``gateway.kinds.wire.embeddings_call`` with the
channel's site), one instance per input, as google-genai with ``vertexai=True`` sends an
``embed_content``. The reply is ``{"predictions": [{"embeddings": {"values", "statistics":
{"token_count", "truncated"}}}]}``: each prediction's ``token_count`` summed is the usage
billed (when one lacks it, the reply has no usage and the gateway's estimate is billed).

Not carried: token-array ``input`` (Vertex embeds text: 400), a Gemini client's ``title``
(the internal shape has none), ``autoTruncate`` (Vertex's default, truncating, applies).
Errors are Google's, read by ``vertex.decode_error``.
"""

from __future__ import annotations

from typing import ClassVar

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols import vertex
from gateway.protocols.base import UpstreamCall, UpstreamTarget, count
from gateway.protocols.embeddings import (
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    check_order,
    vector,
)
from gateway.types import JSON

ACTION = "predict"
JSON_HEADERS = {"content-type": "application/json"}


def predict_call(call: UpstreamCall, site: vertex.VertexSite, model: str) -> UpstreamCall:
    """An embeddings call at its model's ``:predict`` in the channel's project."""
    return UpstreamCall(
        url=vertex.model_url(site, "google", model, ACTION),
        headers=vertex.vertex_headers(call.headers),
        body=call.body,
    )


class VertexEmbeddings:
    name: ClassVar[str] = "vertex"

    def embeddings_request(self, req: EmbeddingsRequest, target: UpstreamTarget) -> UpstreamCall:
        instances: list[JSON] = []
        for text in req["input"]:
            if not isinstance(text, str):
                raise InvalidRequestError("'input': a vertex channel takes text, not token arrays")
            instance: dict[str, JSON] = {"content": text}
            if "task_type" in req:
                instance["task_type"] = req["task_type"]
            instances.append(instance)
        body: dict[str, JSON] = {"instances": instances}
        if "dimensions" in req:
            body["parameters"] = {"outputDimensionality": req["dimensions"]}
        # addressed by ``predict_call``: the site (project, region) is the channel's
        url = f"{target.base_url.rstrip('/')}/publishers/google/models/{target.model}:{ACTION}"
        return UpstreamCall(url=url, headers=dict(JSON_HEADERS), body=orjson.dumps(body))

    def decode_embeddings_response(
        self, payload: JSON, req: EmbeddingsRequest
    ) -> EmbeddingsResponse:
        items = payload.get("predictions") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            raise UpstreamError("upstream sent a malformed embeddings reply (no 'predictions')")
        data: list[Embedding] = []
        tokens: int | None = 0
        for i, item in enumerate(items):
            embeddings = item.get("embeddings") if isinstance(item, dict) else None
            if not isinstance(embeddings, dict):
                raise UpstreamError(f"upstream sent a malformed prediction (predictions[{i}])")
            values = vector(embeddings.get("values"), f"predictions[{i}].embeddings.values")
            data.append({"index": i, "embedding": values})
            stats = embeddings.get("statistics")
            counted = stats.get("token_count") if isinstance(stats, dict) else None
            if tokens is not None and isinstance(counted, int | float) and counted >= 0:
                tokens += count(counted)
            else:
                tokens = None  # one without a count: the estimate is billed for all
        resp: EmbeddingsResponse = {"data": check_order(data, len(req["input"]))}
        if tokens is not None:
            resp["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return resp

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return vertex.decode_error(status, raw)


VERTEX_EMBEDDINGS = VertexEmbeddings()
