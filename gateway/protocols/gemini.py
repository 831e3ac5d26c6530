"""The Gemini generateContent protocol, both sides: client paths and gemini-type channels.

Client side: ``/v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent``,
``:countTokens``, the same under ``/v1``); the model comes from the path, never the body.
Upstream side: ``{base_url}/v1beta/models/{model}:generateContent`` or
``:streamGenerateContent?alt=sse``, ``x-goog-api-key``. This module owns the adapter and
reply conversion; request conversion lives in ``gemini_request``, streams in ``gemini_stream``.

Mapping choices:
- systemInstruction <-> system messages (system/developer messages anywhere in the list go to
  systemInstruction); role model <-> assistant; consecutive contents of one role are merged.
- functionCall/functionResponse <-> tool_calls/tool messages. Gemini has no call ids: client
  histories get ``call_{n}`` ids, paired to functionResponse parts by ``id`` when present, else
  by name in order; replies get ``call_{request or response id}_{n}``. A functionCall ``id``
  sent by the newer API is kept. Toward the upstream, ids are left out and a tool message
  finds its function name from the assistant tool call with the same id.
- A tool message's content goes into functionResponse.response as is when it is a JSON
  object, else as ``{"result": <text>}``; functionResponse.response comes back as its JSON.
- Schemas toward Gemini (function parameters, responseSchema) are reduced to the OpenAPI
  subset Gemini accepts: keys such as additionalProperties, $schema, $id, strict, examples,
  exclusiveMinimum are dropped, ``type: [t, "null"]`` becomes ``nullable``, ``const`` becomes
  a one-value ``enum``, ``oneOf`` becomes ``anyOf``. A schema using ``$ref`` cannot be reduced,
  so it is sent unchanged as parametersJsonSchema / responseJsonSchema.
- tool_choice: auto <-> AUTO, none <-> NONE, required <-> ANY, a named function <-> ANY with
  one allowedFunctionNames; ANY with several names -> required with the tools narrowed to them.
- reasoning_effort <-> thinkingConfig: none = budget 0; minimal 512, low 1024, medium 8192,
  high 24576 tokens, always with includeThoughts; back: 0 -> none, -1 (dynamic) -> medium,
  <=1024 -> low, <=8192 -> medium, else high; thinkingLevel is taken by name.
- Thought parts <-> reasoning_content. thoughtSignature on a functionCall part <-> the tool
  call's thought_signature; on a text or thought part <-> reasoning_signature, written back on
  the thought part (or the last text part, or the first functionCall without its own).
- 402 is rendered FAILED_PRECONDITION and 413 INVALID_ARGUMENT (see ``gemini_stream``).

Not carried across (dropped on purpose; none has a field or equivalent on the other side).
Direction: G>X from a Gemini client toward another upstream; X>G from another client toward a
Gemini upstream; >G in replies shown to a Gemini client; G> in Gemini replies shown elsewhere.

| Field                                                                           | Dir  |
|---------------------------------------------------------------------------------|------|
| safetySettings, cachedContent, labels                                           | G>X  |
| tools other than functionDeclarations (googleSearch, codeExecution, urlContext) | G>X  |
| toolConfig mode VALIDATED (sent as auto), toolConfig.retrievalConfig            | G>X  |
| thinkingConfig.includeThoughts alone (without a budget or a level)              | G>X  |
| responseModalities, speechConfig, mediaResolution, imageConfig                  | G>X  |
| responseLogprobs, logprobs, enableEnhancedCivicAnswers                          | G>X  |
| responseMimeType other than application/json (text/x.enum)                      | G>X  |
| functionResponse.parts (multimodal results), videoMetadata                      | G>X  |
| executableCode / codeExecutionResult parts, inlineData in model turns           | G>X  |
| parallel_tool_calls, user, logit_bias, logprobs, store, metadata, service_tier  | X>G  |
| prediction, modalities, audio, web_search_options                               | X>G  |
| non-function tools (custom, web_search); tool call ids                          | X>G  |
| refusal, redacted_reasoning, annotations; usage cache_creation_tokens           | >G   |
| safetyRatings, citationMetadata, groundingMetadata, avgLogprobs, finishMessage  | G>   |
| inlineData (image output), executableCode, codeExecutionResult parts of replies | G>   |
"""

from __future__ import annotations

from typing import ClassVar

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget, count
from gateway.protocols.gemini_request import (
    assistant_parts,
    decode_contents,
    decode_generation,
    decode_tools,
    encode_body,
    json_fields,
)
from gateway.protocols.gemini_stream import (
    FINISH_FROM_GEMINI,
    FINISH_TO_GEMINI,
    GeminiPassthroughStream,
    GeminiStreamDecoder,
    GeminiStreamEncoder,
    decode_usage,
    encode_usage,
    error_body,
    error_from_payload,
    part_deltas,
)
from gateway.types import (
    JSON,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    Choice,
    ToolCall,
    Usage,
)

JSON_HEADERS = {"content-type": "application/json"}


# --- upstream reply -> chat response, chat response -> client reply ----------------------


def _decode_candidate(cand: JSON, calls: list[int], prefix: str) -> Choice:
    cand = cand if isinstance(cand, dict) else {}
    msg: ChatMessage = {"role": "assistant", "content": None}
    texts: list[str] = []
    thoughts: list[str] = []
    tool_calls: list[ToolCall] = []
    content = cand.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    for delta in part_deltas(parts or [], calls, prefix):
        if "content" in delta:
            texts.append(delta["content"] or "")
        if "reasoning_content" in delta:
            thoughts.append(delta["reasoning_content"])
        if "reasoning_signature" in delta:
            msg["reasoning_signature"] = delta["reasoning_signature"]
        tool_calls.extend(delta.get("tool_calls") or ())
    msg["content"] = "".join(texts) if texts or not tool_calls else None
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    finish = FINISH_FROM_GEMINI.get(cand.get("finishReason") or "STOP", "stop")
    if finish == "stop" and tool_calls:
        finish = "tool_calls"
    return {"index": count(cand.get("index")), "message": msg, "finish_reason": finish}


