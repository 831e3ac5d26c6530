"""bench/RESULTS.md: one table per scenario, ratios to nginx, LiteLLM and the bare relay, and
the gateway's targets judged pass/fail per cell."""

from __future__ import annotations

import math
import os
import platform
import re
import statistics
from typing import Any

from bench import instructions, payloads
from bench.targets import DEFAULT_SERVER

NGINX = "nginx-relay"
LITELLM = "litellm"
GATEWAY = f"gateway-{DEFAULT_SERVER}-1w"  # the gateway the targets are judged on
NO_METRICS = GATEWAY + "-nometrics"  # the same gateway with metrics and access log off
KINDS = instructions.KINDS
# targets the gateway must meet
MIN_SHARE_OF_BARE = 0.85
MIN_SHARE_OF_NO_METRICS = 0.95  # metrics on the hot path cost at most 5%
MAX_ADDED_P50_MS, MAX_ADDED_P99_MS = 1.0, 3.0
MAX_TTFB_GAP_MS = 2.0
TTFB_STREAMS = 1000
BIG_STREAMS, MAX_KIB_PER_STREAM = 10000, 30.0
# the sections ``render`` writes: any other one in the file is kept by ``keep_sections``
OWN_HEADING = re.compile(r"## (Targets for the gateway|\([a-z]\) )")


