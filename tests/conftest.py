"""Shared fixtures: stores (tests/plugins/stores.py), served apps (tests/plugins/servers.py),
the app in process (tests/plugins/inprocess.py) and upstreams on raw sockets
(tests/plugins/raw_upstreams.py).

Every test that needs a served gateway, a spawned process or a browser is marked ``served``
here, so that ``make test-fast`` (``pytest -m "not served"``) runs the rest: conversions,
adapters, the pipeline in process, the stores, the pure modules. Tests that hold a timing of
the contract are marked ``serial``: ``make test`` runs everything else on several processes
(pytest-xdist, a module per process at a time), then those, fewer at a time."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.plugins.stores",
    "tests.plugins.servers",
    "tests.plugins.inprocess",
    "tests.plugins.raw_upstreams",
]

# fixtures that serve a gateway or start a process
SERVED_FIXTURES = frozenset({"gateway", "gateway_factory", "fake", "redis_cluster", "cluster_url"})
# modules whose tests start processes, servers or browsers of their own
SERVED_MODULES = frozenset(
    {
        "test_abuse",
        "test_agents_sdk",
        "test_bench_clock_scaled",
        "test_bench_embeddings",
        "test_bench_gc_probe",
        "test_cluster_gateway",
        "test_codex_cli",
        "test_audit_browser",
        "test_console_browser",
        "test_console_users_browser",
        "test_deploy",
        "test_instances",
        "test_kill",
        "test_lazy_imports",
        "test_load_balancer",
        "test_privacy",
        "test_readyz",
        "test_schemathesis",
        "test_server",
        "test_store_outage",
        "test_upload_memory",
        "test_workers",
    }
)


# modules whose tests hold a deadline of the contract (a change seen everywhere within a
# second, a stream cut at the grace period, a probe answered under a flood) or kill processes:
# ``make test`` runs them after the rest, three modules at a time (they mostly wait on timers
# and processes, so a few of them load the machine far less than the rest's CPU-bound
# processes do)
SERIAL_MODULES = frozenset(
    {
        "test_abuse",
        "test_cluster_gateway",
        "test_failover",
        "test_instances",
        "test_kill",
        "test_load_balancer",
        "test_metrics",
        "test_probe_listener",
        "test_readyz",
        "test_server",
        "test_store_outage",
    }
)


# single tests of other modules that hold the same kind of deadline (a change made on one
# instance holds on another within a second): (module, test function)
SERIAL_TESTS = frozenset(
    {
        ("test_catalogue", "test_a_change_on_one_instance_serves_on_another"),
        ("test_console_api", "test_a_disabled_key_s_sessions_end_for_good"),
        (
            "test_console_session",
            "test_a_sign_out_on_one_instance_holds_on_another_within_a_second",
        ),
        (
            "test_console_session",
            "test_a_rotation_ends_every_session_everywhere_and_the_service_goes_on",
        ),
        ("test_key_limits", "test_a_quota_across_two_instances"),
        (
            "test_key_limits",
            "test_limits_set_by_patch_hold_at_once_here_and_within_a_second_on_another_instance",
        ),
        (
            "test_users_api",
            "test_disabling_a_user_on_one_instance_holds_on_another_within_a_second",
        ),
    }
)


# modules that cannot run under pytest-xdist: ``make test`` runs them last, in one process
SOLO_MODULES = frozenset(
    {
        "test_schemathesis",  # its last test reads what the run's cases saw, in its process
    }
)


def phase_paths(phase: str) -> list[str]:
    """The test files a later phase of ``make test`` runs (``serial`` or ``solo``): passed by
    path, so that the phase collects only those files, not the whole suite."""
    modules = SOLO_MODULES if phase == "solo" else SERIAL_MODULES | {m for m, _ in SERIAL_TESTS}
    return sorted(f"tests/{module}.py" for module in modules)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    served, serial, solo = pytest.mark.served, pytest.mark.serial, pytest.mark.solo
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in SERVED_MODULES or fixtures & SERVED_FIXTURES:
            item.add_marker(served)
        name = getattr(item, "originalname", item.name)
        if module in SERIAL_MODULES or (module, name) in SERIAL_TESTS:
            item.add_marker(serial)
        if module in SOLO_MODULES:
            item.add_marker(solo)
