"""The SigV4 signer's own canonicalization, held to botocore's ``SigV4Auth.add_auth`` for
any request the gateway could send: model ids of any characters (quoted into the path as
``bedrock.model_path`` does), a query, a port, headers in any case with odd whitespace and
ones SigV4 never signs, any body, any second of any day, with and without a session token;
and the signing key kept per day is the day's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.protocols.bedrock import model_path
from gateway.upstream.sigv4 import Signer
from tests.test_bedrock_wire import KEY, SECRET, botocore_signed

HOSTS = st.sampled_from(
    [
        "https://bedrock-runtime.us-east-1.amazonaws.com",
        "https://bedrock-runtime.eu-west-3.amazonaws.com:443",
        "http://127.0.0.1:9001",
        "http://LOCALHOST:80",
        "https://vpce-1.bedrock-runtime.us-east-1.vpce.amazonaws.com:8443",
    ]
)
MODELS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40
) | st.sampled_from(
    [
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-1b-v1:0",
    ]
)
ACTIONS = st.sampled_from(["converse", "converse-stream", "invoke", "invoke-with-response-stream"])
QUERIES = st.sampled_from(["", "?b=2&a=1", "?a=2&a=1&x", "?alt=sse"])
HEADER_NAMES = st.sampled_from(
    ["content-type", "Content-Type", "accept", "X-Amzn-Bedrock-Trace", "user-agent", "Expect",
     "x-amz-date", "Authorization"]
)  # fmt: skip
VALUES = st.text(st.sampled_from("ab /;=\t"), min_size=1, max_size=12).filter(str.strip)
TIMES = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=300, deadline=None)
@given(
    host=HOSTS,
    model=MODELS,
    action=ACTIONS,
    query=QUERIES,
    headers=st.dictionaries(HEADER_NAMES, VALUES, max_size=4),
    body=st.binary(max_size=64),
    when=TIMES,
    token=st.none() | st.just("session/token+value=="),
)
def test_every_signature_is_botocores(
    host: str,
    model: str,
    action: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
    when: datetime,
    token: str | None,
) -> None:
    url = f"{host}{model_path(model)}/{action}{query}"
    when = when.replace(microsecond=0)
    added = Signer.static("us-east-1", KEY, SECRET, token).sign("POST", url, headers, body, when)
    sent = {k: v for k, v in headers.items() if k.lower() not in ("x-amz-date", "authorization")}
    reference = botocore_signed(Credentials(KEY, SECRET, token), url, sent, body, when)
    assert added["Authorization"] == reference.headers["Authorization"]
    assert added["X-Amz-Date"] == reference.headers["X-Amz-Date"]


def test_the_signing_key_is_the_days() -> None:
    """One signer across midnight: each day's signature is botocore's for that day."""
    signer = Signer.static("us-east-1", KEY, SECRET)
    url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse"
    midnight = datetime(2025, 3, 14, tzinfo=UTC)
    for when in (midnight - timedelta(seconds=1), midnight, midnight + timedelta(hours=30)):
        added = signer.sign("POST", url, {}, b"{}", when)
        reference = botocore_signed(Credentials(KEY, SECRET), url, {}, b"{}", when)
        assert added["Authorization"] == reference.headers["Authorization"]


def test_a_signature_without_a_time_given_is_the_clocks() -> None:
    """Signed at the clock's time: the stamp is now's in UTC, to the second, and the signature
    is botocore's for that second (the stamp is formatted once a second and kept)."""
    signer = Signer.static("us-east-1", KEY, SECRET)
    url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse"
    for _ in range(3):
        before = datetime.now(UTC).replace(microsecond=0)
        added = signer.sign("POST", url, {"content-type": "application/json"}, b"{}")
        after = datetime.now(UTC)
        when = datetime.strptime(added["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        assert before <= when <= after
        reference = botocore_signed(
            Credentials(KEY, SECRET), url, {"content-type": "application/json"}, b"{}", when
        )
        assert added["Authorization"] == reference.headers["Authorization"]
