"""A mend of aiohttp (written for 3.14) that sends an upstream call on a pooled connection,
idle or new, without ``ClientSession._request``'s layers: ``aiohttp.lean_send``, of kind
``speed`` (bench/RESULTS.md, "The request path: aiohttp's per-call layers"); a
``gateway.server.mends.Mend``, checked before it is applied, and left out with a warning when
it does not fit.

Why: for each call, ``ClientSession._request`` merges headers into a ``CIMultiDict``, builds a
``ClientRequest`` (a URL, a body payload, a dozen ``update_*`` steps), wraps it in a timer
and a context manager, writes it through a ``StreamWriter`` from a task of its own (CPython
3.11 has no eager tasks), and only then reads the response: about 1,600 bytecodes a call,
most of them for features the gateway never uses (redirects, cookies, proxies, traces,
middlewares, authentication, compression, chunked uploads). The response's status, headers
and body are all that is read.

How: a call (``send``) takes a connection from aiohttp's own pool (``TCPConnector.connect``,
under the key aiohttp's ``ClientRequest.connection_key`` gives its URL): an idle one, else a
new one aiohttp opens (DNS, TLS and the connect timeouts its own) for a stand-in of the
request that holds what opening one reads of it (``_Connecting``). It sets aiohttp's
response parser on the connection as ``_request`` does, writes the request line, the
headers and the body in one ``transport.write`` (the headers ``_request`` sends, in its
order: ``Host``, the session's ``User-Agent``, the call's, ``Accept``, ``Accept-Encoding``,
``Content-Length``, and ``Content-Type`` when the call has none), and starts an
``aiohttp.ClientResponse`` on the connection: the response, its reads, its release to the
pool at the body's end and its close are aiohttp's own. A call this path does not cover
goes the usual way: a streamed upload, a channel's own total timeout, a URL with
credentials in it (sent as Basic auth), a header the connection itself owns (``Host``,
``Content-Length``, ``Transfer-Encoding``, ``Connection``, ``Expect``, ``Cookie``), a name
given twice in different case, a character a header line cannot hold, a session
configured with anything ``_request`` would apply (traces, middlewares, proxies, a base
URL, authentication, cookies it keeps, a forced close, a total timeout), or a
``ClientSession._request`` replaced since aiohttp was imported (a tracer's wrapper, a test's
mock).
"""

from __future__ import annotations

import asyncio
import dis
import types
from collections.abc import Mapping
from typing import Any

import aiohttp

from gateway.server.mends import Mend, Needs, module_flag, original

_NAME = "aiohttp.lean_send"
MAX_TARGETS = 4096  # URLs remembered (channels × models); past it, new ones go the usual way
# heads kept a URL, by the call's headers: a channel's are the same call after call; a signed
# call's (SigV4: a date and a signature each) are made anew each time once these are kept
HEADS_KEPT = 16
# header names the connection itself owns: a call naming one goes the usual way
OWN = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect", "cookie"})
NO_TRACES: list[Any] = []
# what opening a connection reads of its request (``_Connecting`` holds each): the
# TCPConnector steps from ``connect`` on, whose reads the check compares with these
CONNECTING_STEPS = ("connect", "_create_connection", "_create_direct_connection",
                    "_get_ssl_context", "_get_fingerprint", "_wrap_create_connection")  # fmt: skip
CONNECTING_READS = frozenset(
    {"connection_key", "url", "port", "ssl", "proxy", "server_hostname", "is_ssl"}
)
_on = False  # the mend is in place
# ``ClientSession._request`` as aiohttp defines it, taken at import: one replaced since (a
# tracer's wrapper, a test's mock) is given every call, and the lean path stands aside
_USUAL_REQUEST = getattr(aiohttp.ClientSession, "_request", None)


class _Sent:
    """What ``ClientResponse`` reads of the writer of a request already sent."""

    __slots__ = ("output_size",)

    def __init__(self, size: int) -> None:
        self.output_size = size


