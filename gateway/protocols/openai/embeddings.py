"""The `openai` protocol's embeddings: ``POST /v1/embeddings``, both sides.

Client side: ``input`` is a string, an array of strings, one token array (an array of
integers) or an array of token arrays; ``encoding_format`` is ``float`` (the default when
absent) or ``base64``; ``dimensions`` is a positive integer. The reply carries the model name
the client asked for, each vector as floats or, when the client asked ``base64``, as base64 of
little-endian float32 (what the official SDK asks for by default and decodes with
``numpy.frombuffer(..., dtype=float32)`` or ``array("f", ...)``). ``usage`` is the upstream's,
or zeros when it reported none (the relay may put its estimate into the response first).

Upstream side: ``{base_url}/embeddings`` with ``Authorization: Bearer``. A converted request
always asks for floats; a reply's vectors are read whether floats or base64 strings.

Passthrough (openai client, openai channel): the body goes through with only ``model``
renamed, ``encoding_format`` included (the upstream answers base64 itself); the reply goes
back with ``model`` renamed to the client's name.

Not carried toward a converted upstream: ``user`` (no equivalent elsewhere; it does go through
on the passthrough path).
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from typing import ClassVar

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols.base import (
    Ctx,
    RouteMatch,
    UpstreamCall,
    UpstreamTarget,
    count,
)
from gateway.protocols.embeddings import (
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    check_order,
    vector,
)
from gateway.protocols.openai.reply import decode_error
from gateway.types import JSON

ENCODING_FORMATS = ("float", "base64")
BIG_ENDIAN = sys.byteorder == "big"
INPUT_SHAPES = (
    "'input' must be a string, an array of strings, an array of integers "
    "or an array of integer arrays"
)


# --- vectors ---------------------------------------------------------------------------


def encode_float32(values: list[float]) -> str:
    """A vector as base64 of little-endian float32, the form the openai SDK decodes."""
    packed = array("f", values)
    if BIG_ENDIAN:
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def decode_float32(text: str) -> list[float]:
    """Base64 of little-endian float32 -> floats. UpstreamError when it is not that."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise UpstreamError("upstream sent an embedding that is not valid base64") from None
    if len(raw) % 4:
        raise UpstreamError("upstream sent a base64 embedding that is not float32 values")
    packed = array("f")
    packed.frombytes(raw)
    if BIG_ENDIAN:
        packed.byteswap()
    return packed.tolist()


# --- client body -----------------------------------------------------------------------


def _is_tokens(value: JSON) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def decode_input(value: JSON) -> list[str] | list[list[int]]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequestError(INPUT_SHAPES)
    if not value:
        raise InvalidRequestError("'input' must not be an empty array")
    first = value[0]
    if isinstance(first, str):
        if all(isinstance(t, str) for t in value):
            return value
    elif type(first) is int:
        if _is_tokens(value):
            return [value]
    elif isinstance(first, list):
        if all(_is_tokens(t) for t in value):
            return value
    raise InvalidRequestError(INPUT_SHAPES)


def _headers(target: UpstreamTarget) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    return headers


def _usage(value: JSON) -> EmbeddingsUsage | None:
    if not isinstance(value, dict):
        return None
    prompt = count(value.get("prompt_tokens"))
    return {"prompt_tokens": prompt, "total_tokens": count(value.get("total_tokens")) or prompt}


class OpenAIEmbeddings:
    name: ClassVar[str] = "openai"

    # client side -------------------------------------------------------------------------
    def match_embeddings(self, payload: JSON, route: RouteMatch) -> RouteMatch:
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' is required and must be a string")
        return RouteMatch(
            protocol=route.protocol,
            capability=route.capability,
            model=model,
            stream=False,
            action=route.action,
        )

    def decode_embeddings(self, payload: JSON, route: RouteMatch) -> EmbeddingsRequest:
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        model = route.model or payload.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' is required and must be a string")
        if "input" not in payload:
            raise InvalidRequestError("'input' is required")
        req: EmbeddingsRequest = {"model": model, "input": decode_input(payload["input"])}
        encoding = payload.get("encoding_format")
        if encoding is None:
            encoding = "float"
        elif encoding not in ENCODING_FORMATS:
            raise InvalidRequestError("'encoding_format' must be 'float' or 'base64'")
        req["encoding_format"] = encoding
        dimensions = payload.get("dimensions")
        if dimensions is not None:
            if type(dimensions) is not int or dimensions < 1:
                raise InvalidRequestError("'dimensions' must be a positive integer")
            req["dimensions"] = dimensions
        user = payload.get("user")
        if user is not None and not isinstance(user, str):
            raise InvalidRequestError("'user' must be a string")
        return req

    def encode_embeddings(self, resp: EmbeddingsResponse, req: EmbeddingsRequest, ctx: Ctx) -> JSON:
        as_base64 = req.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": item["index"],
                "embedding": encode_float32(item["embedding"]) if as_base64 else item["embedding"],
            }
            for item in resp["data"]
        ]
        usage = resp.get("usage")
        return {
            "object": "list",
            "data": data,
            "model": ctx.model,
            "usage": {
                "prompt_tokens": usage["prompt_tokens"] if usage else 0,
                "total_tokens": usage["total_tokens"] if usage else 0,
            },
        }

    # upstream side -----------------------------------------------------------------------
    def embeddings_request(self, req: EmbeddingsRequest, target: UpstreamTarget) -> UpstreamCall:
        body: dict[str, JSON] = {
            "model": target.model,
            "input": req["input"],
            "encoding_format": "float",
        }
        if "dimensions" in req:
            body["dimensions"] = req["dimensions"]
        return UpstreamCall(
            url=target.base_url + "/embeddings",
            headers=_headers(target),
            body=orjson.dumps(body),
        )

    def decode_embeddings_response(
        self, payload: JSON, req: EmbeddingsRequest
    ) -> EmbeddingsResponse:
        items = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            raise UpstreamError("upstream sent a malformed embeddings reply (no 'data')")
        data: list[Embedding] = []
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise UpstreamError(f"upstream sent a malformed embedding (data[{position}])")
            value = item.get("embedding")
            if isinstance(value, str):
                values = decode_float32(value)
            else:
                values = vector(value, f"data[{position}].embedding")
            index = item.get("index")
            data.append({"index": index if type(index) is int else position, "embedding": values})
        resp: EmbeddingsResponse = {"data": check_order(data, len(req["input"]))}
        usage = _usage(payload.get("usage"))
        if usage is not None:
            resp["usage"] = usage
        return resp

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return decode_error(status, raw)

    # passthrough -------------------------------------------------------------------------
    def embeddings_passthrough(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        payload["model"] = target.model
        return UpstreamCall(
            url=target.base_url + "/embeddings",
            headers=_headers(target),
            body=orjson.dumps(payload),
        )

    def embeddings_passthrough_response(
        self, payload: JSON, ctx: Ctx
    ) -> tuple[JSON, EmbeddingsUsage | None]:
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
            raise UpstreamError("upstream sent a malformed embeddings reply (no 'data')")
        if "model" in payload:
            payload["model"] = ctx.model
        return payload, _usage(payload.get("usage"))


OPENAI_EMBEDDINGS = OpenAIEmbeddings()
