"""nginx configurations: the fixed-reply upstream and the proxy_pass relay (the machine's limit).

Both run in the foreground (``daemon off``) as children of the benchmark, with every path inside
a temporary directory. The upstream answers by location with ``return 200``; when Debian's echo
module is installed it also serves the paced stream (``echo_sleep`` + ``echo_flush``).
"""

from __future__ import annotations

from pathlib import Path

from bench import payloads

ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")


def _quote(raw: bytes) -> str:
    """An nginx single-quoted string holding raw (escapes as nginx's parser reads them)."""
    text = raw.decode()
    text = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return "'" + text + "'"


def _common(tmp: Path, name: str) -> str:
    return f"""
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}.error.log warn;
events {{ worker_connections 20000; multi_accept on; }}
"""


def _http_common(tmp: Path, name: str) -> str:
    return f"""
    access_log off;
    client_body_temp_path {tmp}/{name}-body;
    proxy_temp_path {tmp}/{name}-proxy;
    fastcgi_temp_path {tmp}/{name}-fcgi;
    uwsgi_temp_path {tmp}/{name}-uwsgi;
    scgi_temp_path {tmp}/{name}-scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    tcp_nodelay on;
"""


def paced_location(first_ms: int, delay_ms: int) -> str:
    events = payloads.sse_events()
    lines = [f"echo_sleep {first_ms / 1000:.3f};"]
    for i, event in enumerate(events):
        if i:
            lines.append(f"echo_sleep {delay_ms / 1000:.3f};")
        lines.append(f"echo -n {_quote(event)};")
        lines.append("echo_flush;")
    return "\n            ".join(lines)


def upstream_conf(tmp: Path, port: int, echo: bool, first_ms: int, delay_ms: int) -> str:
    """Locations /json/v1/..., /sse/v1/..., /embeddings/v1/embeddings and (with echo)
    /paced/v1/chat/completions.

    The SSE and embeddings replies are longer than an nginx config token, so each is a static
    file behind an ``error_page`` redirect (which turns the POST into a GET the static module
    serves)."""
    sse_file = tmp / "sse-reply.txt"
    sse_file.write_bytes(payloads.sse_reply())
    embed_file = tmp / "embeddings-reply.json"
    embed_file.write_bytes(payloads.embeddings_reply())
    load = f"load_module {ECHO_MODULE};\n" if echo else ""
    paced = ""
    if echo:
        paced = f"""
        location = /paced/v1/chat/completions {{
            default_type text/event-stream;
            {paced_location(first_ms, delay_ms)}
        }}"""
    return f"""{load}{_common(tmp, "upstream")}
http {{
{_http_common(tmp, "upstream")}
    server {{
        listen 127.0.0.1:{port} backlog=8192;
        location = /json/v1/chat/completions {{
            default_type application/json;
            return 200 {_quote(payloads.json_reply())};
        }}
        location = /sse/v1/chat/completions {{ error_page 405 =200 /_sse; return 405; }}
        location = /_sse {{ internal; default_type text/event-stream; alias {sse_file}; }}
        location = /embeddings/v1/embeddings {{ error_page 405 =200 /_emb; return 405; }}
        location = /_emb {{ internal; default_type application/json; alias {embed_file}; }}{paced}
        location = /healthz {{ return 200 'ok'; }}
    }}
}}
"""


def relay_conf(tmp: Path, port: int, upstream_port: int, paced: tuple[int, str]) -> str:
    """proxy_pass relay: /json/, /sse/ and /embeddings/ to the nginx upstream, /pacedrelay/ to
    the paced upstream (port, base path), with upstream keep-alive and unbuffered streams."""
    paced_port, paced_path = paced
    proxy = """proxy_http_version 1.1;
            proxy_set_header Connection "";"""
    return f"""{_common(tmp, "relay")}
http {{
{_http_common(tmp, "relay")}
    upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}
    upstream paced {{ server 127.0.0.1:{paced_port}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=8192;
        location /json/ {{ proxy_pass http://up; {proxy} }}
        location /sse/ {{ proxy_pass http://up; proxy_buffering off; {proxy} }}
        location /embeddings/ {{ proxy_pass http://up; {proxy} }}
        location /pacedrelay/ {{
            proxy_pass http://paced{paced_path.rstrip("/")}/; proxy_buffering off; {proxy}
        }}
    }}
}}
"""
