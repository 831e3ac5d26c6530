"""The cloud channel types' own fields: where their models live and how they prove who they
are (CONTRACT §2, "The cloud channel types").

- ``azure`` (Azure OpenAI): ``base_url`` is the resource endpoint
  (``https://NAME.openai.azure.com``), required; ``api_version`` (``2024-10-21``, or ``v1``
  for Azure's v1 API) is required; the credential is ``api_key`` (sent as ``api-key``).
- ``bedrock`` (AWS Bedrock runtime): ``region`` is required; ``aws_access_key_id`` with
  ``aws_secret_access_key`` (and an optional ``aws_session_token``), or none of them for the
  environment's AWS chain (variables, shared files, SSO, container and instance roles);
  ``base_url`` defaults to ``https://bedrock-runtime.{region}.amazonaws.com``.
- ``vertex`` (Google Vertex AI): ``project`` and ``region`` are required; ``credentials`` is a
  service account's key file: its path, or its JSON content (through ``${NAME}``); ``base_url``
  defaults to ``https://{region}-aiplatform.googleapis.com``
  (``https://aiplatform.googleapis.com`` for ``global``, ``https://aiplatform.{us,eu}.rep.
  googleapis.com`` for the multi-regions ``us`` and ``eu``).

A field of another type's is refused by name. The secrets (``aws_secret_access_key``,
``aws_session_token``, ``credentials``) are in no ``repr``, and the admin API shows a hint of
them at most; a key file's content never appears in an error. The key file is read here only
to tell a wrong one early (a JSON object of ``type: service_account`` with ``client_email``
and ``private_key``); the key itself is parsed when the channel first authorises a request
(``gateway.upstream.auth``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.config.values import ConfigError, at, credential, string

CLOUD_TYPES = ("azure", "bedrock", "vertex")
# the fields each cloud type takes (beyond every channel's); a type's required ones first
TYPE_FIELDS: dict[str, tuple[str, ...]] = {
    "azure": ("api_version",),
    "bedrock": ("region", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"),
    "vertex": ("project", "region", "credentials"),
}
CLOUD_FIELDS = frozenset(name for names in TYPE_FIELDS.values() for name in names)
# never shown by the admin API (a hint at most), never logged
SECRET_FIELDS = ("aws_secret_access_key", "aws_session_token", "credentials")
# the types whose base_url may be left out: the region says it
DEFAULT_URL_TYPES = frozenset({"bedrock", "vertex"})
VERTEX_GLOBAL = "global"
VERTEX_MULTI_REGIONS = frozenset({"us", "eu"})
REGION_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")  # us-east-1, europe-west4, global
PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")  # a project id (or number)
API_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # 2024-10-21, 2025-04-01-preview
MAX_CREDENTIALS = 64 * 1024  # bytes of a key file: Google's are about 2.3 KB


@dataclass(frozen=True, slots=True)
class CloudAccess:
    """A cloud channel's own fields; empty strings for what its type does not take."""

    api_version: str = ""  # azure
    region: str = ""  # bedrock, vertex
    project: str = ""  # vertex
    aws_access_key_id: str = field(default="", repr=False)
    aws_secret_access_key: str = field(default="", repr=False)
    aws_session_token: str = field(default="", repr=False)
    credentials: str = field(default="", repr=False)  # vertex: a key file's path or JSON

    def secrets(self) -> tuple[str, ...]:
        """The values no message may hold (an upstream's error text, a channel test's)."""
        return tuple(v for v in (self.aws_secret_access_key, self.aws_session_token) if v)


NO_CLOUD = CloudAccess()


def default_base_url(ctype: str, region: str) -> str:
    """The base URL of a ``bedrock`` or ``vertex`` channel that gives none."""
    if ctype == "bedrock":
        return f"https://bedrock-runtime.{region}.amazonaws.com"
    if region == VERTEX_GLOBAL:
        return "https://aiplatform.googleapis.com"
    if region in VERTEX_MULTI_REGIONS:
        return f"https://aiplatform.{region}.rep.googleapis.com"
    return f"https://{region}-aiplatform.googleapis.com"


def _text(d: dict[str, Any], name: str, where: str, pattern: re.Pattern[str]) -> str:
    value = string(d.get(name), at(where, name))
    if not pattern.match(value):
        raise ConfigError(f"{at(where, name)}: {value!r} is not a valid {name.replace('_', ' ')}")
    return value


def _optional(d: dict[str, Any], name: str, where: str) -> str:
    return credential(d.get(name), at(where, name), allow_empty=True)


def parse_cloud(d: dict[str, Any], ctype: str, where: str) -> CloudAccess:
    """The cloud fields of a ``channels[]`` entry of type ``ctype`` (``NO_CLOUD`` for the
    other types). Raises ConfigError naming the field."""
    own = TYPE_FIELDS.get(ctype, ())
    for name in sorted(CLOUD_FIELDS - set(own)):
        if d.get(name) is not None:
            takers = ", ".join(t for t in CLOUD_TYPES if name in TYPE_FIELDS[t])
            raise ConfigError(f"{at(where, name)}: only {takers} channels take it")
    if ctype == "azure":
        return CloudAccess(api_version=_text(d, "api_version", where, API_VERSION_RE))
    if ctype == "bedrock":
        return _bedrock(d, where)
    if ctype == "vertex":
        return CloudAccess(
            project=_text(d, "project", where, PROJECT_RE),
            region=_text(d, "region", where, REGION_RE),
            credentials=check_credentials(d.get("credentials"), at(where, "credentials")),
        )
    return NO_CLOUD


def _bedrock(d: dict[str, Any], where: str) -> CloudAccess:
    key_id = _optional(d, "aws_access_key_id", where)
    secret = _optional(d, "aws_secret_access_key", where)
    token = _optional(d, "aws_session_token", where)
    if bool(key_id) != bool(secret):
        missing = "aws_secret_access_key" if key_id else "aws_access_key_id"
        raise ConfigError(
            f"{at(where, missing)}: required with the other (or give neither, for the "
            "environment's AWS credentials)"
        )
    if token and not key_id:
        raise ConfigError(
            f"{at(where, 'aws_session_token')}: only with aws_access_key_id and "
            "aws_secret_access_key"
        )
    return CloudAccess(
        region=_text(d, "region", where, REGION_RE),
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
    )


def check_credentials(v: Any, where: str) -> str:
    """``credentials``: a service account's key file, its JSON or its path; returned as given
    once it reads as one. Errors say what is wrong, never what the file holds."""
    source = string(v, where)
    if source.lstrip().startswith("{"):
        text = source
    else:
        path = Path(source)
        try:
            if path.stat().st_size > MAX_CREDENTIALS:
                raise ConfigError(f"{where}: the file is too large for a key file")
            text = path.read_text()
        except OSError as exc:
            shown = repr(source) if len(source) < 200 and "\n" not in source else "the file"
            raise ConfigError(f"{where}: cannot read {shown}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: the file is not a JSON key file") from None
    try:
        info = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ConfigError(f"{where}: not a service account key (not JSON)") from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ConfigError(f"{where}: not a service account key (type is not service_account)")
    for name in ("client_email", "private_key"):
        if not isinstance(info.get(name), str) or not info[name]:
            raise ConfigError(f"{where}: the service account key has no {name}")
    return source
