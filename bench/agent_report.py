"""The agent workloads' section of bench/RESULTS.md: one table per workload, ratios to Portkey,
LiteLLM and the nginx relay, and the gateway judged against each workload's target (≥ 4×
Portkey and ≥ 40× LiteLLM on chat, ≥ 3× Portkey on each agent workload: ``Workload``).

The section sits between two markers, so `make bench-agents` replaces only it and `make bench`,
which writes the rest of the file, keeps it (``carry``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from bench import agent_payloads
from bench.agent_payloads import Workload

BEGIN, END = "<!-- bench-agents:begin -->", "<!-- bench-agents:end -->"
PORTKEY, LITELLM, NGINX = "portkey", "litellm", "nginx-relay"
# the paced stream's own length: the first event after LONG_FIRST_MS, then one every
# LONG_DELAY_MS (the chunks, a usage chunk and [DONE])
PACE_MS = (
    agent_payloads.LONG_FIRST_MS
    + (len(agent_payloads.long_events()) - 1) * agent_payloads.LONG_DELAY_MS
)


def _num(x: Any, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def fmt(cell: dict[str, Any]) -> str:
    if "cannot" in cell:
        return "not measured: " + " ".join(str(cell["cannot"]).split())[:300]
    mem = f"peak RSS {cell['peak_rss_kib'] / 1024:.0f} MiB"
    if "rps" in cell:
        return (
            f"{cell['rps']:,.0f} req/s  p50 {_num(cell['p50'], 2)} ms  p99 {_num(cell['p99'], 2)}"
            f" ms  errors {cell['errors']}  cpu {_num(cell['cpu_us'], 0)} µs/req  {mem}"
        )
    return (
        f"{cell['completed']}/{cell['n']} streams  ttfb p50 {_num(cell['ttfb_p50'])} p99 "
        f"{_num(cell['ttfb_p99'])} ms  total p50 {_num(cell['total_p50'])} p99 "
        f"{_num(cell['total_p99'])} ms  cpu {_num(cell['cpu_us'], 0)} µs/stream  {mem}"
    )


def _measured(cell: dict[str, Any] | None) -> bool:
    return bool(cell) and "cannot" not in cell  # type: ignore[operator]


def times(cells: dict[str, Any], name: str, ref: str, key: str = "rps") -> float | None:
    """name's measure over ref's (for CPU, ref's over name's: less is better)."""
    mine, theirs = cells.get(name), cells.get(ref)
    if not _measured(mine) or not _measured(theirs):
        return None
    a, b = (mine[key], theirs[key]) if key == "rps" else (theirs[key], mine[key])  # type: ignore[index]
    return a / b if b and not math.isnan(a) and not math.isnan(b) else None


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}×"


def _wrk_table(cells: dict[str, Any]) -> list[str]:
    rows = [
        "| relay | req/s | p50 ms | p99 ms | errors | CPU µs/req | peak RSS MiB "
        "| × Portkey | Portkey's CPU ÷ this | × LiteLLM | of nginx relay |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cell in cells.items():
        if not _measured(cell):
            rows.append(_missing(name, cell, 11))
            continue
        nginx = times(cells, name, NGINX)
        rows.append(
            f"| {name} | {cell['rps']:,.0f} | {_num(cell['p50'], 2)} | {_num(cell['p99'], 2)} "
            f"| {cell['errors']} | {_num(cell['cpu_us'], 0)} | {cell['peak_rss_kib'] / 1024:.0f} "
            f"| {_x(times(cells, name, PORTKEY))} | {_x(times(cells, name, PORTKEY, 'cpu_us'))} "
            f"| {_x(times(cells, name, LITELLM))} "
            f"| {'–' if nginx is None or name == NGINX else f'{nginx:.1%}'} |"
        )
    return rows


def _paced_table(cells: dict[str, Any]) -> list[str]:
    rows = [
        "| relay | streams done | TTFB p50 ms | TTFB p99 ms | total p50 ms | total p99 ms "
        f"| total p99 − pace ({PACE_MS:,} ms) | CPU µs/stream | peak RSS MiB "
        "| Portkey's CPU ÷ this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cell in cells.items():
        if not _measured(cell):
            rows.append(_missing(name, cell))
            continue
        gap = _num(cell["total_p99"] - PACE_MS, 1)
        rows.append(
            f"| {name} | {cell['completed']}/{cell['n']} | {_num(cell['ttfb_p50'])} "
            f"| {_num(cell['ttfb_p99'])} | {_num(cell['total_p50'])} | {_num(cell['total_p99'])} "
            f"| {gap} | {_num(cell['cpu_us'], 0)} | {cell['peak_rss_kib'] / 1024:.0f} "
            f"| {_x(times(cells, name, PORTKEY, 'cpu_us'))} |"
        )
    return rows


def _missing(name: str, cell: dict[str, Any], columns: int = 10) -> str:
    """The row of a relay that could not do a workload, saying why on one line."""
    why = " ".join(str(cell.get("cannot", "not run")).split()).replace("|", "/")
    return f"| {name} | {why[:200]} |" + " |" * (columns - 2)


def _target(work: Workload) -> str:
    lite = f", ≥ {work.times_litellm:g}× LiteLLM" if work.times_litellm else ""
    return f"≥ {work.times_portkey:g}× Portkey{lite}"


def verdicts(results: dict[str, Any], works: list[Workload]) -> list[str]:
    """Each gateway target against its multiple of Portkey (and of LiteLLM, for chat): req/s,
    or for the paced stream (whose pace the upstream sets) CPU per stream; beside req/s,
    Portkey's CPU per request over the gateway's (what a loaded machine moves least)."""
    rows = [
        "| gateway | workload | target | × Portkey | Portkey's CPU ÷ this | × LiteLLM | verdict |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    names = sorted({n for cells in results.values() for n in cells if n.startswith("gateway-")})
    for name in names:
        for work in works:
            cells = results.get(work.key, {})
            key = "cpu_us" if work.paced else "rps"
            ratio = times(cells, name, PORTKEY, key)
            what = "CPU per stream" if work.paced else "req/s"
            if ratio is None:
                who, cell = next(
                    ((w, cells[n]) for w, n in (("Portkey", PORTKEY), ("gateway", name))
                     if n in cells and not _measured(cells[n])),
                    ("", {}),
                )  # fmt: skip
                why = " ".join(str(cell.get("cannot", "not run")).split()).replace("|", "/")
                rows.append(
                    f"| {name} | {work.title} | {_target(work)} | – | – | – "
                    f"| n/a ({who}: {why[:160]}) |"
                )
                continue
            lite = times(cells, name, LITELLM, key)
            ok = ratio >= work.times_portkey and cells[name]["errors"] == 0
            if work.times_litellm:
                ok = ok and lite is not None and lite >= work.times_litellm
            cpu = "" if work.paced else _x(times(cells, name, PORTKEY, "cpu_us"))
            rows.append(
                f"| {name} | {work.title} ({what}) | {_target(work)} | {ratio:.2f}× "
                f"| {cpu or '(the same)'} | {_x(lite)} | {'**PASS**' if ok else '**FAIL**'} |"
            )
    return rows


def render(results: dict[str, Any], works: list[Workload], info: dict[str, str]) -> str:
    lines = [
        BEGIN,
        "## Agent workloads (`make bench-agents`)",
        "",
        f"Written by `python -m bench.agents` on {info.get('started')} in {info.get('minutes')}"
        f" min, commit {info.get('commit')}. Versions: LiteLLM {info.get('litellm')} "
        f"(`litellm[proxy]`, PyPI), Portkey gateway {info.get('portkey')} "
        f"(`@portkey-ai/gateway`, npm, on Node {info.get('node')}), this gateway on its default "
        f"server ({info.get('default')}). Load average (1, 5, 15 min) at the start: "
        f"{info.get('load')}; at the end: {info.get('load_after')}.",
        "",
        f"Command: `make bench-agents` (`python -m bench.peers` installs the pinned peers, then "
        f"`python -m bench.agents`). One cell per relay and workload: wrk `-t1 "
        f"-c{info.get('conns')} -d{info.get('seconds')}s` after 1 s of warm-up; the paced stream "
        f"as {info.get('streams')} concurrent streams (bench.streams) after 8 untimed ones. "
        "Every relay runs one "
        "process pinned to core 0 (the others paused while one is measured); the nginx "
        "upstream, wrk and the stream client on core 1. CPU is utime+stime of the relay's "
        "processes over the cell; peak RSS sampled every 50 ms. Each reply is checked (wrk's "
        "Lua) for its end marker. Portkey is told the upstream by `x-portkey-provider: openai` "
        "and `x-portkey-custom-host` and sends the model name as given; LiteLLM and the gateway "
        "map it to the upstream's.",
        "",
    ]
    for work in works:
        cells = results.get(work.key, {})
        lines += [f"### {work.title}", ""]
        lines += _paced_table(cells) if work.paced else _wrk_table(cells)
        lines.append("")
    lines += ["### Targets", ""] + verdicts(results, works) + ["", END]
    return "\n".join(lines) + "\n"


def splice(old: str, section: str) -> str:
    """old with its agents section replaced by section (appended when it has none)."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
    if pattern.search(old):
        return pattern.sub(lambda _: section, old, count=1)
    return old.rstrip("\n") + ("\n\n" if old else "") + section


def without(text: str) -> str:
    """text with its agents section taken out."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
    return pattern.sub("", text, count=1)


def carry(old: str, new: str) -> str:
    """new (a whole RESULTS.md written by `make bench`) with old's agents section kept."""
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", old, re.S)
    return splice(new, found.group(0)) if found else new
