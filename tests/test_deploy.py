"""The deployment files, checked offline: the Kubernetes manifests render with
``kubectl kustomize`` and validate against the Kubernetes schemas (kubernetes-validate), with
the probes, grace period, disruption budget and autoscaler the docs describe; the compose
file names the services, images and ports the docs say and its gateway config loads; its nginx
configuration passes ``nginx -t``; the Dockerfile is multi-stage, non-root, with a health
check; the Grafana dashboard queries metrics the gateway serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import parse_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
K8S_VERSION = "1.30.0"


def kustomize(path: Path) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("path", ["base", "overlays/trial"])
def test_the_manifests_render_and_validate(path: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
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
    from gateway.server import GRACEFUL_SECONDS

    assert pod["terminationGracePeriodSeconds"] > GRACEFUL_SECONDS  # streams end first
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
    for name in ("GATEWAY_ADMIN_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(name, "x")
    from gateway.config import load_settings

    for path in (
        DEPLOY / "k8s" / "base" / "gateway.yaml",
        DEPLOY / "k8s" / "overlays" / "trial" / "gateway.yaml",
        DEPLOY / "compose" / "gateway.yaml",
    ):
        settings = load_settings(str(path))
        assert settings.channels, path


def test_the_compose_file_names_what_the_docs_say() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {
        "redis",
        "fake-upstream",
        "gateway-a",
        "gateway-b",
        "nginx",
        "prometheus",
    }
    for name in ("gateway-a", "gateway-b"):
        service = services[name]
        assert service["environment"]["GATEWAY_STORE"] == "redis://redis:6379/0"
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["nginx"]["ports"] == ["8080:80"]
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for name in services:
        assert name in docs
    scrape = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [
        "gateway-a:8080",
        "gateway-b:8080",
    ]
    parse_settings(
        {**yaml.safe_load((DEPLOY / "compose" / "gateway.yaml").read_text()), "admin_token": "x"}
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
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, re.MULTILINE)
    assert stages == ["build", "runtime", "demo"]
    runtime = text.split("AS runtime", 1)[1].split("AS demo", 1)[0]
    assert re.search(r"^USER 10001$", runtime, re.MULTILINE)
    assert "HEALTHCHECK" in runtime and "/healthz" in runtime
    assert "COPY --from=build /venv /venv" in runtime


def test_the_dashboard_queries_metrics_the_gateway_serves() -> None:
    from gateway.metrics import Exposition, Metrics

    served = {family.name for family in Exposition(Metrics(), None).collect()}
    served |= {f"{name}_total" for name in served} | {f"{name}_bucket" for name in served}
    dashboard = json.loads((DEPLOY / "grafana" / "gateway.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"gateway_[a-z_]+", target["expr"])
    }
    assert queried and queried <= served, queried - served
