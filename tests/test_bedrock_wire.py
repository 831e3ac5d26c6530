"""The wire under bedrock channels: SigV4 signing (``gateway.upstream.sigv4``) and AWS's
event-stream framing (``gateway.upstream.eventstream``), each held to botocore's own."""

from __future__ import annotations

import asyncio
import struct
import zlib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import pytest
import yarl
from botocore import auth as botocore_auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from bench.fake import aws_auth
from gateway.errors import UpstreamError
from gateway.protocols.bedrock import model_path
from gateway.protocols.sse import SSEEvent
from gateway.upstream import eventstream
from gateway.upstream.eventstream import (
    EventStreamDecoder,
    EventStreamError,
    EventStreamParser,
    encode_event,
    encode_exception,
    encode_message,
    frame,
    header_bytes,
)
from gateway.upstream.sigv4 import NoCredentialsError, Signer

KEY, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
NOW = datetime(2025, 3, 14, 15, 9, 26, tzinfo=UTC)
URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-v2:1/converse"
HEADERS = {"content-type": "application/json"}
BODY = b'{"messages":[{"role":"user","content":[{"text":"hi"}]}]}'


# SigV4 -------------------------------------------------------------------------------------
def botocore_signed(
    credentials: Credentials, url: str, headers: dict[str, str], body: bytes, when: datetime
) -> AWSRequest:
    """The same request signed by botocore's own ``add_auth``, its clock frozen at ``when``
    (``get_current_datetime`` since botocore 1.35, ``datetime.utcnow`` before)."""
    request = AWSRequest(method="POST", url=url, headers=dict(headers), data=body)
    naive = when.replace(tzinfo=None)
    with pytest.MonkeyPatch.context() as patch:
        if hasattr(botocore_auth, "get_current_datetime"):
            patch.setattr(botocore_auth, "get_current_datetime", lambda *a, **k: naive)
        else:
            frozen = type("Frozen", (datetime,), {"utcnow": classmethod(lambda cls: naive)})
            patch.setattr(botocore_auth, "datetime", SimpleNamespace(datetime=frozen))
        SigV4Auth(credentials, "bedrock", "us-east-1").add_auth(request)
    return request


def received(url: str, headers: dict[str, str], added: dict[str, str]) -> CIMultiDict[str]:
    """The headers as a server gets them: what was signed, the added ones and the host."""
    host = yarl.URL(url).raw_host or ""
    return CIMultiDict({**headers, **added, "host": host})


@pytest.mark.parametrize("token", [None, "session-token-value"])
def test_signature_is_botocores_for_the_same_request_and_clock(token: str | None) -> None:
    signer = Signer.static("us-east-1", KEY, SECRET, token)
    added = signer.sign("POST", URL, HEADERS, BODY, now=NOW)
    reference = botocore_signed(Credentials(KEY, SECRET, token), URL, HEADERS, BODY, NOW)
    assert added["Authorization"] == reference.headers["Authorization"]
    assert added["X-Amz-Date"] == reference.headers["X-Amz-Date"] == "20250314T150926Z"
    assert added["Authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={KEY}/20250314/us-east-1/bedrock/aws4_request, "
    )
    if token:
        assert added["X-Amz-Security-Token"] == token
        assert "x-amz-security-token" in added["Authorization"]
    else:
        assert "X-Amz-Security-Token" not in added
    assert "x-amz-content-sha256" not in {k.lower() for k in added}  # not S3


def test_a_verifier_accepts_the_signature_and_refuses_a_wrong_secret_or_body() -> None:
    added = Signer.static("us-east-1", KEY, SECRET).sign("POST", URL, HEADERS, BODY, now=NOW)
    raw_path = yarl.URL(URL).raw_path
    headers = received(URL, HEADERS, added)
    ok = aws_auth.verify("POST", raw_path, headers, BODY, {KEY: SECRET}, now=NOW)
    assert ok is None
    wrong = aws_auth.verify("POST", raw_path, headers, BODY, {KEY: SECRET + "x"}, now=NOW)
    assert wrong is not None and wrong.error_type == "InvalidSignatureException"
    tampered = aws_auth.verify("POST", raw_path, headers, BODY + b" ", {KEY: SECRET}, now=NOW)
    assert tampered is not None and tampered.error_type == "InvalidSignatureException"
    unknown = aws_auth.verify("POST", raw_path, headers, BODY, {"OTHER": SECRET}, now=NOW)
    assert unknown is not None and unknown.error_type == "UnrecognizedClientException"
    late = aws_auth.verify(
        "POST", raw_path, headers, BODY, {KEY: SECRET}, now=NOW + timedelta(minutes=6)
    )
    assert late is not None and late.message.startswith("Signature expired")


