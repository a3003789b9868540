"""Issue 44, acceptance 3, as an operator runs it: `loragate serve` with tiny as LORAGATE_MODEL
and small in LORAGATE_MODELS (JSON in the environment), both engines in process (tiny's loop on
the main thread, small's on a thread of its own). Both answer through the gateway's port, each
with its own vocabulary, an adapter uploaded for small serves on small, /v1/models and /ready
list both, and SIGTERM ends the process cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from gateway_process import gateway_env, start_gateway

from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

SMALL = "small"


def test_serve_two_models(model_factory: Any, tmp_path: Path) -> None:
    tiny_dir, small_dir = model_factory(), model_factory(size=SMALL)
    models = [{"name": SMALL, "path": str(small_dir), "engine": {"num_kv_blocks": 256}}]
    env = gateway_env(tiny_dir, tmp_path, LORAGATE_MODELS=json.dumps(models))
    gateway = start_gateway(env, tmp_path)
    try:
        tenant = gateway.tenant()
        headers = {"authorization": f"Bearer {tenant.key}"}
        files = demo_adapter_files(base_model_spec(small_dir, SMALL), seed=5)
        r = gateway.admin(
            "POST", f"/tenants/{tenant.tenant_id}/adapters",
            data={"name": "s-ad", "base_model": SMALL},
            files=[("files", (f.filename, f.data)) for f in files],
        )  # fmt: skip
        assert r.status_code == 201 and r.json()["base_model"] == SMALL, r.text
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=120) as client:
            listed = client.get("/v1/models").json()["data"]
            assert [(m["id"], m["parent"]) for m in listed] == [
                ("tiny", None), (SMALL, None), ("s-ad", SMALL)
            ]  # fmt: skip
            for model in ("tiny", SMALL, "s-ad"):
                body = {"model": model, "max_tokens": 4,
                        "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200 and r.json()["model"] == model, r.text
            # token 10000 is in small's vocabulary (16384), not tiny's (4096)
            for model, status in (("tiny", 400), (SMALL, 200), ("s-ad", 200)):
                body = {"model": model, "token_ids": [10_000, 3],
                        "sampling_params": {"max_tokens": 2}}  # fmt: skip
                r = client.post("/inference/v1/generate", json=body)
                assert r.status_code == status, (model, r.text)
            r = client.get("/ready")
            assert r.json()["engines"] == {"inprocess": True, "small/inprocess": True}, r.text
    finally:
        gateway.stop()
    # SIGTERM: the server re-raises it once shut down (-15), every engine closed without error
    log = gateway.log_text()
    assert gateway.proc.returncode in (0, -15), log[-3000:]
    assert "Application shutdown complete" in log and "Traceback" not in log, log[-3000:]