class _KeyOf:
    """What ``ClientRequest.connection_key`` reads of a request as ``_request`` makes it for
    this session: no proxy, the default TLS checks, no server name of its own."""

    __slots__ = ("url", "_ssl", "proxy", "proxy_auth", "proxy_headers", "server_hostname")

    def __init__(self, url: Any) -> None:
        self.url, self._ssl = url, True
        self.proxy = self.proxy_auth = self.proxy_headers = self.server_hostname = None


class _Connecting:
    """What ``TCPConnector.connect`` and the steps by which it opens a connection read of a
    request as ``_request`` makes it for this session (``CONNECTING_READS``, checked): its
    key, URL and port, the default TLS checks (``ssl`` True), no proxy, no server name of its
    own."""

    __slots__ = ("connection_key", "url", "port", "ssl", "proxy", "server_hostname", "_tls")

    def __init__(self, key: Any, url: Any) -> None:
        self.connection_key, self.url, self.port = key, url, url.port
        self.ssl, self.proxy, self.server_hostname = True, None, None
        self._tls: bool = url.scheme == "https"

    def is_ssl(self) -> bool:
        return self._tls


class _Target:
    """One URL's request as connecting reads it (its connector key among it), request line
    and host line, made once, and its requests' heads made so far (by the call's headers)."""

    __slots__ = ("connecting", "url", "info", "head", "heads")

    def __init__(self, key: Any, url: Any, info: Any, head: str) -> None:
        self.connecting = _Connecting(key, url)
        self.url, self.info, self.head = url, info, head
        self.heads: dict[tuple[tuple[str, str], ...], tuple[bytes, bytes]] = {}