def test_signing_again_replaces_the_last_attempts_headers() -> None:
    signer = Signer.static("us-east-1", KEY, SECRET, "tok")
    first = signer.sign("POST", URL, HEADERS, BODY, now=NOW)
    later = NOW + timedelta(seconds=30)
    again = signer.sign("POST", URL, {**HEADERS, **first}, BODY, now=later)
    assert again == signer.sign("POST", URL, HEADERS, BODY, now=later)


def test_credentials_from_the_environment_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in (
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    signer = Signer.from_environment("eu-west-3")
    added = signer.sign("POST", URL, HEADERS, BODY, now=NOW)
    reference = botocore_signed(Credentials(KEY, SECRET, "env-token"), URL, HEADERS, BODY, NOW)
    assert added["X-Amz-Security-Token"] == "env-token"
    assert "/eu-west-3/bedrock/" in added["Authorization"]
    assert added["Authorization"] != reference.headers["Authorization"]  # another region
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(NoCredentialsError):
        Signer.from_environment("eu-west-3")


def test_expiring_credentials_are_refreshed_off_the_event_loop() -> None:
    calls: list[int] = []

    def fetch() -> dict[str, str]:
        calls.append(1)
        expiry = datetime.now(UTC) + timedelta(hours=len(calls) - 1)  # the first is stale
        return {
            "access_key": KEY,
            "secret_key": SECRET,
            "token": f"t{len(calls)}",
            "expiry_time": expiry.isoformat(),
        }

    credentials = RefreshableCredentials.create_from_metadata(fetch(), fetch, "test")
    signer = Signer(credentials, "us-east-1")
    assert signer.refresh_due
    asyncio.run(signer.refresh())
    assert not signer.refresh_due
    assert signer.sign("POST", URL, HEADERS, BODY)["X-Amz-Security-Token"] == "t2"
    assert not Signer.static("us-east-1", KEY, SECRET).refresh_due


@pytest.mark.parametrize(
    "model",
    [
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
        "us.amazon.nova-pro-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v2:1",
        "meta.llama3 70b (test)",
    ],
)
def test_a_model_path_goes_out_as_it_was_signed(model: str) -> None:
    """aiohttp re-quotes a str URL; the path built for a model id is already in that form, so
    what is sent is what was signed (an ARN's "/" stays one segment)."""
    url = "https://bedrock-runtime.us-east-1.amazonaws.com" + model_path(model) + "/converse"
    assert str(yarl.URL(url)) == url
    assert yarl.URL(url).raw_path == yarl.URL(url, encoded=True).raw_path
    assert unquote(yarl.URL(url).raw_path.split("/")[2]) == model


# event stream ------------------------------------------------------------------------------
HEADER_VALUES = {
    0: st.just(True),
    1: st.just(False),
    2: st.integers(-(2**7), 2**7 - 1),
    3: st.integers(-(2**15), 2**15 - 1),
    4: st.integers(-(2**31), 2**31 - 1),
    5: st.integers(-(2**63), 2**63 - 1),
    6: st.binary(max_size=40),
    7: st.text(max_size=40),
    8: st.integers(-(2**63), 2**63 - 1),
    9: st.binary(min_size=16, max_size=16),
}


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, dict[str, Any], bytes]:
    names = draw(st.lists(st.text(min_size=1, max_size=12), max_size=5, unique=True))
    headers: dict[str, Any] = {}
    raw = b""
    for name in names:
        if len(name.encode()) > 255:
            continue
        kind = draw(st.integers(0, 9))
        value = draw(HEADER_VALUES[kind])
        headers[name] = value
        raw += header_bytes(name, kind, value)
    payload = draw(st.binary(max_size=200))
    return frame(raw, payload), headers, payload


def botocore_parse(raw: bytes) -> list[tuple[dict[str, Any], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    return [(m.headers, m.payload) for m in buffer]


def decode_in_pieces(raw: bytes, cuts: list[int]) -> list[tuple[dict[str, Any], bytes]]:
    decoder = EventStreamDecoder()
    out: list[tuple[dict[str, Any], bytes]] = []
    start = 0
    for cut in [*sorted(cuts), len(raw)]:
        out.extend(decoder.feed(raw[start:cut]))
        start = cut
    decoder.close()
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=4), st.data())
def test_decoding_equals_botocores_however_the_bytes_are_split(
    stream: list[tuple[bytes, dict[str, Any], bytes]], data: st.DataObject
) -> None:
    raw = b"".join(m[0] for m in stream)
    expected = botocore_parse(raw)
    assert expected == [(h, p) for _, h, p in stream]
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=6))
    assert decode_in_pieces(raw, cuts) == expected


def test_every_split_offset_gives_the_same_messages() -> None:
    raw = (
        encode_event("messageStart", b'{"role":"assistant"}')
        + encode_message({":message-type": "event", "flag": True, "n": 7}, b"")
        + encode_exception("throttlingException", b'{"message":"slow down"}')
    )
    whole = decode_in_pieces(raw, [])
    assert len(whole) == 3 and whole == botocore_parse(raw)
    for offset in range(len(raw) + 1):
        assert decode_in_pieces(raw, [offset]) == whole


