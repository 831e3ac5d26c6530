"""ASGI aliases and the canonical internal shapes.

The internal shape is the OpenAI chat-completions dict (request, response, stream chunk),
decoded by orjson and annotated here; nothing validates it at run time.

Extensions to the chat-completions shape that carry what OpenAI's wire format has no
field for (adapters read and write them; the openai adapter strips them on the way out):

- assistant message / stream delta ``reasoning_content: str``: thinking text.
- assistant message / stream delta ``reasoning_signature: str``: opaque signature of the
  thinking (Anthropic ``signature``, Gemini ``thoughtSignature``), needed upstream on the
  next tool turn.
- assistant message / stream delta ``redacted_reasoning: list[str]``: Anthropic
  ``redacted_thinking`` data.
- tool message ``is_error: bool``: the tool failed (Anthropic ``tool_result.is_error``).
- tool call ``thought_signature: str``: Gemini's signature on a ``functionCall`` part.
- request ``top_k: int``: sampling, carried between anthropic and gemini.
- usage ``cache_creation_tokens: int``: Anthropic ``cache_creation_input_tokens``.
- usage ``cache_creation_1h_tokens: int``: of those, the ones written for an hour (Anthropic
  ``cache_creation.ephemeral_1h_input_tokens``), billed at their own price (as the upstream
  said; billing cuts them to the writes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypedDict

JSON = Any  # an orjson-decoded value; the one place Any enters the code

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class PromptTokensDetails(TypedDict, total=False):
    cached_tokens: int


class CompletionTokensDetails(TypedDict, total=False):
    reasoning_tokens: int


class Usage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    cache_creation_tokens: int
    cache_creation_1h_tokens: int


class FunctionCall(TypedDict, total=False):
    name: str
    arguments: str


class ToolCall(TypedDict, total=False):
    index: int  # stream deltas only
    id: str
    type: str  # "function"
    function: FunctionCall
    thought_signature: str


class ChatMessage(TypedDict, total=False):
    role: str  # system | developer | user | assistant | tool
    content: JSON  # str | list of parts | None
    name: str
    tool_calls: list[ToolCall]
    tool_call_id: str
    reasoning_content: str
    reasoning_signature: str
    redacted_reasoning: list[str]
    is_error: bool
    refusal: str


class ChatRequest(TypedDict, total=False):
    model: str
    messages: list[ChatMessage]
    stream: bool
    stream_options: JSON
    max_tokens: int
    max_completion_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: JSON  # str | list[str]
    tools: list[JSON]
    tool_choice: JSON
    parallel_tool_calls: bool
    response_format: JSON
    reasoning_effort: str
    user: str
    n: int
    seed: int
    presence_penalty: float
    frequency_penalty: float


class Choice(TypedDict, total=False):
    index: int
    message: ChatMessage
    finish_reason: str | None


class ChatResponse(TypedDict, total=False):
    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(TypedDict, total=False):
    role: str
    content: str | None
    tool_calls: list[ToolCall]
    reasoning_content: str
    reasoning_signature: str
    redacted_reasoning: list[str]
    refusal: str | None


class ChunkChoice(TypedDict, total=False):
    index: int
    delta: Delta
    finish_reason: str | None


class ChatChunk(TypedDict, total=False):
    id: str
    object: str  # "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None