class LeanSend:
    """The lean path of one ``ClientSession`` (module docstring); ``None`` from ``for_session``
    when the mend is not in place or the session applies something per call."""

    __slots__ = (
        "_session", "_connector", "_targets", "_params", "_first", "_after", "_loop",
        "_response", "_forbidden", "_by_timeout", "_timeout",
    )  # fmt: skip

    def __init__(self, session: Any) -> None:
        import aiohttp.client_reqrep as reqrep
        from aiohttp.http import SERVER_SOFTWARE
        from aiohttp.http_writer import _FORBIDDEN_HEADER_CHARS_RE

        self._response = reqrep.ClientResponse
        self._forbidden = _FORBIDDEN_HEADER_CHARS_RE.search
        self._session = session
        self._connector = session._connector
        self._timeout = session._timeout
        self._targets: dict[str, _Target] = {}
        self._by_timeout: dict[float | None, dict[str, Any]] = {}
        self._params: dict[str, Any] = {
            "timer": _timer(),
            "skip_payload": False,
            "read_until_eof": True,
            "auto_decompress": session._auto_decompress,
            "read_timeout": session._timeout.sock_read,
            "read_bufsize": session._read_bufsize,
            "timeout_ceil_threshold": session._connector._timeout_ceil_threshold,
            "max_line_size": session._max_line_size,
            "max_field_size": session._max_field_size,
            "max_headers": session._max_headers,
        }
        # the headers ``_request`` adds, in its order: the session's defaults before the call's
        # own, then ``ClientRequest``'s (Accept, Accept-Encoding, a User-Agent still missing)
        first = [(str(name).lower(), str(name), value) for name, value in
                 session._default_headers.items()]  # fmt: skip
        after = [(str(name).lower(), str(name), value) for name, value in
                 reqrep.ClientRequest.DEFAULT_HEADERS.items()]  # fmt: skip
        if all(lower != "user-agent" for lower, _, _ in first):
            after.append(("user-agent", "User-Agent", SERVER_SOFTWARE))
        self._first, self._after = first, after
        self._loop = asyncio.get_running_loop()

    @classmethod
    def for_session(cls, session: Any) -> LeanSend | None:
        from gateway.upstream.lean_request_info import LEAN_REQUEST_INFO

        # a lean call's ``RequestInfo`` is made in the shape that mend knows (its shared empty
        # headers): where aiohttp's has changed and that mend is left out, so is this path
        if not _on or not _plain(session) or not LEAN_REQUEST_INFO.in_place():
            return None
        return cls(session)

    def _target(self, url: str) -> _Target | None:
        """``url``'s connector key (computed by aiohttp's own ``ClientRequest.connection_key``
        for a request as ``_request`` makes it), request line and host line."""
        if len(self._targets) >= MAX_TARGETS:
            return None
        from aiohttp.client_reqrep import ClientRequest, RequestInfo
        from yarl import URL

        from gateway.upstream.lean_request_info import NO_HEADERS

        try:
            req_url = URL(url)
        except ValueError:
            return None
        host = req_url.host_port_subcomponent
        if host is None or req_url.scheme not in ("http", "https") or not req_url.raw_host:
            return None
        if req_url.raw_user is not None or req_url.raw_password is not None:
            return None  # credentials in the URL: ``_request`` sends them as Basic auth
        key = ClientRequest.connection_key.fget(_KeyOf(req_url))  # type: ignore[attr-defined]
        # no headers, as a response keeps them under aiohttp.lean_request_info: the call's
        # (the upstream's credentials among them) are not kept for as long as it lasts
        info = RequestInfo(req_url, "POST", NO_HEADERS, req_url)
        head = f"POST {req_url.raw_path_qs} HTTP/1.1\r\nHost: {host}\r\n"
        target = self._targets[url] = _Target(key, req_url, info, head)
        return target

    async def send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeout: Any = None,
    ) -> Any:
        """The started ``aiohttp.ClientResponse`` of ``body`` posted to ``url`` on a pooled
        connection, idle or new; None when this path does not cover the call (nothing was
        sent: the caller goes the usual way). ``timeout``: a channel's own
        ``aiohttp.ClientTimeout`` (no total), in place of the session's: its read timeout
        (``sock_read``, None: none) for the reply, its connect timeouts for a new
        connection."""
        usual = type(self._session)._request
        if usual is not _USUAL_REQUEST and original(usual) is not _USUAL_REQUEST:
            return None  # ``_request`` replaced: it sees every call
        params = self._params if timeout is None else self._params_for(timeout.sock_read)
        target = self._targets.get(url) or self._target(url)
        if target is None:
            return None
        data = self._request(target, body, headers)
        if data is None:
            return None
        conn = await self._connector.connect(
            target.connecting, NO_TRACES, self._timeout if timeout is None else timeout
        )
        try:
            proto = conn.protocol
            proto.set_response_params(**params)
            proto.transport.write(data)
            proto.start_timeout()
            resp = self._response(
                "POST",
                target.url,
                writer=None,
                continue100=None,
                timer=params["timer"],
                request_info=target.info,
                traces=NO_TRACES,
                loop=self._loop,
                session=self._session,
                stream_writer=_Sent(len(data)),  # type: ignore[arg-type]
            )
            try:
                await resp.start(conn)
            except BaseException:
                resp.close()
                raise
        except BaseException:
            conn.close()
            raise
        return resp

    def _params_for(self, read_timeout: float | None) -> dict[str, Any]:
        """The parser's settings with a channel's own read timeout (made once for each)."""
        params = self._by_timeout.get(read_timeout)
        if params is None:
            params = self._by_timeout[read_timeout] = {**self._params, "read_timeout": read_timeout}
        return params

    def _request(self, target: _Target, body: bytes, headers: Mapping[str, str]) -> bytes | None:
        """The request's bytes: line, headers, body; None for a call the usual way takes.
        The lines around ``Content-Length`` are made once for each set of the call's
        headers (a channel's are the same call after call), up to ``HEADS_KEPT`` a URL."""
        given = tuple(headers.items())
        parts = target.heads.get(given)
        if parts is None:
            parts = self._head(target, headers)
            if parts is None:
                return None
            if len(target.heads) < HEADS_KEPT:
                target.heads[given] = parts
        before, after = parts
        return b"".join((before, b"Content-Length: %d\r\n" % len(body), after, body))

    def _head(self, target: _Target, headers: Mapping[str, str]) -> tuple[bytes, bytes] | None:
        """The request line and the headers before ``Content-Length``, and those after it
        (the blank line included); None for headers the usual way takes."""
        named: set[str] = set()
        own: list[str] = []
        for name, value in headers.items():
            lower = name.lower()
            if lower in OWN or lower in named:
                return None
            named.add(lower)
            own.append(f"{name}: {value}")
        # a control character in a name or value (a line break would split the request):
        # the usual way refuses it, by the same pattern
        if own and self._forbidden("\t".join(own)) is not None:
            return None
        lines = [target.head]
        for lower, name, value in self._first:
            if lower not in named:
                lines.append(f"{name}: {value}\r\n")
        lines.extend(f"{line}\r\n" for line in own)
        for lower, name, value in self._after:
            if lower not in named:
                lines.append(f"{name}: {value}\r\n")
        after = "" if "content-type" in named else "Content-Type: application/octet-stream\r\n"
        try:
            return "".join(lines).encode(), (after + "\r\n").encode()
        except UnicodeEncodeError:
            return None


