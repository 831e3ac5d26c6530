"""The Kubernetes manifests probe the gateway on its probe listener (``server.probe_port``):
the container port the probes use is the one the ConfigMap's gateway listens on for them,
and the Service does not expose it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_deploy import DEPLOY, by_kind, kustomize, settings_of


@pytest.mark.parametrize("path", ["base", "overlays/trial"])
def test_the_kubelet_probes_the_probe_port(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = kustomize(DEPLOY / "k8s" / path)
    (gateway,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "model-gateway"
    ]
    (container,) = [c for c in gateway["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "gateway"]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "probes"
    (config_map,) = by_kind(docs, "ConfigMap")
    config = tmp_path / "gateway.yaml"
    config.write_text(config_map["data"]["gateway.yaml"])
    assert settings_of(config, monkeypatch).server.probe_port == ports["probes"]
    (service,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "model-gateway"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
