"""deploy/ agrees with the code without a cluster: every command the compose file and the Helm
chart run parses with the real CLI, the compose environment builds valid gateway settings,
Prometheus scrapes what compose serves, and the dashboard's metrics exist."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import build_parser
from gateway.server.serve import metrics_guarded
from gateway.settings import GatewaySettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return data


def test_every_compose_command_parses(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if service.get("image") == "loragate:latest":
            args = build_parser().parse_args(service["command"])
            assert callable(args.handler), name


def test_compose_gateway_environment_is_valid_settings(
    compose: dict[str, Any], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(compose["services"]["gateway"]["environment"])
    env.update({
        "LORAGATE_MODEL": str(tiny_model_dir),
        "LORAGATE_KEY_PEPPER": secrets.token_urlsafe(32),
        "LORAGATE_SALT_SECRET": secrets.token_urlsafe(32),
        "LORAGATE_ENGINE_ADMIN_TOKEN": secrets.token_urlsafe(16),
        "LORAGATE_METRICS_TOKEN": secrets.token_urlsafe(16),
    })  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace("${POSTGRES_PASSWORD}", "pw"))
    settings = GatewaySettings()  # type: ignore[call-arg]
    assert settings.engine_mode == "http" and settings.quota_store == "redis"
    hosts = {url.split("//")[1] for url in settings.engine_urls}
    engines = {f"{n}:8100" for n in compose["services"] if n.startswith("engine-")}
    assert hosts == engines
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: set(job["static_configs"][0]["targets"])
        for job in prometheus["scrape_configs"]
    }
    assert targets["loragate-engine"] == engines
    assert targets["loragate-gateway"] == {"gateway:8000"}
    # The gateway listens beyond loopback: it starts only with a metrics token, and Prometheus
    # sends it from the file the compose file mounts.
    command = compose["services"]["gateway"]["command"]
    assert "LORAGATE_METRICS_TOKEN" in compose["services"]["gateway"]["environment"]
    assert metrics_guarded(settings, command[command.index("--host") + 1])
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "loragate-gateway")
    token_file = job["authorization"]["credentials_file"]
    mounts = compose["services"]["prometheus"]["volumes"]
    assert any(m.split(":")[1] == token_file for m in mounts)


def test_helm_commands_parse() -> None:
    templates = DEPLOY / "helm/loragate/templates"
    gateway = (templates / "gateway.yaml").read_text()
    assert '"serve", "--host", "0.0.0.0", "--port"' in gateway
    # Beyond loopback the gateway needs its metrics token: the secret's env carries it.
    assert 'include "loragate.secretEnv"' in gateway
    assert "name: LORAGATE_METRICS_TOKEN" in (templates / "_helpers.tpl").read_text()
    build_parser().parse_args(["serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "4"])
    build_parser().parse_args(["engine", "--model", "/models/tiny", "--served-model-name", "tiny",
                               "--host", "0.0.0.0", "--port", "8100"])  # fmt: skip
    build_parser().parse_args(["admin", "migrate"])
    configmap = (templates / "configmap.yaml").read_text()
    for name in re.findall(r"^  (LORAGATE_[A-Z_]+):", configmap, re.M):
        field = name.removeprefix("LORAGATE_").lower()
        assert field in GatewaySettings.model_fields, name


# The Grafana dashboard's expressions are checked against the exported names in test_grafana.py.