@settings(max_examples=150, deadline=None)
@given(messages(), st.data())
def test_any_flipped_byte_is_refused(message: Any, data: st.DataObject) -> None:
    raw = bytearray(message[0])
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    decoder = EventStreamDecoder()
    with pytest.raises(EventStreamError):
        decoder.feed(bytes(raw))
        decoder.close()


def test_a_changed_headers_length_that_still_adds_up_is_refused() -> None:
    """The lengths in the prelude still add up and the first header block alone reads: only
    the checksums tell. (The message's was once computed on from the prelude CRC the message
    gives, which missed a change to the prelude's own bytes.)"""
    first = header_bytes("a" * 18, eventstream.TRUE, True)  # 20 bytes, a whole block alone
    raw = bytearray(frame(first + header_bytes("b", eventstream.STRING, "xy"), b""))
    raw[7] = len(first)  # headers of 20 bytes: the rest would read as the payload
    with pytest.raises(EventStreamError, match="prelude checksum"):
        EventStreamDecoder().feed(bytes(raw))


def test_corruption_is_an_upstream_error_named_for_what_broke() -> None:
    raw = encode_event("chunk", b'{"bytes":"e30="}')
    bad_crc = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(UpstreamError, match="message checksum"):
        EventStreamDecoder().feed(bad_crc)
    bad_prelude = raw[:3] + bytes([raw[3] ^ 1]) + raw[4:]
    with pytest.raises(EventStreamError, match="prelude checksum"):
        EventStreamDecoder().feed(bad_prelude)
    decoder = EventStreamDecoder()
    assert decoder.feed(raw[:-5]) == []
    with pytest.raises(EventStreamError, match="ended inside a message"):
        decoder.close()


def test_a_huge_length_is_refused_before_its_bytes_arrive() -> None:
    prelude = struct.pack(">II", 30 * 1024 * 1024, 0)
    prelude += struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(EventStreamError, match="payload of"):
        EventStreamDecoder().feed(prelude)


def test_a_header_named_twice_is_refused() -> None:
    headers = header_bytes("a", eventstream.STRING, "1") + header_bytes("a", eventstream.TRUE, True)
    with pytest.raises(EventStreamError, match="given twice"):
        EventStreamDecoder().feed(frame(headers, b""))


def test_the_parser_names_events_and_exceptions() -> None:
    error = encode_message(
        {":message-type": "error", ":error-code": "InternalFailure", ":error-message": "boom"},
        b"",
    )
    raw = (
        encode_event("contentBlockDelta", b'{"delta":{"text":"hi"}}')
        + encode_exception("modelStreamErrorException", b'{"message":"bad"}')
        + error
    )
    parser = EventStreamParser()
    events = parser.feed(raw[:10]) + parser.feed(raw[10:]) + parser.close()
    assert events == [
        SSEEvent("contentBlockDelta", b'{"delta":{"text":"hi"}}'),
        SSEEvent("exception:modelStreamErrorException", b'{"message":"bad"}'),
        SSEEvent("exception:InternalFailure", b'{"message":"boom"}'),
    ]
    assert not parser.pending


def test_each_event_is_named_by_its_own_headers() -> None:
    """Events that share their headers and events that do not, in any order, one without
    headers first: each is named by its own (the parser remembers the last event's)."""
    raw = (
        encode_message({}, b"0")
        + encode_event("chunk", b"1")
        + encode_event("chunk", b"2")
        + encode_event("messageStop", b"3")
        + encode_event("chunk", b"4")
        + encode_exception("throttlingException", b"5")
        + encode_event("chunk", b"6")
        + encode_message({}, b"7")
    )
    for reads in ([raw], [raw[:40], raw[40:41], raw[41:]]):
        parser = EventStreamParser()
        events = [e for read in reads for e in parser.feed(read)]
        assert [(e.event, e.data) for e in events] == [
            (None, b"0"),
            ("chunk", b"1"),
            ("chunk", b"2"),
            ("messageStop", b"3"),
            ("chunk", b"4"),
            ("exception:throttlingException", b"5"),
            ("chunk", b"6"),
            (None, b"7"),
        ]


def test_a_wrong_prelude_checksum_is_refused_though_the_message_checksum_is_right() -> None:
    """A message whose CRC was computed over the bytes sent, a wrong prelude CRC among them,
    is refused for its prelude, as botocore refuses it."""
    raw = bytearray(encode_event("chunk", b'{"bytes":"e30="}'))
    raw[8:12] = struct.pack(">I", zlib.crc32(raw[:8]) ^ 0x00FF0000)
    raw[-4:] = struct.pack(">I", zlib.crc32(raw[:-4]))
    with pytest.raises(EventStreamError, match="prelude checksum"):
        EventStreamDecoder().feed(bytes(raw))
    with pytest.raises(ChecksumMismatch):
        botocore_parse(bytes(raw))
