"""bench/RESULTS.md across a `make bench` run: the run writes its own sections anew and keeps
every other one (added by hand, or by `make bench-servers`, `make bench-burst` and `make
bench-agents`) where it was."""

from __future__ import annotations

from bench import agent_report, report

OLD = (
    "# Benchmark results\n\nWritten by the OLD run.\n\nReading notes on the OLD run.\n\n"
    "## A finding (by hand)\n\nkept before\n\n"
    "## Targets for the gateway\n\nold targets\n\n"
    "## (a) Non-streaming chat\n\nold a\n\n"
    "## (e) CPU per relayed request and profiles\n\nold e\n\n"
    "## Mends of third-party internals\n\nkept after\n\n"
    f"{agent_report.BEGIN}\n## Agent workloads\n\nagents table\n{agent_report.END}\n"
)
NEW = (
    "# Benchmark results\n\nWritten by the NEW run.\n\n"
    "## Targets for the gateway\n\nnew targets\n\n## (a) Non-streaming chat\n\nnew a\n"
)


def rewritten(old: str, new: str) -> str:
    return agent_report.carry(old, report.keep_sections(agent_report.without(old), new))


def test_a_full_run_keeps_the_sections_it_does_not_write_where_they_were() -> None:
    out = rewritten(OLD, NEW)
    headings = [line for line in out.splitlines() if line.startswith("## ")]
    assert headings == [
        "## A finding (by hand)",
        "## Targets for the gateway",
        "## (a) Non-streaming chat",
        "## Mends of third-party internals",
        "## Agent workloads",
    ]
    assert out.startswith("# Benchmark results\n\nWritten by the NEW run.")
    for gone in ("OLD run", "old targets", "old a", "old e"):  # the old run's own
        assert gone not in out
    for kept in ("kept before", "kept after", "agents table", "new targets", "new a"):
        assert out.count(kept) == 1
    assert out.count(agent_report.BEGIN) == 1 and out.endswith(agent_report.END + "\n")


def test_a_first_run_writes_its_report_alone() -> None:
    assert rewritten("", NEW) == NEW


def test_running_twice_changes_nothing_more() -> None:
    once = rewritten(OLD, NEW)
    assert rewritten(once, NEW) == once
