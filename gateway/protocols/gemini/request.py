"""Generate-content requests, both ways: a client's body (contents, tools, toolConfig,
generationConfig, in either field spelling) decoded into the chat-completions shape, and a chat
request encoded into a body for a gemini channel (and its count). The mapping notes and the
fields not carried are in the package's docstring.
"""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequestError
from gateway.protocols.base import RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.protocols.gemini.contents import decode_contents, encode_contents
from gateway.protocols.gemini.dialect import (
    has_ref,
    json_fields,
    schema_to_gemini,
    schema_to_json,
)
from gateway.types import JSON, ChatRequest

EFFORT_BUDGET = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
JSON_HEADERS = {"content-type": "application/json"}


# --- client side: generateContent request -> chat request --------------------------------


def decode_request(payload: JSON, route: RouteMatch) -> ChatRequest:
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


def decode_tools(payload: dict[str, JSON], req: ChatRequest) -> None:
    tools: list[JSON] = []
    for i, tool in enumerate(REQUEST.opt_array(payload.get("tools"), "tools")):
        at = f"tools[{i}]"
        declarations = json_fields(tool, at).get("functionDeclarations")
        for j, decl in enumerate(REQUEST.opt_array(declarations, at, "functionDeclarations")):
            where = f"{at}.functionDeclarations[{j}]"
            decl = json_fields(decl, where)
            function: JSON = {"name": REQUEST.text(decl.get("name"), where, "name")}
            if decl.get("description"):
                function["description"] = REQUEST.text(decl["description"], where, "description")
            if "parametersJsonSchema" in decl:
                function["parameters"] = REQUEST.obj(
                    decl["parametersJsonSchema"], where, "parametersJsonSchema"
                )
            elif "parameters" in decl:
                schema = REQUEST.obj(decl["parameters"], where, "parameters")
                function["parameters"] = schema_to_json(schema)
            else:
                function["parameters"] = {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": function})
    if tools:
        req["tools"] = tools
    config = json_fields(payload.get("toolConfig") or {}, "toolConfig").get("functionCallingConfig")
    if not isinstance(config, dict) or not tools:
        return  # a tool choice without tools is refused by chat-completions upstreams
    config = json_fields(config, "functionCallingConfig")
    mode = config.get("mode")
    names = REQUEST.opt_array(config.get("allowedFunctionNames"), "functionCallingConfig")
    names = REQUEST.texts(names, "functionCallingConfig", "allowedFunctionNames")
    if mode == "NONE":
        req["tool_choice"] = "none"
    elif mode == "ANY" and len(names) == 1:
        if not names[0]:
            raise InvalidRequestError("functionCallingConfig.allowedFunctionNames[0] is empty")
        req["tool_choice"] = {"type": "function", "function": {"name": names[0]}}
    elif mode == "ANY":
        req["tool_choice"] = "required"
        if names:
            req["tools"] = [t for t in tools if t["function"]["name"] in names]
    elif mode in ("AUTO", "VALIDATED"):
        req["tool_choice"] = "auto"


def _effort_from_budget(budget: int) -> str:
    if budget == 0:
        return "none"
    if budget < 0 or 1024 < budget <= 8192:
        return "medium"
    return "low" if budget <= 1024 else "high"


def decode_generation(config: JSON, req: ChatRequest) -> None:
    config = json_fields(config, "generationConfig")
    numbers = (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    )
    for src, dst in numbers:
        if config.get(src) is not None:
            req[dst] = REQUEST.number(config[src], "generationConfig", src)  # type: ignore[literal-required]
    integers = (
        ("topK", "top_k"),
        ("maxOutputTokens", "max_tokens"),
        ("candidateCount", "n"),
        ("seed", "seed"),
    )
    for src, dst in integers:
        if config.get(src) is not None:
            req[dst] = REQUEST.integer(config[src], "generationConfig", src)  # type: ignore[literal-required]
    if config.get("stopSequences"):
        req["stop"] = list(
            REQUEST.texts(config["stopSequences"], "generationConfig", "stopSequences")
        )
    if config.get("responseMimeType") == "application/json":
        if "responseJsonSchema" in config:
            schema = REQUEST.obj(
                config["responseJsonSchema"], "generationConfig", "responseJsonSchema"
            )
        elif "responseSchema" in config:
            schema = schema_to_json(
                REQUEST.opt_obj(config["responseSchema"], "generationConfig", "responseSchema")
            )
        else:
            schema = None
        if schema is None:
            req["response_format"] = {"type": "json_object"}
        else:
            req["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            }
    thinking = config.get("thinkingConfig")
    if isinstance(thinking, dict):
        thinking = json_fields(thinking, "thinkingConfig")
        if isinstance(thinking.get("thinkingLevel"), str):
            req["reasoning_effort"] = thinking["thinkingLevel"].lower()
        elif isinstance(thinking.get("thinkingBudget"), int):
            req["reasoning_effort"] = _effort_from_budget(thinking["thinkingBudget"])


# --- upstream side: chat request -> generateContent request ------------------------------


def _encode_tools(req: ChatRequest, body: JSON) -> None:
    declarations: list[JSON] = []
    for i, tool in enumerate(REQUEST.opt_array(req.get("tools"), "tools")):
        if REQUEST.obj(tool, "tools", i).get("type") != "function":
            continue
        at = f"tools[{i}].function"
        function = REQUEST.obj(tool.get("function"), at)
        decl: JSON = {"name": REQUEST.text(function.get("name"), at, "name")}
        if function.get("description"):
            decl["description"] = REQUEST.text(function["description"], at, "description")
        params = REQUEST.opt_obj(function.get("parameters"), at, "parameters")
        if params and has_ref(params):
            decl["parametersJsonSchema"] = params
        elif params and (params.get("properties") or params.get("type") != "object"):
            decl["parameters"] = schema_to_gemini(params)
        declarations.append(decl)
    if declarations:
        body["tools"] = [{"functionDeclarations": declarations}]
    choice = req.get("tool_choice")
    config: JSON = None
    if choice == "auto":
        config = {"mode": "AUTO"}
    elif choice == "none":
        config = {"mode": "NONE"}
    elif choice == "required":
        config = {"mode": "ANY"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        function = REQUEST.obj(choice.get("function"), "tool_choice", "function")
        name = REQUEST.text(function.get("name"), "tool_choice.function", "name")
        config = {"mode": "ANY", "allowedFunctionNames": [name]}
    elif choice is not None and choice != "auto":
        raise InvalidRequestError("tool_choice must be auto, none, required or a function")
    if config is not None and declarations:
        body["toolConfig"] = {"functionCallingConfig": config}


def _encode_generation(req: ChatRequest) -> JSON:
    config: JSON = {}
    numbers = (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    )
    for src, dst in numbers:
        if req.get(src) is not None:
            config[dst] = REQUEST.number(req[src], src)  # type: ignore[literal-required]
    for src, dst in (("top_k", "topK"), ("n", "candidateCount"), ("seed", "seed")):
        if req.get(src) is not None:
            config[dst] = REQUEST.integer(req[src], src)  # type: ignore[literal-required]
    max_tokens = REQUEST.opt_integer(
        req.get("max_completion_tokens"), "max_completion_tokens"
    ) or REQUEST.opt_integer(req.get("max_tokens"), "max_tokens")
    if max_tokens:
        config["maxOutputTokens"] = max_tokens
    stop = req.get("stop")
    if stop is not None:
        stops = REQUEST.stop(stop, "stop")
        if stops:
            config["stopSequences"] = list(stops)
    fmt = REQUEST.opt_obj(req.get("response_format"), "response_format")
    if fmt is not None and fmt.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        spec = REQUEST.opt_obj(fmt.get("json_schema"), "response_format", "json_schema") or {}
        schema = REQUEST.opt_obj(spec.get("schema"), "response_format.json_schema", "schema")
        if schema is not None and has_ref(schema):
            config["responseJsonSchema"] = schema
        elif schema is not None:
            config["responseSchema"] = schema_to_gemini(schema)
    effort = REQUEST.opt_text(req.get("reasoning_effort"), "reasoning_effort")
    if effort == "none":
        config["thinkingConfig"] = {"thinkingBudget": 0}
    elif effort in EFFORT_BUDGET:
        config["thinkingConfig"] = {
            "includeThoughts": True,
            "thinkingBudget": EFFORT_BUDGET[effort],
        }
    return config


def encode_body(req: ChatRequest, *, generation: bool = True) -> JSON:
    system, contents = encode_contents(req.get("messages"))
    body: JSON = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    _encode_tools(req, body)
    if generation:
        config = _encode_generation(req)
        if config:
            body["generationConfig"] = config
    return body


def upstream_url(base_url: str, model: str, method: str) -> str:
    base = base_url.rstrip("/")
    if method == "streamGenerateContent":
        return f"{base}/v1beta/models/{model}:streamGenerateContent?alt=sse"
    return f"{base}/v1beta/models/{model}:{method}"


def upstream_headers(target: UpstreamTarget) -> dict[str, str]:
    return {**JSON_HEADERS, "x-goog-api-key": target.api_key}


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    method = "streamGenerateContent" if target.stream else "generateContent"
    return UpstreamCall(
        url=upstream_url(target.base_url, target.model, method),
        headers=upstream_headers(target),
        body=orjson.dumps(encode_body(req)),
    )


def count_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    inner = encode_body(req, generation=False)
    inner["model"] = f"models/{target.model}"
    return UpstreamCall(
        url=upstream_url(target.base_url, target.model, "countTokens"),
        headers=upstream_headers(target),
        body=orjson.dumps({"generateContentRequest": inner}),
    )
