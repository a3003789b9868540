"""Issue 44, acceptance 3, through a real gateway: tiny (the primary model) and small
(LORAGATE_MODELS) behind one gateway, each an in-process engine pool of its own, SQLite, an
adapter uploaded for each. Requests to each base model and each adapter run on that model's
pool (its engine received them; its greedy tokens are transformers' on that checkpoint); an
adapter of one model uploaded for the other, or an alias switched across models, is a 400
naming it; /v1/models lists both base models and each tenant's own adapters with their parent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from gateway_harness import Gateway, RecordingClient, SecretScan, gateway_settings, running_gateway
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update
from version_checks import admin_headers

from gateway.demo.adapters import demo_adapter_files
from gateway.model_entries import model_view
from tenancy.adapters.archive import UploadedFile
from tenancy.settings import BaseModelSpec
from tenancy.sql.models import Adapter
from tests.engine.engine_helpers import transformers_greedy

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

SMALL = "small"
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two_models(
    model_factory: Any, tmp_path_factory: pytest.TempPathFactory, secret_scan: SecretScan
) -> AsyncIterator[Gateway]:
    small_dir = model_factory(size="small")
    settings = gateway_settings(
        model_factory(), tmp_path_factory.mktemp("two-models"),
        models=[{"name": SMALL, "path": str(small_dir), "engine": {"num_kv_blocks": 512}}],
        engine={"dtype": "float32"},
        prices={SMALL: {"prompt": "1000", "completion": "2000"}},  # tiny is free
    )  # fmt: skip
    async with running_gateway(settings, secret_scan) as gw:
        yield gw


def _files(base: BaseModelSpec, seed: int, *, named: bool = True) -> list[tuple[str, Any]]:
    files = demo_adapter_files(base, seed=seed)
    if not named:  # no base_model_name_or_path: only the tensor shapes can tell
        config = json.loads(files[0].data)
        del config["base_model_name_or_path"]
        files[0] = UploadedFile(filename=files[0].filename, data=json.dumps(config).encode())
    return [("files", (f.filename, f.data)) for f in files]


async def _upload(
    gw: Gateway, admin: dict[str, str], tenant_id: str, name: str, files: Any, **form: str
) -> Any:
    return await gw.client.post(
        f"/admin/v1/tenants/{tenant_id}/adapters", headers=admin,
        data={"name": name, **form}, files=files,
    )  # fmt: skip


async def _generate(gw: Gateway, headers: dict[str, str], model: str, ids: list[int]) -> Any:
    body = {"model": model, "token_ids": ids, "sampling_params": GREEDY}
    return await gw.client.post("/inference/v1/generate", headers=headers, json=body)


def _record(gw: Gateway) -> tuple[RecordingClient, RecordingClient]:
    pool = gw.state.others[SMALL]
    small = RecordingClient(pool.engine)
    pool.engine = small
    return gw.record_requests(), small


@MODULE_LOOP
async def test_requests_run_on_their_models_pool(two_models: Gateway, model_factory: Any) -> None:
    gw = two_models
    admin = await admin_headers(gw)
    tenant = await gw.tenant()
    tiny_base, small_base = gw.state.settings.base_model, gw.state.others[SMALL].base
    r = await _upload(gw, admin, tenant.tenant_id, "t-ad", _files(tiny_base, 1))
    assert r.status_code == 201 and r.json()["base_model"] == "tiny", r.text
    r = await _upload(gw, admin, tenant.tenant_id, "s-ad", _files(small_base, 2), base_model=SMALL)
    assert r.status_code == 201 and r.json()["base_model"] == SMALL, r.text
    tiny, small = _record(gw)
    try:
        prompt = [5, 17, 99, 300, 42, 7]
        answers = {}
        for model in ("tiny", SMALL, "t-ad", "s-ad"):
            r = await _generate(gw, tenant.headers, model, prompt)
            assert r.status_code == 200, (model, r.text)
            answers[model] = r.json()["choices"][0]["token_ids"]
        # each request reached its model's engine, an adapter's naming that adapter (by its
        # engine name, the version's id)
        ad_ids = {a["name"]: a["id"] for a in await _adapters(gw, admin, tenant.tenant_id)}
        assert [q.model for q in tiny.requests][1:] == [ad_ids["t-ad"]]
        assert [q.model for q in small.requests][1:] == [ad_ids["s-ad"]]
        assert ad_ids["t-ad"] not in {q.model for q in small.requests}
        # greedy tokens are each checkpoint's own (transformers, float32)
        for model, path in (("tiny", model_factory()), (SMALL, model_factory(size="small"))):
            expected, _ = transformers_greedy(path, [prompt], [GREEDY["max_tokens"]])
            assert answers[model] == expected[0], model
        assert answers["tiny"] != answers[SMALL]
        assert answers["t-ad"] != answers["tiny"] and answers["s-ad"] != answers[SMALL]
        # the planner is the pool's: small's vocabulary is 16384, tiny's 4096
        r = await _generate(gw, tenant.headers, SMALL, [10_000, 5])
        assert r.status_code == 200, r.text
        r = await _generate(gw, tenant.headers, "tiny", [10_000, 5])
        assert r.status_code == 400 and r.json()["error"]["param"] == "token_ids", r.text
        # chat through each model's own tokenizer and template
        for model in ("tiny", "s-ad"):
            body = gw.chat_body("Hello there", model=model, max_tokens=4)
            r = await gw.client.post("/v1/chat/completions", headers=tenant.headers, json=body)
            assert r.status_code == 200 and r.json()["model"] == model, r.text
        # prices key by the base model a request ran on: small's (and its adapter's), not tiny's
        costs = {r.model: r.cost_micros for r in await gw.usage_records(tenant)}
        assert costs["tiny"] == costs["t-ad"] == 0
        assert costs[SMALL] > 0 and costs["s-ad"] > 0
        # tiny: tiny, t-ad, the chat (its 400 never reached an engine); small: four
        assert len(tiny.requests) == 3 and tiny.requests[-1].model is None
        assert len(small.requests) == 4 and small.requests[-1].model == ad_ids["s-ad"]
    finally:
        gw.stop_recording(tiny)
        gw.state.others[SMALL].engine = small.inner


@MODULE_LOOP
async def test_each_engine_s_metrics_on_one_metrics_page(two_models: Gateway) -> None:
    """Both in-process engines' vLLM-named series on /metrics, by model_name, in a page the
    Prometheus parser reads (each family once)."""
    gw = two_models
    tenant = await gw.tenant()
    for model, count in (("tiny", 1), (SMALL, 2)):
        for _ in range(count):
            r = await _generate(gw, tenant.headers, model, [5, 17, 99])
            assert r.status_code == 200, r.text
    text = (await gw.client.get("/metrics")).text
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family appears twice"
    counts = {
        s.labels["model_name"]: s.value
        for f in families
        if f.name == "vllm:time_to_first_token_seconds"
        for s in f.samples
        if s.name.endswith("_count")
    }
    # at least this test's requests (the module's gateway served others before)
    assert counts["tiny"] >= 1 and counts[SMALL] >= 2, counts
    running = {
        s.labels["model_name"]
        for f in families
        if f.name == "vllm:num_requests_running"
        for s in f.samples
    }
    assert running == {"tiny", SMALL}


async def _adapters(gw: Gateway, admin: dict[str, str], tenant_id: str) -> Any:
    r = await gw.client.get(f"/admin/v1/tenants/{tenant_id}/adapters", headers=admin)
    assert r.status_code == 200, r.text
    return r.json()


@MODULE_LOOP
async def test_an_adapter_of_the_other_model_is_refused(two_models: Gateway) -> None:
    gw = two_models
    admin = await admin_headers(gw)
    tenant = await gw.tenant()
    tiny_base, small_base = gw.state.settings.base_model, gw.state.others[SMALL].base
    # small's adapter uploaded for tiny (the default): its config names small
    r = await _upload(gw, admin, tenant.tenant_id, "x", _files(small_base, 3))
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "base_model_name_or_path", r.text
    assert "'small'" in error["message"] and "'tiny'" in error["message"]
    # without a name in its config: the first tensor whose shape does not fit tiny's
    r = await _upload(gw, admin, tenant.tenant_id, "x", _files(small_base, 3, named=False))
    error = r.json()["error"]
    assert r.status_code == 400 and "lora_A" in error["message"], r.text
    assert "base model 'tiny'" in error["message"]
    # tiny's adapter uploaded for small
    r = await _upload(
        gw, admin, tenant.tenant_id, "x", _files(tiny_base, 3, named=False), base_model=SMALL
    )
    assert r.status_code == 400 and "base model 'small'" in r.json()["error"]["message"], r.text
    # a base model not served
    r = await _upload(gw, admin, tenant.tenant_id, "x", _files(tiny_base, 3), base_model="huge")
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "base_model" and "'huge'" in error["message"]
    # a name belongs to one base model: its next version cannot be on the other
    r = await _upload(gw, admin, tenant.tenant_id, "one", _files(tiny_base, 4))
    assert r.status_code == 201, r.text
    r = await _upload(gw, admin, tenant.tenant_id, "one", _files(small_base, 4), base_model=SMALL)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "base_model", r.text
    assert "'tiny'" in error["message"] and "'small'" in error["message"]
    # an adapter name may not be a served model's
    r = await _upload(gw, admin, tenant.tenant_id, SMALL, _files(tiny_base, 4))
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text
    # an alias switched, or a canary set, to a version on the other model (a row recorded
    # so, as no upload can make it): 400 naming it; the alias still serves version 1
    r = await _upload(gw, admin, tenant.tenant_id, "one", _files(tiny_base, 5), activate="false")
    assert r.status_code == 201, r.text
    async with gw.state.tenancy.sessionmaker() as session:
        await session.execute(
            update(Adapter).where(Adapter.id == r.json()["id"]).values(base_model=SMALL)
        )
        await session.commit()
    alias = f"/admin/v1/tenants/{tenant.tenant_id}/adapter-aliases/one"
    for path, body in ((alias, {"version": 2}), (alias + "/canary", {"version": 2, "weight": 10})):
        r = await gw.client.put(path, headers=admin, json=body)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "version", r.text
        assert "'small'" in error["message"] and "'tiny'" in error["message"]
    r = await gw.client.get(alias, headers=admin)
    assert r.json()["version"] == 1 and r.json()["canary_version"] is None
    # the limits name every served base model
    r = await gw.client.get("/admin/v1/adapters/limits", headers=admin)
    assert r.json()["base_model"] == "tiny" and r.json()["base_models"] == ["tiny", SMALL]


@MODULE_LOOP
async def test_models_listed_per_tenant(two_models: Gateway) -> None:
    gw = two_models
    admin = await admin_headers(gw)
    owner, other = await gw.tenant(), await gw.tenant()
    small_base = gw.state.others[SMALL].base
    r = await _upload(gw, admin, owner.tenant_id, "mine", _files(small_base, 6), base_model=SMALL)
    assert r.status_code == 201, r.text

    async def listed(tenant: Any) -> dict[str, Any]:
        r = await gw.client.get("/v1/models", headers=tenant.headers)
        assert r.status_code == 200, r.text
        return {m["id"]: m for m in r.json()["data"]}

    mine, theirs = await listed(owner), await listed(other)
    assert list(theirs) == ["tiny", SMALL]
    assert list(mine)[:2] == ["tiny", SMALL] and "mine" in mine
    assert mine["mine"]["parent"] == SMALL and mine["mine"]["root"] == SMALL
    assert mine[SMALL]["parent"] is None and mine["tiny"]["root"] == "tiny"
    r = await gw.client.get("/v1/models/mine", headers=owner.headers)
    assert r.status_code == 200 and r.json()["parent"] == SMALL
    r = await gw.client.get("/v1/models/mine", headers=other.headers)
    assert r.status_code == 404
    r = await gw.client.get(f"/v1/models/{SMALL}", headers=other.headers)
    assert r.status_code == 200 and r.json()["id"] == SMALL
    # readiness covers both pools; the primary's engine under its own name
    r = await gw.client.get("/ready")
    assert r.status_code == 200 and r.json()["engines"] == {
        "inprocess": True,
        "small/inprocess": True,
    }


@MODULE_LOOP
async def test_single_model_needs_no_new_setting(gateway: Gateway) -> None:
    """The embedded default: one model, no LORAGATE_MODELS."""
    tenant = await gateway.tenant()
    assert gateway.state.others == {} and gateway.state.settings.models == []
    r = await gateway.client.get("/v1/models", headers=tenant.headers)
    assert [m["id"] for m in r.json()["data"]] == ["tiny"]


def test_settings_errors_name_the_entry(tmp_path: Path, model_factory: Any) -> None:
    from pydantic import ValidationError

    tiny, small = model_factory(), model_factory(size="small")
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"name": SMALL, "path": str(tmp_path / "absent")}, {}, "models[1].path"),
        ({"name": "tiny", "path": str(small)}, {}, "models[1].name"),
        ({"name": "a@2", "path": str(small)}, {}, "models[1].name"),
        (
            {"name": SMALL, "path": str(small)},
            {"engine_mode": "http", "engine_urls": ["http://127.0.0.1:9"]},
            "models[1].engine_urls",
        ),
        (
            {"name": SMALL, "path": str(small), "engine": {"max_num_seqs": "x"}},
            {},
            "models[1].engine.max_num_seqs",
        ),
        ({"name": SMALL, "path": str(small), "engine_kind": "vllm"}, {}, "models[1].engine_kind"),
    ]
    for entry, extra, field in cases:
        # the first entry fine in either mode: its own HTTP replicas
        other = {"name": "other", "path": str(small), "engine_urls": ["http://127.0.0.1:9"]}
        models = [other, entry]
        with pytest.raises(ValidationError) as caught:
            gateway_settings(tiny, tmp_path, models=models, **extra)
        assert field in str(caught.value), (field, str(caught.value))
    ok = gateway_settings(
        tiny, tmp_path, models=[{"name": SMALL, "path": str(small), "engine": {"max_num_seqs": 4}}],
        engine={"adapter_cache_dir": str(tmp_path / "cache"), "max_num_seqs": 8},
    )  # fmt: skip
    assert [ok.model_name, *(entry.name for entry in ok.models)] == ["tiny", SMALL]
    view = model_view(ok, ok.models[0])
    # small's own checkpoint, shapes and engine options over the gateway's; its own disk cache
    assert view.model_name == SMALL and view.base_model.name == SMALL
    assert view.base_model.hidden_size == 768 and ok.base_model.hidden_size == 256
    assert view.engine.max_num_seqs == 4 and ok.engine.max_num_seqs == 8
    assert view.engine.adapter_cache_dir == str(tmp_path / "cache") + "-small"
    assert view.engine_mode == "inprocess" and view.models == []
