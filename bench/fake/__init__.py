"""The bundled fake upstream: the providers' wire formats (OpenAI, Anthropic, Gemini, AWS
Bedrock, Google Vertex AI with its OAuth2 token endpoint, Azure OpenAI), scripted per
request."""

from __future__ import annotations

from bench.fake.plan import Defaults
from bench.fake.reply import Reply
from bench.fake.server import FakeUpstream, RecordedRequest

__all__ = ["Defaults", "FakeUpstream", "RecordedRequest", "Reply"]