def _num(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def fmt_wrk(cell: dict[str, Any]) -> str:
    return (
        f"{cell['rps']:,.0f} req/s  p50 {cell['p50']:.2f} ms  p99 {cell['p99']:.2f} ms  "
        f"errors {cell['errors']}  cpu {cell['cpu_us']:,.0f} µs/req"
    )


def fmt_streams(cell: dict[str, Any]) -> str:
    return (
        f"ttfb p50 {_num(cell['ttfb_p50'])} ms p99 {_num(cell['ttfb_p99'])} ms  "
        f"completion {cell['completion']:.3f}  errors {cell['errors']}  "
        f"rss/stream {_num(cell['rss_per_stream_kib'])} KiB  ({cell['seconds']:.1f}s)"
    )


def bare_for(name: str) -> str:
    """The bare relay a target's share is taken of: its own server's (a bare relay's is
    itself)."""
    if name.startswith("gateway-"):
        return "bare-" + name.split("-")[1]
    if name.startswith("bare-"):
        return name
    return f"bare-{DEFAULT_SERVER}"


def _same_turn(cell: dict[str, Any], ref: dict[str, Any]) -> list[float]:
    """cell's req/s over ref's, turn by turn (both measured in the same turn of the run); []
    when the two were not measured turn for turn."""
    mine, theirs = cell.get("rps_reps") or [], ref.get("rps_reps") or []
    if len(mine) != len(theirs) or not all(theirs):
        return []
    return [m / t for m, t in zip(mine, theirs, strict=True)]


def share(cell: dict[str, Any], ref: dict[str, Any]) -> float | None:
    """cell's req/s as a share of ref's: the median of the same-turn ratios, else the ratio of
    the medians."""
    ratios = _same_turn(cell, ref)
    if ratios:
        return statistics.median(ratios)
    return cell["rps"] / ref["rps"] if ref["rps"] else None


def turn_ratios(cell: dict[str, Any], ref: dict[str, Any]) -> str:
    """The lowest and highest of the same-turn ratios, as percentages ('' with one turn)."""
    ratios = _same_turn(cell, ref)
    return f" (turns {min(ratios):.0%}–{max(ratios):.0%})" if len(ratios) > 1 else ""


def _ratio(cells: dict[str, Any], name: str, ref: str, key: Any) -> str:
    if name == ref or ref not in cells or key not in cells[ref] or key not in cells.get(name, {}):
        return "–"
    ratio = share(cells[name][key], cells[ref][key])
    return "–" if ratio is None else f"{ratio:.3f}"


def _wrk_table(cells: dict[str, Any], conns: list[int]) -> list[str]:
    rows = [
        "| target | conns | req/s | p50 ms | p99 ms | errors | CPU µs/req "
        "| × nginx relay | × LiteLLM | × bare relay |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in conns:
        for name, by_conn in cells.items():
            if c not in by_conn:
                continue
            cell = by_conn[c]
            rows.append(
                f"| {name} | {c} | {cell['rps']:,.0f} | {_num(cell['p50'], 2)} "
                f"| {_num(cell['p99'], 2)} "
                f"| {cell['errors']} | {cell['cpu_us']:,.0f} | {_ratio(cells, name, NGINX, c)} "
                f"| {_ratio(cells, name, LITELLM, c)} | {_ratio(cells, name, bare_for(name), c)} |"
            )
    return rows


def _streams_table(cells: dict[str, Any], counts: list[int]) -> list[str]:
    rows = [
        "| target | streams (held / asked) | TTFB p50 ms | TTFB p99 ms | p50 − direct "
        "| completion | errors | RSS per stream KiB | peak RSS MiB | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    direct = cells.get("direct", {})
    for n in counts:
        for name, by_n in cells.items():
            if n not in by_n:
                continue
            cell = by_n[n]
            gap = "–"
            if name != "direct" and n in direct:
                gap = _num(cell["ttfb_p50"] - direct[n]["ttfb_p50"], 2)
            rows.append(
                f"| {name} | {cell['n']:,} / {n:,} | {_num(cell['ttfb_p50'], 2)} "
                f"| {_num(cell['ttfb_p99'], 2)} | {gap} | {cell['completion']:.4f} "
                f"| {cell['errors']} | {_num(cell['rss_per_stream_kib'])} "
                f"| {_num(cell['peak_rss_kib'] / 1024)} | {cell['seconds']:.1f} |"
            )
    return rows


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


# the wrk scenarios: (scenario, label, the kind instructions.py counts for it, if any)
WRK_SCENARIOS = (
    ("a", "non-stream", KINDS[0]),
    ("b", "stream", KINDS[1]),
    ("f", "embeddings", None),
)


def _targets(
    results: dict[str, Any],
    conns: list[int],
    stream_conns: list[int],
    embed_conns: list[int] | None = None,
) -> list[str]:
    rows = ["| target | cell | measured | verdict |", "|---|---|---|---|"]
    by_scen = {"a": conns, "b": stream_conns, "f": embed_conns or []}
    for scen, label, kind in WRK_SCENARIOS:
        cs = by_scen[scen]
        if scen == "f" and not results.get("f"):
            continue  # not run: no rows
        cells = results.get(scen, {})
        gw, bare = cells.get(GATEWAY, {}), cells.get(bare_for(GATEWAY), {})
        for c in cs:
            measured = share(gw[c], bare[c]) if c in gw and c in bare else None
            if measured is not None:
                rows.append(
                    f"| throughput ≥ {MIN_SHARE_OF_BARE:.0%} of bare relay (same server) "
                    f"| ({scen}) {label}, {c} conns | {measured:.1%}{turn_ratios(gw[c], bare[c])} "
                    f"| {_verdict(measured >= MIN_SHARE_OF_BARE and gw[c]['errors'] == 0)} |"
                )
            else:
                rows.append(f"| throughput vs bare relay | ({scen}) {label}, {c} conns | – | n/a |")
        counted = results.get("e_instructions", {}) if kind else {}
        gi, bi = counted.get(GATEWAY, {}).get(kind), counted.get(bare_for(GATEWAY), {}).get(kind)
        if gi and bi:
            counted_share = bi / gi
            rows.append(
                f"| same, from instructions per request (callgrind, noise-free) "
                f"| ({scen}) {label} | {counted_share:.1%} "
                f"| {_verdict(counted_share >= MIN_SHARE_OF_BARE)} |"
            )
        direct = cells.get("direct", {})
        # the latency targets name no server: each gateway server is shown
        for name in [n for n in cells if n.startswith("gateway-") and n.endswith("-1w")]:
            one = cells[name]
            if 1 not in one or 1 not in direct:
                continue
            d50 = one[1]["p50"] - direct[1]["p50"]
            d99 = one[1]["p99"] - direct[1]["p99"]
            ok50, ok99 = _verdict(d50 <= MAX_ADDED_P50_MS), _verdict(d99 <= MAX_ADDED_P99_MS)
            rows.append(
                f"| added p50 over direct ≤ {MAX_ADDED_P50_MS:g} ms, {name} "
                f"| ({scen}) {label}, 1 conn | {d50:+.2f} ms | {ok50} |"
            )
            rows.append(
                f"| added p99 over direct ≤ {MAX_ADDED_P99_MS:g} ms, {name} "
                f"| ({scen}) {label}, 1 conn | {d99:+.2f} ms | {ok99} |"
            )
    rows += _metrics_cost(results, by_scen)
    c = results.get("c", {})
    gw, direct = c.get(GATEWAY, {}), c.get("direct", {})
    if TTFB_STREAMS in gw and TTFB_STREAMS in direct:
        for q in ("ttfb_p50", "ttfb_p99"):
            gap = gw[TTFB_STREAMS][q] - direct[TTFB_STREAMS][q]
            rows.append(
                f"| paced TTFB {q[-3:]} within {MAX_TTFB_GAP_MS:g} ms of direct "
                f"| (c) {TTFB_STREAMS:,} streams | {gap:+.2f} ms "
                f"| {_verdict(not math.isnan(gap) and gap <= MAX_TTFB_GAP_MS)} |"
            )
    else:
        rows.append(f"| paced TTFB vs direct | (c) {TTFB_STREAMS:,} streams | – | n/a |")
    if BIG_STREAMS in gw:
        cell = gw[BIG_STREAMS]
        held = f"{cell['n']:,} held" + (" (fd limit)" if cell["n"] < BIG_STREAMS else "")
        rows.append(
            f"| no errors | (c) {BIG_STREAMS:,} streams | {cell['errors']} errors, {held} "
            f"| {_verdict(cell['errors'] == 0 and cell['n'] >= BIG_STREAMS)} |"
        )
        kib = cell["rss_per_stream_kib"]
        rows.append(
            f"| < {MAX_KIB_PER_STREAM:g} KiB RSS per stream | (c) {BIG_STREAMS:,} streams "
            f"| {_num(kib)} KiB | {_verdict(kib < MAX_KIB_PER_STREAM)} |"
        )
    else:
        rows.append(f"| 10,000 streams | (c) {BIG_STREAMS:,} streams | – | n/a |")
    return rows


def _metrics_cost(results: dict[str, Any], by_scen: dict[str, list[int]]) -> list[str]:
    """The cost of metrics and the access log on the hot path: the gateway's throughput with
    them on as a share of its throughput with them off, measured beside each other turn by
    turn, and the same from instructions per request."""
    rows = []
    counted = results.get("e_instructions", {})
    for scen, label, kind in WRK_SCENARIOS[:2]:
        cells = results.get(scen, {})
        on, off = cells.get(GATEWAY, {}), cells.get(NO_METRICS, {})
        for c in by_scen[scen]:
            if c not in on or c not in off:
                continue
            measured = share(on[c], off[c])
            if measured is None:
                continue
            rows.append(
                f"| metrics and access log on: throughput ≥ {MIN_SHARE_OF_NO_METRICS:.0%} of off "
                f"| ({scen}) {label}, {c} conns | {measured:.1%}{turn_ratios(on[c], off[c])} "
                f"| {_verdict(measured >= MIN_SHARE_OF_NO_METRICS and on[c]['errors'] == 0)} |"
            )
        with_them = counted.get(GATEWAY, {}).get(kind)
        without = counted.get(NO_METRICS, {}).get(kind)
        if with_them and without:
            ratio = without / with_them
            rows.append(
                "| same, from instructions per request (callgrind, noise-free) "
                f"| ({scen}) {label} | {ratio:.1%} "
                f"({(with_them - without) / 1000:,.0f}k instructions a request) "
                f"| {_verdict(ratio >= MIN_SHARE_OF_NO_METRICS)} |"
            )
    return rows


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
        for line in lines:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def render(
    results: dict[str, Any],
    settings: Any,
    streams: list[int],
    conns: list[int],
    stream_conns: list[int],
    converted_n: int,
    embed_conns: list[int] | None = None,
) -> str:
    mode = "QUICK smoke run (BENCH_QUICK=1)" if settings.quick else "full run"
    out = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`python -m bench.run`) on {settings.started}; {mode}, "
        f"{settings.seconds / 60:.1f} min.",
        "",
        f"- Machine: {os.cpu_count()} cores ({_cpu_model()}), Linux {platform.release()}.",
        "- Pinning: each relay target runs under `taskset -c 0`; the nginx upstream, wrk, the "
        "stream client and py-spy run under `taskset -c 1`. `gateway-…-2w-unpinned` is not "
        "pinned (two workers over both cores, sharing them with the load generator).",
        f"- Cells: wrk `-t1 -c<conns> -d{settings.duration:g}s --timeout 10s`, "
        f"{settings.reps} repetition(s) per cell, taken in turns across the targets (all "
        "started first; each pinned gateway measured right beside the bare relay of its "
        "server, which of the two goes first alternating); the table shows the median req/s, "
        "p50 and p99 over repetitions and the sum of errors; a ratio is the median of the "
        "ratios of the same turn. An error is a socket error, a timeout, "
        "a status other than 200, or a reply body lacking the expected content (wrk's Lua "
        "checks every reply).",
        "- Upstream: nginx `return 200` with a fixed 827-byte chat.completion (JSON) and a "
        "static 20-chunk SSE reply with a usage chunk and `[DONE]`; paced streams wait 200 ms "
        "before the first chunk, then 25 ms between chunks. Embeddings: a static "
        f"{len(payloads.embeddings_reply()):,}-byte reply of {payloads.EMBED_INPUTS} vectors "
        f"× {payloads.EMBED_DIMS} floats with usage, to a request of "
        f"{payloads.EMBED_INPUTS} short texts asking for floats.",
        "- Relays rewrite `model` (`bench-json` → `upstream-model`). The bare relay is "
        "`bench/bare_relay.py` (raw ASGI, orjson, one aiohttp session, unlimited pool).",
        f"- `{NO_METRICS}` is `{GATEWAY}` with `metrics: {{enabled: false}}` and "
        "`logging: {access: false}`, measured beside it in every turn of (a) and (b) and "
        "counted by callgrind in (e): the cost of metrics and the access log on the hot path "
        "(the targets table's share of on to off). It runs no other scenario.",
        "- CPU µs/req: utime+stime of the target's process tree over the cell, divided by "
        "requests served (for `direct` it is the nginx upstream itself).",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in settings.versions.items()) + ".",
        "",
    ]
    if settings.commands:
        out += ["Commands:", ""] + [f"    {c}" for c in settings.commands] + [""]
    if settings.notes:
        out += ["Notes:", ""] + [f"- {n}" for n in settings.notes] + [""]
    out += ["## Targets for the gateway", ""]
    out += _targets(results, conns, stream_conns, embed_conns) + [""]
    out += ["## (a) Non-streaming chat", ""]
    out += _wrk_table(results.get("a", {}), conns) + [""]
    out += ["## (b) Streaming chat, 20 chunks", ""]
    out += _wrk_table(results.get("b", {}), stream_conns) + [""]
    out += [
        "## (c) Paced streams held open together",
        "",
        "`bench/streams.py` opens N connections first (untimed), then every connection posts "
        "one streaming request, starts spread over 100 ms, so all N are open while the "
        "upstream waits 200 ms before its first chunk. TTFB: request sent → first `data:` "
        "byte. Completion: status 200 and `[DONE]` seen. RSS per stream: peak RSS of the "
        "target's process tree during the cell (sampled every 20 ms) minus its RSS right "
        "after start-up and one warm-up request, divided by streams. A relay holds two "
        "sockets per stream, and the hard RLIMIT_NOFILE here cannot be raised, so a cell "
        "larger than the limit allows holds fewer streams than asked (shown). The 10,000 "
        "cell runs once; LiteLLM runs only the smallest cell.",
        "",
    ]
    out += _streams_table(results.get("c", {}), streams) + [""]
    out += ["## (d) Converted stream vs pass-through", ""]
    d = results.get("d", {})
    if not d:
        out += ["Not run.", ""]
    else:
        out += [
            f"{converted_n} paced streams. Pass-through: `/v1/chat/completions` → openai "
            "channel. Converted: Anthropic `/v1/messages` (stream) → openai channel.",
            "",
            "| target | stream | TTFB p50 ms | TTFB p99 ms | completion | errors |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, kinds in d.items():
            for kind, cell in kinds.items():
                if set(cell["statuses"]) == {"404"}:
                    out.append(f"| {name} | {kind} | not available (404) | | | |")
                    continue
                out.append(
                    f"| {name} | {kind} | {_num(cell['ttfb_p50'], 2)} "
                    f"| {_num(cell['ttfb_p99'], 2)} | {cell['completion']:.4f} "
                    f"| {cell['errors']} |"
                )
        out.append("")
    out += ["## (e) CPU per relayed request and profiles", ""]
    out += ["| target | non-stream µs/req (64 conns) | stream µs/req (64 conns) |"]
    out += ["|---|---:|---:|"]
    for name in results.get("a", {}):
        a = results["a"][name].get(64, {}).get("cpu_us")
        b = results.get("b", {}).get(name, {}).get(64, {}).get("cpu_us")
        out.append(f"| {name} | {_num(a, 0)} | {_num(b, 0)} |")
    out.append("")
    out += _instructions_table(results.get("e_instructions", {}))
    out += _converted_table(results.get("e_converted", {}))
    for name, note in results.get("e", {}).items():
        out.append(f"- py-spy profile of {name}: {note}")
    out.append("")
    out += _embeddings_section(results.get("f", {}), embed_conns or [])
    return "\n".join(out)


def _embeddings_section(cells: dict[str, Any], embed_conns: list[int]) -> list[str]:
    out = ["## (f) Embeddings, 2 inputs × 256 floats", ""]
    if not cells:
        return out + ["Not run.", ""]
    out += [
        "`POST /v1/embeddings` (direct: the nginx upstream's `/embeddings/v1/embeddings`), "
        "measured as (a): wrk cells in turns, each gateway beside its bare relay. The bare "
        "relay posts the body to the upstream's `/embeddings` with the model renamed; the "
        "gateway serves the model from an openai channel (body through, model renamed both "
        "ways). Targets: " + ", ".join(cells) + f". By default only direct, {bare_for(GATEWAY)}, "
        f"{GATEWAY} and LiteLLM, to keep the run short (`BENCH_EMBED_TARGETS=all` "
        "runs every target); a target that fails the kind is left out with a note above.",
        "",
    ]
    return out + _wrk_table(cells, embed_conns) + [""]


def _instructions_table(cells: dict[str, dict[str, float]]) -> list[str]:
    """Instructions per request (callgrind): repeatable where wall time is not."""
    if not cells:
        return []
    out = [
        "Instructions per relayed request, counted by callgrind (`bench/instructions.py`: "
        f"{instructions.REQUESTS} requests, {instructions.CONNS} at a time, after a warm-up; "
        "every process of the target). The gateway's clock-driven intervals (usage batch "
        "linger, disconnect watchlist, key cache reload, periodic collections) are stretched "
        f"{instructions.SLOWDOWN}×, callgrind's slowdown, so that each request carries its "
        "real share of that work (`bench/clock_scaled.py`). The counts come back to ~0.1% run "
        "after run, so bare ÷ gateway estimates the throughput share free of the machine's "
        "noise. It is not time: CPython's byte searches retire several instructions a cycle, "
        "interpreted code about one, and kernel time is not counted.",
        "",
        "| target | non-stream k instr/req | stream k instr/req | non-stream share | "
        "stream share |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, per in cells.items():
        bare = cells.get(bare_for(name), {})  # each gateway beside its own server's bare relay
        shares = [f"{bare[k] / per[k]:.1%}" if bare.get(k) and per.get(k) else "–" for k in KINDS]
        kinstr = [_num(per[k] / 1000, 0) if per.get(k) else "–" for k in KINDS]
        out.append(f"| {name} | {kinstr[0]} | {kinstr[1]} | {shares[0]} | {shares[1]} |")
    out.append("")
    return out


# the converted-stream cell the others are held to: within 15% of its instructions a request
CONVERTED_REFERENCE = "anthropic-sse"
CONVERTED_BOUND = 1.15


def _converted_table(cells: dict[str, float]) -> list[str]:
    """Instructions per converted chat-completions stream, by upstream protocol."""
    ref = cells.get(CONVERTED_REFERENCE)
    if not cells or not ref:
        return []
    out = [
        "Converted streams (`python -m bench.instructions converted`): a chat-completions "
        "client's stream with usage, 20 pieces of text, converted from each upstream protocol "
        "the bundled fake upstream speaks (an anthropic channel's SSE; Bedrock's event streams "
        "of Claude through invoke and of Nova through Converse, SigV4 signing included), "
        f"counted as above on one {DEFAULT_SERVER} worker. Held to within "
        f"{CONVERTED_BOUND - 1:.0%} of the Anthropic stream's instructions a request.",
        "",
        "| upstream | k instr/req | of anthropic | verdict |",
        "|---|---:|---:|---|",
    ]
    for name, per in cells.items():
        ratio = per / ref
        verdict = "" if name == CONVERTED_REFERENCE else _verdict(ratio <= CONVERTED_BOUND)
        out.append(f"| {name} | {_num(per / 1000, 0)} | {ratio:.3f} | {verdict} |")
    out.append("")
    return out


def _sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A results file as its preamble and its ``## `` sections, each (heading line, text)."""
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line.rstrip("\n"), [line]))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return "".join(preamble), [(heading, "".join(lines)) for heading, lines in sections]


def _ended(block: str) -> str:
    return block.rstrip("\n") + "\n\n"


def keep_sections(old: str, new: str) -> str:
    """``new`` (a whole file as ``render`` writes it) with ``old``'s sections that it does not
    write itself: those added by hand or by another command (``make bench-servers``, ``make
    bench-burst``), each kept whole. Those that came before the old run's first section of
    its own go before the new run's first, the rest after its last. The old preamble (the
    old run's header and its reading notes) is the old run's, and goes with it."""
    _, old_sections = _sections(old)
    preamble, new_sections = _sections(new)
    before: list[str] = []
    after: list[str] = []
    seen_own = False
    for heading, block in old_sections:
        if OWN_HEADING.match(heading):  # the old run's own, a scenario this run left out too
            seen_own = True
        else:
            (after if seen_own else before).append(_ended(block))
    body = [_ended(block) for _, block in new_sections]
    return (_ended(preamble) + "".join(before + body + after)).rstrip("\n") + "\n"
