"""Shared fixtures: stores (tests/plugins/stores.py) and served apps (tests/plugins/servers.py)."""

pytest_plugins = ["tests.plugins.stores", "tests.plugins.servers", "tests.plugins.inprocess"]
