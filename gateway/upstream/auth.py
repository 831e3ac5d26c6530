"""The channels' credentials that are not a fixed header: each attempt's call finalised for
its channel just before it is sent, and the pool the rest of the gateway sends through.

``ChannelAuths`` wraps the process's upstream pool (the aiohttp one, or a test's) and is the
``UpstreamPool`` everything else is given. A call sent with its ``channel`` gets that
channel's ``ChannelAuth`` first, built once per channel (again when its cloud fields change):

- ``bedrock``: an AWS Signature Version 4 over the final URL, headers and body
  (``sigv4.Signer``: the channel's static keys, else the environment's AWS chain; credentials
  from the chain are refreshed in a thread when due, never inside ``sign``);
- ``vertex``: ``Authorization: Bearer`` with the service account's OAuth2 access token
  (``google_token.AccessTokens``: kept, renewed before it expires, one refresh at a time; the
  token endpoint is posted to through the same pool). A 401 says the token was refused
  (revoked, or expired early): it is invalidated and the call sent once more with a new one;
- every other type: nothing (``api_key`` headers are written by the adapters; Azure's
  ``api-key`` by ``protocols.azure``).

The cloud libraries (botocore for SigV4, cryptography and PyJWT for the tokens) are imported
when the first channel of their type is authorised, not with this module: a gateway without
cloud channels starts without them (about a third of its import time, and their memory).

A channel whose credentials cannot be used (no AWS credentials in the environment, a key file
that does not parse) fails its attempt as the channel's fault (502, cooled down, the next
channel tried), never as the client's 401; the message names the field, never a secret. The
file's channels are authorised once at start (``start``), so a bad one is logged then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlencode

from gateway.config import Channel, ChannelTimeouts, CloudAccess
from gateway.errors import GatewayError, UpstreamError
from gateway.protocols import vertex
from gateway.protocols.base import UpstreamCall
from gateway.upstream import UpstreamPool, UpstreamReply

if TYPE_CHECKING:
    from gateway.upstream.google_token import AccessTokens
    from gateway.upstream.sigv4 import Signer

log = logging.getLogger("gateway.upstream")

AUTHORISED_TYPES = frozenset({"bedrock", "vertex"})
FORM_HEADERS = {
    "Content-Type": "application/x-www-form-urlencoded",
    "Accept": "application/json",
}
BEARER = "Bearer "


class ChannelAuth(Protocol):
    """What authorises one channel's calls."""

    async def authorise(self, call: UpstreamCall) -> None:
        """Add the credentials to ``call.headers``, its URL and body being final."""
        ...

    def refused(self, status: int, call: UpstreamCall) -> bool:
        """Whether ``status`` says the credential ``call`` carried was refused and a new one
        may succeed (the old one is forgotten): the call is then sent once more."""
        ...


class SigV4Auth:
    """AWS Signature Version 4 (``bedrock`` channels)."""

    __slots__ = ("signer",)

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    async def authorise(self, call: UpstreamCall) -> None:
        signer = self.signer
        if signer.refresh_due:
            await signer.refresh()
        call.headers.update(signer.sign("POST", call.url, call.headers, call.body))

    def refused(self, status: int, call: UpstreamCall) -> bool:
        return False  # a signature is not renewed by sending it again


class BearerAuth:
    """A Google service account's OAuth2 access token (``vertex`` channels)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: AccessTokens) -> None:
        self.tokens = tokens

    async def authorise(self, call: UpstreamCall) -> None:
        call.headers["Authorization"] = BEARER + await self.tokens.token()

    def refused(self, status: int, call: UpstreamCall) -> bool:
        if not vertex.token_refused(status):
            return False
        sent = call.headers.get("Authorization", "")
        self.tokens.invalidate(sent[len(BEARER) :] if sent.startswith(BEARER) else None)
        return True


def _unusable(channel: Channel, field: str, reason: str) -> UpstreamError:
    return UpstreamError(
        f"channel {channel.name!r}: {field}: {reason}", channel_fault=True, retryable=True
    )


Environment = Callable[[str], "Signer"]  # region -> a signer of the environment's AWS chain


def environment_signer(region: str) -> Signer:
    """A signer of the environment's AWS chain for ``region`` (botocore imported here)."""
    from gateway.upstream.sigv4 import Signer

    return Signer.from_environment(region)