def _timer() -> Any:
    from aiohttp.helpers import TimerNoop

    return TimerNoop()


def _plain(session: Any) -> bool:
    """The session applies nothing per call that the lean path would skip."""
    from aiohttp import DummyCookieJar
    from aiohttp.http import HttpVersion11

    connector = session._connector
    return (
        not session._trace_configs
        and not session._middlewares
        and session._default_proxy is None
        and session._default_proxy_auth is None
        and not session._trust_env
        and session._base_url is None
        and session._default_auth is None
        and isinstance(session._cookie_jar, DummyCookieJar)
        and not session._skip_auto_headers
        and session._raise_for_status is False
        and session._version == HttpVersion11
        and session._timeout.total is None
        and connector is not None
        and not connector.force_close
    )


def _check() -> list[str]:
    needs = Needs()
    client = needs.module("aiohttp.client")
    reqrep = needs.module("aiohttp.client_reqrep")
    connector = needs.module("aiohttp.connector")
    proto = needs.module("aiohttp.client_proto")
    helpers = needs.module("aiohttp.helpers")
    session = needs.attr(client, "ClientSession", "aiohttp.client")
    request = needs.attr(reqrep, "ClientRequest", "aiohttp.client_reqrep")
    response = needs.attr(reqrep, "ClientResponse", "aiohttp.client_reqrep")
    needs.attr(reqrep, "RequestInfo", "aiohttp.client_reqrep")
    needs.attr(needs.module("aiohttp.http"), "SERVER_SOFTWARE", "aiohttp.http")
    writer = needs.module("aiohttp.http_writer")
    pattern = needs.attr(writer, "_FORBIDDEN_HEADER_CHARS_RE", "aiohttp.http_writer")
    needs.require(
        pattern is None or all(pattern.search(c) for c in "\r\n\x00\x7f"),
        "aiohttp.http_writer._FORBIDDEN_HEADER_CHARS_RE lets a line break or NUL through",
    )
    needs.uses(getattr(writer, "_safe_header", None), ["_FORBIDDEN_HEADER_CHARS_RE"],
               "aiohttp.http_writer._safe_header")  # fmt: skip
    needs.attr(helpers, "TimerNoop", "aiohttp.helpers")
    defaults = needs.attr(request, "DEFAULT_HEADERS", "ClientRequest")
    needs.require(
        defaults is None or set(map(str.lower, defaults)) == {"accept", "accept-encoding"},
        "ClientRequest.DEFAULT_HEADERS is not Accept and Accept-Encoding",
    )
    # what _request does that the lean path does too (in its inner _connect_and_send_request),
    # and reads of the session
    send = _inner(getattr(session, "_request", None), "_connect_and_send_request")
    needs.require(send is not None, "ClientSession._request has no _connect_and_send_request")
    needs.uses(send, ["set_response_params", "send", "start", "connect"],
               "ClientSession._request's _connect_and_send_request")  # fmt: skip
    needs.uses(
        getattr(session, "_request", None),
        ["_prepare_headers", "_auto_decompress", "_read_bufsize", "_max_line_size",
         "_max_field_size", "_max_headers", "_trace_configs", "_middlewares",
         "_default_proxy", "_trust_env", "_default_auth", "_cookie_jar",
         "_skip_auto_headers", "_raise_for_status"],
        "ClientSession._request",
    )  # fmt: skip
    needs.uses(getattr(request, "update_headers", None), ["host_port_subcomponent"],
               "ClientRequest.update_headers")  # fmt: skip
    needs.uses(getattr(request, "send", None), ["raw_path_qs", "start_timeout"],
               "ClientRequest.send")  # fmt: skip
    key = getattr(getattr(request, "connection_key", None), "fget", None)
    if needs.require(key is not None, "ClientRequest.connection_key is not a property"):
        needs.uses(key, ["url", "_ssl", "proxy", "proxy_auth", "proxy_headers",
                         "server_hostname"], "ClientRequest.connection_key")  # fmt: skip
    tcp = needs.attr(connector, "TCPConnector", "aiohttp.connector")
    needs.function(tcp, "_get", "aiohttp.TCPConnector", ["self", "key", "traces"], coroutine=True)
    needs.function(tcp, "connect", "aiohttp.TCPConnector", ["self", "req", "traces", "timeout"],
                   coroutine=True)  # fmt: skip
    for step in CONNECTING_STEPS if tcp is not None else ():
        reads = _reads_of(getattr(tcp, step, None), "req")
        needs.require(
            reads is not None and reads <= CONNECTING_READS,
            f"TCPConnector.{step} reads what a connecting request does not hold: "
            f"{sorted((reads or {'(no code)'}) - CONNECTING_READS)}",
        )
    needs.uses(getattr(connector, "Connection", None) and connector.Connection.__init__,
               ["_key", "_protocol"], "Connection.__init__")  # fmt: skip
    handler = needs.attr(proto, "ResponseHandler", "aiohttp.client_proto")
    needs.function(
        handler, "set_response_params", "ResponseHandler",
        ["self", "timer", "skip_payload", "read_until_eof", "auto_decompress", "read_timeout",
         "read_bufsize", "timeout_ceil_threshold", "max_line_size", "max_field_size",
         "max_headers"],
        coroutine=False,
    )  # fmt: skip
    needs.function(handler, "start_timeout", "ResponseHandler", ["self"], coroutine=False)
    needs.function(
        response, "__init__", "ClientResponse",
        ["self", "method", "url", "writer", "continue100", "timer", "request_info", "traces",
         "loop", "session", "stream_writer"],
        coroutine=False,
    )  # fmt: skip
    needs.function(response, "start", "ClientResponse", ["self", "connection"], coroutine=True)
    needs.uses(getattr(response, "__init__", None), ["output_size"], "ClientResponse.__init__")
    return needs.missing


def _reads_of(func: Any, name: str) -> set[str] | None:
    """The attributes ``func``'s code reads of its argument ``name`` (``name.x`` and
    ``name.x()``); None for a function with no code."""
    code = getattr(original(func), "__code__", None)
    if code is None or name not in code.co_varnames:
        return None
    steps = list(dis.get_instructions(code))
    return {
        after.argval
        for step, after in zip(steps, steps[1:], strict=False)
        if step.opname == "LOAD_FAST" and step.argval == name
        and after.opname in ("LOAD_ATTR", "LOAD_METHOD")
    }  # fmt: skip


def _inner(func: Any, name: str) -> Any:
    """The code of the function named ``name`` defined inside ``func`` (held as ``uses``
    reads a function's)."""
    code = getattr(original(func), "__code__", None)
    for const in code.co_consts if code is not None else ():
        if getattr(const, "co_name", None) == name:
            return types.SimpleNamespace(__code__=const)
    return None


_apply, _in_place = module_flag(__name__)  # sets and reads _on


LEAN_SEND = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="each upstream call goes through ClientSession._request's layers (~1,600 bytecodes)",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (LEAN_SEND,)
