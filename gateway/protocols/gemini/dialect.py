"""Gemini's JSON dialect, read and written by requests of every kind (chat, count, embeddings):
field names in either spelling, its OpenAPI subset of JSON Schema, and base64 bytes.

- Proto3 JSON takes a field's proto name (``mime_type``) as well as its JSON name
  (``mimeType``); google-genai sends nested objects the first way. ``json_fields`` reads both.
- Schemas toward Gemini (function parameters, responseSchema) are reduced to the OpenAPI subset
  it accepts (``schema_to_gemini``); Gemini's schemas become JSON Schema (``schema_to_json``).
- Bytes fields are base64, which proto3 JSON takes in either alphabet, padded or not, and
  google-genai writes URL-safe; the other APIs take only the standard alphabet, padded
  (``standard_base64``).
"""

from __future__ import annotations

from gateway.errors import InvalidRequestError
from gateway.types import JSON

URLSAFE_TO_STANDARD = str.maketrans("-_", "+/")
# The OpenAPI schema subset Gemini's `parameters` and `responseSchema` accept.
GEMINI_SCHEMA_KEYS = frozenset(
    "type format title description nullable enum maxItems minItems properties required"
    " minProperties maxProperties minLength maxLength pattern example anyOf propertyOrdering"
    " default items minimum maximum".split()
)


def require_dict(value: JSON, what: str) -> dict[str, JSON]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be an object")
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def json_fields(value: JSON, what: str) -> dict[str, JSON]:
    """A Gemini request object with its keys in JSON (lowerCamelCase) spelling.

    Gemini's API, like every proto3 JSON endpoint, accepts a field's proto name
    (``mime_type``) as well as its JSON name (``mimeType``), and google-genai sends nested
    objects that way (``inlineData: {mime_type}``, ``parameters_json_schema``,
    ``thinkingConfig: {thinking_budget}``). Only this object's own keys are renamed: values
    that are free JSON (function args and responses, JSON schemas, property names) are not.
    """
    obj = require_dict(value, what)
    if not any("_" in key for key in obj):
        return obj
    out: dict[str, JSON] = {}
    for key, item in obj.items():
        name = _camel(key) if "_" in key else key
        if name not in out or name == key:  # the JSON spelling wins over the proto one
            out[name] = item
    return out


def standard_base64(data: str) -> str:
    """Base64 in the standard alphabet, padded. google-genai writes bytes fields (inline
    data, thought signatures) URL-safe (``-`` and ``_``), and other clients may leave the
    padding off: Gemini takes either (proto3 JSON), the other APIs only this form."""
    if "-" in data or "_" in data:
        data = data.translate(URLSAFE_TO_STANDARD)
    if len(data) % 4:
        data += "=" * (-len(data) % 4)
    return data


def has_ref(schema: JSON) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(has_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_ref(v) for v in schema)
    return False


def schema_to_gemini(schema: JSON) -> JSON:
    """JSON Schema -> the OpenAPI subset Gemini's ``parameters``/``responseSchema`` accept."""
    if not isinstance(schema, dict):
        return schema
    out: JSON = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            if len(kinds) < len(value):
                out["nullable"] = True
            if len(kinds) == 1:
                out["type"] = kinds[0]
            elif kinds:
                out["anyOf"] = [{"type": t} for t in kinds]
        elif key == "const":
            out["enum"] = [value]
        elif key == "enum" and isinstance(value, list):
            out["enum"] = [v for v in value if v is not None]  # null is said by nullable
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: schema_to_gemini(s) for name, s in value.items()}
        elif key == "items":
            out["items"] = schema_to_gemini(value)
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            out["anyOf"] = [schema_to_gemini(s) for s in value]
        elif key in GEMINI_SCHEMA_KEYS:
            out[key] = value
    return out


def schema_to_json(schema: JSON) -> JSON:
    """Gemini's OpenAPI schema (upper-case types, nullable) -> JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    schema = json_fields(schema, "schema")
    out: JSON = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: schema_to_json(s) for name, s in value.items()}
        elif key == "items":
            out["items"] = schema_to_json(value)
        elif key == "anyOf" and isinstance(value, list):
            out["anyOf"] = [schema_to_json(s) for s in value]
        elif key not in ("nullable", "propertyOrdering"):
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out