class ChannelAuths:
    """The upstream pool with each channel's credentials added (module docstring)."""

    __slots__ = ("pool", "_channels", "_environment", "_auths")

    def __init__(
        self,
        pool: UpstreamPool,
        channels: Iterable[Channel] = (),
        environment: Environment = environment_signer,
    ) -> None:
        self.pool = pool
        self._channels = tuple(c for c in channels if c.type in AUTHORISED_TYPES)
        self._environment = environment
        # channel name -> (what its auth was built from, the auth)
        self._auths: dict[str, tuple[tuple[str, CloudAccess], ChannelAuth]] = {}

    async def start(self) -> None:
        await self.pool.start()
        for channel in self._channels:  # the file's: a bad credential is told at once
            try:
                await self.of(channel)
            except GatewayError as err:
                log.error("upstream.auth_unusable channel=%s error=%s", channel.name, err.message)

    async def stop(self) -> None:
        await self.pool.stop()

    def request(
        self,
        call: UpstreamCall,
        upload: AsyncIterable[bytes] | None = None,
        timeouts: ChannelTimeouts | None = None,
        channel: Channel | None = None,
    ) -> Coroutine[object, None, UpstreamReply]:
        """Send the call with ``channel``'s credentials; once more with new ones when the
        upstream refused them (never an upload: it is sent once). A channel whose calls need
        nothing more gets the pool's own coroutine: no frame of this one on the way to every
        upstream call of every request."""
        if channel is None or channel.type not in AUTHORISED_TYPES:
            return self.pool.request(call, upload, timeouts)
        return self._authorised(call, upload, timeouts, channel)

    async def _authorised(
        self,
        call: UpstreamCall,
        upload: AsyncIterable[bytes] | None,
        timeouts: ChannelTimeouts | None,
        channel: Channel,
    ) -> UpstreamReply:
        auth = await self.of(channel)
        await auth.authorise(call)
        resp = await self.pool.request(call, upload, timeouts)
        if upload is None and auth.refused(resp.status, call):
            resp.close()
            log.warning(
                "upstream.credential_refused channel=%s status=%d", channel.name, resp.status
            )
            await auth.authorise(call)
            resp = await self.pool.request(call, upload, timeouts)
        return resp

    async def of(self, channel: Channel) -> ChannelAuth:
        """The channel's auth, built on first use (I/O in a thread) and kept."""
        basis = (channel.type, channel.cloud)
        found = self._auths.get(channel.name)
        if found is not None and found[0] == basis:
            return found[1]
        auth = await self._build(channel)
        self._auths[channel.name] = (basis, auth)
        return auth

    async def _build(self, channel: Channel) -> ChannelAuth:
        return await (self._aws(channel) if channel.type == "bedrock" else self._google(channel))

    async def _aws(self, channel: Channel) -> ChannelAuth:
        from botocore.exceptions import BotoCoreError

        from gateway.upstream.sigv4 import NoCredentialsError, Signer

        cloud = channel.cloud
        if cloud.aws_access_key_id:
            return SigV4Auth(
                Signer.static(
                    cloud.region,
                    cloud.aws_access_key_id,
                    cloud.aws_secret_access_key,
                    cloud.aws_session_token or None,
                )
            )
        try:
            signer = await asyncio.to_thread(self._environment, cloud.region)
        except NoCredentialsError:
            raise _unusable(
                channel, "aws_access_key_id", "none given and none in the environment"
            ) from None
        except BotoCoreError as exc:  # a profile named that does not exist, a bad file
            reason = f"the environment's AWS credentials: {type(exc).__name__}"
            raise _unusable(channel, "aws_access_key_id", reason) from None
        return SigV4Auth(signer)

    async def _google(self, channel: Channel) -> ChannelAuth:
        from gateway.upstream.google_token import AccessTokens, CredentialsError, ServiceAccount

        cloud = channel.cloud
        try:
            account = await asyncio.to_thread(ServiceAccount.load, cloud.credentials)
        except CredentialsError as exc:
            raise _unusable(channel, "credentials", str(exc)) from None
        return BearerAuth(AccessTokens(account, self._post))

    async def _post(self, url: str, form: Mapping[str, str]) -> tuple[int, bytes]:
        """A ``TokenPost`` through the pool (a token endpoint is one more upstream)."""
        from gateway.upstream.google_token import TOKEN_TIMEOUT  # imported already by _google

        call = UpstreamCall(url, dict(FORM_HEADERS), urlencode(form).encode())
        timeouts = ChannelTimeouts(connect=TOKEN_TIMEOUT, total=TOKEN_TIMEOUT)
        resp = await self.pool.request(call, None, timeouts)
        try:
            raw = await resp.read()
        finally:
            resp.close()
        return resp.status, raw
