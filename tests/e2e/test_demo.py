"""`make run` (`loragate demo`): prepares a demo tenant and key, serves on the given port, and
the curl line and the OpenAI SDK snippet it prints work exactly as printed."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from gateway_process import BIN, free_port
from sqlalchemy import select

from tenancy.auth.key_format import KeyMinter
from tenancy.auth.principal import AuditContext, Principal
from tenancy.auth.scopes import Scope
from tenancy.crud.keys import create_key
from tenancy.schemas import ApiKeyCreate
from tenancy.settings import TenancySettings
from tenancy.sql.models import Tenant
from tenancy.sql.session import make_engine, make_sessionmaker
from tenancy.state_dir import state_settings


def _block(text: str, heading: str) -> str:
    """The indented block printed under `heading`, dedented."""
    lines = text.split(heading, 1)[1].splitlines()[1:]
    block = []
    for line in lines:
        if not line.strip():
            if block:
                break
            continue
        block.append(line)
    return textwrap.dedent("\n".join(block))


class Demo(NamedTuple):
    banner: str
    old_key: str
    err_path: Path
    admin_key: str
    operator_key: str


async def _operator_key(state: Path) -> str:
    """A key for the demo tenant made as an operator would (not by the demo)."""
    settings = TenancySettings(**state_settings(state, create=False))  # type: ignore[arg-type]
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            tenant = (await session.scalars(select(Tenant).where(Tenant.name == "demo"))).one()
            created = await create_key(
                session,
                ctx=AuditContext(principal=Principal(subject="test", tenant_id=None,
                                                     scopes=frozenset({Scope.ADMIN}))),
                minter=KeyMinter(prefix=settings.key_prefix,
                                 pepper=settings.key_pepper.get_secret_value().encode()),
                tenant_id=tenant.id,
                data=ApiKeyCreate(name="operator", scopes=[Scope.INFERENCE]),
                now=dt.datetime.now(dt.UTC),
            )  # fmt: skip
        return created.key
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def demo(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    state = tmp_path_factory.mktemp("demo")
    first = subprocess.run(
        [str(BIN / "loragate"), "demo", "--model", str(tiny_model_dir), "--dir", str(state),
         "--no-serve"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    old_key = first.stdout.split("shown once", 1)[1].split()[-1]
    # `loragate admin bootstrap --dir` works against the demo's own state (its secrets and
    # database), and a key an operator made for the demo tenant survives the next start.
    boot = subprocess.run(
        [str(BIN / "loragate"), "admin", "bootstrap", "--dir", str(state)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert boot.returncode == 0, boot.stderr
    admin_key = boot.stdout.strip().splitlines()[-1]
    operator_key = asyncio.run(_operator_key(state))
    port = free_port()
    out_path, err_path = state / "stdout.txt", state / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "loragate"), "demo", "--model", str(tiny_model_dir), "--dir", str(state),
             "--port", str(port)],
            stdout=out, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, err_path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.3)
        yield Demo(out_path.read_text(), old_key, err_path, admin_key, operator_key)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # The key is printed once, on stdout, for the operator; no log line ever holds it.
    banner = out_path.read_text()
    key = _block(banner, "shown once").split()[-1]
    assert key not in err_path.read_text()
    assert banner.count(key) >= 1
    assert admin_key not in err_path.read_text()


def test_the_printed_curl_line_works(demo: Demo) -> None:
    banner = demo.banner
    curl = _block(banner, "Try it with curl:")
    assert curl.startswith("curl ")
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"]


def test_the_printed_sdk_snippet_works(demo: Demo) -> None:
    banner = demo.banner
    snippet = _block(banner, "Or with the OpenAI SDK (Python):")
    assert "from openai import OpenAI" in snippet
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_a_restart_revokes_only_the_previous_demo_key(demo: Demo) -> None:
    base = _block(demo.banner, "Or with the OpenAI SDK (Python):").split('base_url="')[1]
    base = base.split('"')[0]

    def models(key: str) -> int:
        return httpx.get(
            base + "/models", headers={"authorization": f"Bearer {key}"}, timeout=30
        ).status_code

    assert models(demo.old_key) == 401
    assert models(demo.operator_key) == 200  # an operator's key of the demo tenant survives


def test_a_second_demo_on_the_busy_port_leaves_the_running_one_alone(
    demo: Demo, tiny_model_dir: Path
) -> None:
    """`make run` again while the demo serves: a clear message, nothing changed (before, it
    revoked the running demo's key and then failed on the port)."""
    base = _block(demo.banner, "Or with the OpenAI SDK (Python):").split('base_url="')[1]
    base = base.split('"')[0]
    port = base.split(":")[2].split("/")[0]
    key = _block(demo.banner, "shown once").split()[-1]
    second = subprocess.run(
        [str(BIN / "loragate"), "demo", "--model", str(tiny_model_dir),
         "--dir", str(demo.err_path.parent), "--port", port],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode == 2
    assert f"127.0.0.1:{port} is in use" in second.stderr and "PORT=" in second.stderr
    assert "shown once" not in second.stdout  # no new key
    r = httpx.get(base + "/models", headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200  # the running demo's key still works


def test_admin_bootstrap_with_dir_uses_the_demo_state(demo: Demo) -> None:
    base = _block(demo.banner, "Or with the OpenAI SDK (Python):").split('base_url="')[1]
    root = base.split('"')[0].removesuffix("/v1")
    r = httpx.get(
        root + "/admin/v1/tenants",
        headers={"authorization": f"Bearer {demo.admin_key}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert "demo" in {t["name"] for t in r.json()}


def test_the_demo_adapters_are_listed_and_usable(demo: Demo) -> None:
    banner = demo.banner
    snippet = _block(banner, "Or with the OpenAI SDK (Python):")
    base = snippet.split('base_url="')[1].split('"')[0]
    key = snippet.split('api_key="')[1].split('"')[0]
    headers = {"authorization": f"Bearer {key}"}
    models = httpx.get(base + "/models", headers=headers, timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny", "pirate", "poet"]
    for model in ("pirate", "poet"):
        body = {"model": model, "messages": [{"role": "user", "content": "Ahoy"}], "max_tokens": 4}
        r = httpx.post(base + "/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == model


def test_the_printed_admin_lines_work(demo: Demo) -> None:
    """The operator's lines: bootstrap (the fixture ran it as printed), the dashboard and docs
    URLs, and the admin CLI with the URL it exports and the key it reads."""
    assert "loragate admin bootstrap --dir" in demo.banner
    cli = _block(demo.banner, "Admin CLI, over the REST API")
    url = cli.splitlines()[0].split("export LORAGATE_ADMIN_URL=", 1)[1].strip()
    dashboard = demo.banner.split("Dashboard (log in with that key): ", 1)[1].split()[0]
    assert dashboard == url + "/dashboard"
    r = httpx.get(dashboard, follow_redirects=False, timeout=10)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
    assert httpx.get(url + "/docs", timeout=10).status_code == 200
    env = {**os.environ, "LORAGATE_ADMIN_URL": url,
           "LORAGATE_ADMIN_KEY": demo.admin_key}  # fmt: skip
    listed = subprocess.run(
        [str(BIN / "loragate"), "admin", "tenants", "list", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    demo_tenant = next(t for t in json.loads(listed.stdout) if t["name"] == "demo")
    state = subprocess.run(
        [str(BIN / "loragate"), "admin", "quotas", "state", demo_tenant["id"]],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "requests_per_minute" in state.stdout and "120" in state.stdout  # the demo policy
