"""The benchmark's pairing: each pinned gateway is measured beside its bare relay, and its
share of the bare relay is taken turn by turn."""

from __future__ import annotations

import pytest

from bench import report
from bench.report import share, turn_ratios
from bench.run import turn_order
from bench.targets import Target


def _target(name: str, group: str, server: str, pinned: bool = True) -> Target:
    return Target(name, group, server, 0, None, {}, pinned=pinned)


LIVE = [
    _target("direct", "direct", "nginx"),
    _target("bare-hypercorn", "bare", "hypercorn"),
    _target("bare-uvicorn", "bare", "uvicorn"),
    _target("litellm", "litellm", "uvicorn"),
    _target("gateway-hypercorn-1w", "gateway", "hypercorn"),
    _target("gateway-hypercorn-2w-unpinned", "gateway", "hypercorn", pinned=False),
    _target("gateway-uvicorn-1w", "gateway", "uvicorn"),
]


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        (
            0,
            ["direct", "bare-hypercorn", "gateway-hypercorn-1w", "bare-uvicorn",
             "gateway-uvicorn-1w", "litellm", "gateway-hypercorn-2w-unpinned"],
        ),
        (
            1,
            ["direct", "gateway-hypercorn-1w", "bare-hypercorn", "gateway-uvicorn-1w",
             "bare-uvicorn", "litellm", "gateway-hypercorn-2w-unpinned"],
        ),
    ],
)  # fmt: skip
def test_each_gateway_is_measured_beside_its_bare_relay(turn: int, expected: list[str]) -> None:
    assert [t.name for t in turn_order(LIVE, turn)] == expected


def test_a_gateway_without_its_bare_relay_keeps_its_place() -> None:
    live = [t for t in LIVE if t.name != "bare-uvicorn"]
    names = [t.name for t in turn_order(live, 0)]
    assert names[-2:] == ["gateway-hypercorn-2w-unpinned", "gateway-uvicorn-1w"]
    assert sorted(names) == sorted(t.name for t in live)


def test_share_is_the_median_of_the_ratios_of_each_turn() -> None:
    # the machine slowed down in the second turn: both targets slowed with it
    gateway = {"rps": 900.0, "rps_reps": [900.0, 500.0, 950.0]}
    bare = {"rps": 1000.0, "rps_reps": [1000.0, 520.0, 1000.0]}
    # ratio of medians: 900 / 1000 = 0.90; turn by turn: 0.90, 0.96, 0.95 -> 0.95
    assert share(gateway, bare) == pytest.approx(0.95)


def test_share_falls_back_to_the_ratio_of_medians() -> None:
    assert share({"rps": 850.0}, {"rps": 1000.0}) == pytest.approx(0.85)
    assert share({"rps": 850.0, "rps_reps": [850.0]}, {"rps": 0.0, "rps_reps": [0.0]}) is None


def test_the_spread_of_the_turns_is_shown() -> None:
    gateway = {"rps": 900.0, "rps_reps": [900.0, 500.0, 950.0]}
    bare = {"rps": 1000.0, "rps_reps": [1000.0, 520.0, 1000.0]}
    assert turn_ratios(gateway, bare) == " (turns 90%–96%)"
    assert turn_ratios({"rps": 1.0, "rps_reps": [1.0]}, {"rps": 1.0, "rps_reps": [1.0]}) == ""


def test_the_gateway_without_metrics_is_measured_beside_it() -> None:
    live = [*LIVE, _target("gateway-hypercorn-1w-nometrics", "gateway", "hypercorn")]
    group = ["bare-hypercorn", "gateway-hypercorn-1w", "gateway-hypercorn-1w-nometrics"]
    assert [t.name for t in turn_order(live, 0)][1:4] == group
    assert [t.name for t in turn_order(live, 1)][1:4] == group[::-1]
    assert sorted(t.name for t in turn_order(live, 1)) == sorted(t.name for t in live)


def test_the_report_judges_the_cost_of_metrics() -> None:
    """Throughput with metrics on as a share of off, turn by turn, and by instructions."""
    on = {"rps": 960.0, "rps_reps": [960.0, 500.0], "errors": 0}
    off = {"rps": 1000.0, "rps_reps": [1000.0, 520.0], "errors": 0}
    results = {
        "a": {"gateway-uvicorn-1w": {1: on}, "gateway-uvicorn-1w-nometrics": {1: off}},
        "b": {},
        "e_instructions": {
            "gateway-uvicorn-1w": {"json": 1_900_000.0, "sse": 2_100_000.0},
            "gateway-uvicorn-1w-nometrics": {"json": 1_850_000.0, "sse": 1_950_000.0},
        },
    }
    rows = [r for r in report._targets(results, [1], [1]) if "metrics and access log" in r]
    (wall,) = rows
    assert "(a) non-stream, 1 conns | 96.1% (turns 96%–96%) | **PASS**" in wall
    counted = [r for r in report._targets(results, [1], [1]) if "| 97.4% (50k instructions" in r]
    assert len(counted) == 1 and "97.4%" in counted[0] and "**PASS**" in counted[0]
    sse = [r for r in report._targets(results, [1], [1]) if "(150k instructions" in r]
    assert len(sse) == 1 and "92.9%" in sse[0] and "**FAIL**" in sse[0]


def test_the_bench_judges_the_gateway_on_the_server_gateway_serve_runs_by_default() -> None:
    from gateway.cli import build_parser

    default = build_parser().parse_args(["serve"]).server
    assert report.GATEWAY == f"gateway-{default}-1w"
    assert report.bare_for(report.GATEWAY) == f"bare-{default}"


@pytest.mark.parametrize(
    ("target", "bare"),
    [
        ("gateway-hypercorn-1w", "bare-hypercorn"),
        ("gateway-uvicorn-2w-unpinned", "bare-uvicorn"),
        ("bare-hypercorn", "bare-hypercorn"),  # each bare relay is its own 100%
        ("litellm", f"bare-{report.DEFAULT_SERVER}"),
    ],
)
def test_each_target_s_share_is_taken_of_its_own_server_s_bare_relay(
    target: str, bare: str
) -> None:
    assert report.bare_for(target) == bare