def _route_url(base_url: str, model: str, method: str) -> str:
    base = base_url.rstrip("/")
    if method == "streamGenerateContent":
        return f"{base}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    return f"{base}/v1beta/models/{model}:{method}"


class GeminiAdapter:
    name: ClassVar[str] = "gemini"
    capabilities: ClassVar[frozenset[str]] = frozenset({"chat", "count_tokens"})

    # --- client side

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest:
        payload = json_fields(payload, "request body")
        if route.capability == "count_tokens" and "generateContentRequest" in payload:
            payload = json_fields(payload["generateContentRequest"], "generateContentRequest")
        req: ChatRequest = {"model": route.model or "", "messages": decode_contents(payload)}
        if route.stream:
            req["stream"] = True
        decode_tools(payload, req)
        if payload.get("generationConfig") is not None:
            decode_generation(payload["generationConfig"], req)
        return req

    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON:
        candidates: list[JSON] = []
        for choice in resp.get("choices") or ():
            parts = assistant_parts(choice.get("message") or {}, upstream=False)
            candidate: JSON = {"content": {"parts": parts or [{"text": ""}], "role": "model"}}
            finish = choice.get("finish_reason")
            if finish:
                candidate["finishReason"] = FINISH_TO_GEMINI.get(finish, "OTHER")
            candidate["index"] = choice.get("index", 0)
            candidates.append(candidate)
        out: JSON = {"candidates": candidates}
        usage = resp.get("usage")
        if usage:
            out["usageMetadata"] = encode_usage(usage)
        out["modelVersion"] = ctx.model
        out["responseId"] = ctx.request_id
        return out

    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> GeminiStreamEncoder:
        return GeminiStreamEncoder(ctx, route.sse)

    def encode_error(self, err: GatewayError) -> tuple[int, JSON]:
        return err.status, error_body(err)

    def encode_count(self, tokens: int, ctx: Ctx) -> JSON:
        return {"totalTokens": tokens}

    # --- upstream side

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        method = "streamGenerateContent" if target.stream else "generateContent"
        return UpstreamCall(
            url=_route_url(target.base_url, target.model, method),
            headers={**JSON_HEADERS, "x-goog-api-key": target.api_key},
            body=orjson.dumps(encode_body(req)),
        )

    def decode_response(self, payload: JSON) -> ChatResponse:
        if not isinstance(payload, dict):
            raise UpstreamError("upstream reply is not a JSON object")
        response_id = str(payload.get("responseId") or "")
        calls = [0]
        prefix = f"call_{response_id}_" if response_id else "call_"
        candidates = payload.get("candidates") or []
        choices = [_decode_candidate(c, calls, prefix) for c in candidates]
        feedback = payload.get("promptFeedback")
        if not choices and isinstance(feedback, dict) and feedback.get("blockReason"):
            choices = [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": "content_filter",
                }
            ]
        resp: ChatResponse = {
            "id": response_id,
            "object": "chat.completion",
            "created": 0,
            "model": str(payload.get("modelVersion") or ""),
            "choices": choices,
        }
        if "usageMetadata" in payload:
            resp["usage"] = decode_usage(payload["usageMetadata"])
        return resp

    def stream_decoder(self, ctx: Ctx) -> GeminiStreamDecoder:
        return GeminiStreamDecoder(ctx)

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        try:
            payload = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            payload = None
        return error_from_payload(status, payload)

    def count_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall | None:
        inner = encode_body(req, generation=False)
        inner["model"] = f"models/{target.model}"
        return UpstreamCall(
            url=_route_url(target.base_url, target.model, "countTokens"),
            headers={**JSON_HEADERS, "x-goog-api-key": target.api_key},
            body=orjson.dumps({"generateContentRequest": inner}),
        )

    def decode_count(self, payload: JSON) -> int:
        if not isinstance(payload, dict) or not isinstance(payload.get("totalTokens"), int):
            raise UpstreamError("upstream countTokens reply has no totalTokens")
        return int(payload["totalTokens"])

    # --- passthrough

    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        if route.capability == "count_tokens":
            method = "countTokens"
            inner = payload.get("generateContentRequest") if isinstance(payload, dict) else None
            if isinstance(inner, dict) and "model" in inner:
                inner = {**inner, "model": f"models/{target.model}"}
                payload = {**payload, "generateContentRequest": inner}
        elif target.stream:
            method = "streamGenerateContent"
        else:
            method = "generateContent"
        return UpstreamCall(
            url=_route_url(target.base_url, target.model, method),
            headers={**JSON_HEADERS, "x-goog-api-key": target.api_key},
            body=orjson.dumps(payload),
        )

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        if not isinstance(payload, dict):
            raise UpstreamError("upstream reply is not a JSON object")
        usage = decode_usage(payload["usageMetadata"]) if "usageMetadata" in payload else None
        if "modelVersion" in payload and payload["modelVersion"] != ctx.model:
            payload = {**payload, "modelVersion": ctx.model}
        return payload, usage

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> GeminiPassthroughStream:
        return GeminiPassthroughStream(ctx, route.sse)
