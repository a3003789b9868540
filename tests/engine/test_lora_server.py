"""The adapter endpoints (spec/tokens-api.md) over the real tiny engine, and acceptance 5: every
adapter case of SECURITY.md is a clear 400 (or 401/404/409 where the spec says so) and leaves
the engine serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine.config import EngineConfig
from engine.loop.async_engine import AsyncEngine
from engine.loop.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams
from engine.server import create_app
from tests.lora.hostile import copy_adapter, read_tensors, write_raw_safetensors
from tests.lora.peft_builders import AdapterSpec, edit_config, make_peft_adapter

TIMEOUT_S = 30
TOKEN = "engine-admin-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
A_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B_NAME = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("server-adapters")
    specs = [
        AdapterSpec("sql", r=8, alpha=16, seed=11, b_std=0.05),
        AdapterSpec("chat", r=16, alpha=16, targets=["q_proj", "v_proj"], seed=12, b_std=0.05),
        AdapterSpec("big", r=32, alpha=32, targets=["q_proj"], seed=13),
    ]
    return {s.name: make_peft_adapter(tiny_model_dir, root / s.name, s) for s in specs}


@pytest.fixture(scope="module")
def llm_engine(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_model_dir),
            served_model_name="tiny",
            num_kv_blocks=256,
            max_num_seqs=8,
            max_loras=2,
            max_cpu_loras=3,
            max_lora_rank=16,
        )
    )
    yield engine
    engine.check_invariants()


@pytest.fixture
async def engine(llm_engine: LLMEngine) -> AsyncIterator[AsyncEngine]:
    async_engine = AsyncEngine(llm_engine)
    yield async_engine
    await asyncio.wait_for(async_engine.shutdown(drain_timeout_s=0), TIMEOUT_S)
    # Leave the shared engine with no adapters for the next test.
    assert llm_engine.lora is not None
    for record in llm_engine.lora.registry.records():
        llm_engine.lora.begin_unload(record.name)
        assert llm_engine.is_adapter_unloaded(record.adapter_id)


@pytest.fixture
async def client(engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, admin_token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://engine", timeout=TIMEOUT_S
    ) as http:
        yield http


async def load(client: httpx.AsyncClient, name: str, path: Path | str) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path)}
    return await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)


async def generate(client: httpx.AsyncClient, model: str | None, **sampling: Any) -> httpx.Response:
    body = {
        "token_ids": [11, 12, 13, 14, 15, 16],
        "sampling_params": {"temperature": 0, "max_tokens": 6, "ignore_eos": True, **sampling},
        "model": model,
    }
    return await client.post("/inference/v1/generate", json=body)


async def models(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/v1/models", headers=AUTH)
    assert response.status_code == 200
    return {m["id"]: m for m in response.json()["data"]}


async def still_serving(client: httpx.AsyncClient, adapter: str | None = None) -> None:
    assert (await client.get("/health")).status_code == 200
    assert (await generate(client, None)).status_code == 200
    if adapter is not None:
        assert (await generate(client, adapter)).status_code == 200


async def test_load_generate_list_and_tiers(client, adapter_dirs):
    assert (await load(client, "sql", adapter_dirs["sql"])).json()["rank"] == 8
    assert (await load(client, "chat", adapter_dirs["chat"])).status_code == 200
    listed = await models(client)
    assert listed["tiny"]["parent"] is None
    assert (listed["sql"]["tier"], listed["sql"]["rank"], listed["sql"]["parent"]) == (
        "cpu",
        8,
        "tiny",
    )
    base = (await generate(client, None)).json()["choices"][0]["token_ids"]
    tuned = await generate(client, "sql")
    assert tuned.status_code == 200
    assert tuned.json()["choices"][0]["token_ids"] != base
    assert (await generate(client, "tiny")).json()["choices"][0]["token_ids"] == base
    assert (await models(client))["sql"]["tier"] == "gpu"
    metrics = (await client.get("/metrics")).text
    assert 'loragate_engine_adapter_misses_total{model_name="tiny",tier="gpu"} 1.0' in metrics
    assert "loragate_engine_adapter_slots_occupied" in metrics


async def test_repeated_load_is_idempotent_and_another_path_conflicts(client, adapter_dirs):
    assert (await load(client, "sql", adapter_dirs["sql"])).status_code == 200
    assert (await load(client, "sql", adapter_dirs["sql"])).status_code == 200
    response = await load(client, "sql", adapter_dirs["chat"])
    assert response.status_code == 409
    assert "another path" in response.json()["error"]["message"]
    await still_serving(client, "sql")


async def test_unknown_adapter_is_404(client):
    response = await generate(client, "no-such-adapter")
    assert response.status_code == 404
    unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=AUTH)
    assert unload.status_code == 404


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
        ("GET", "/v1/models", None),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {TOKEN}"},
     {"authorization": "Bearer"}, {"authorization": "Bearer " + "x" * 10_000}],
)  # fmt: skip
async def test_admin_token_is_required(client, method, path, body, headers):
    response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def _pickle(d: Path) -> None:
    (d / "adapter_model.bin").write_bytes(b"\x80\x04cposix\nsystem\n")


def _header_shape(d: Path) -> None:
    tensors = read_tensors(d)
    write_raw_safetensors(
        d / "adapter_model.safetensors", tensors, shape_override={A_NAME: [8, 4096]}
    )


def _tensor_shape(d: Path) -> None:
    tensors = read_tensors(d)
    tensors[A_NAME] = torch.zeros(8, 64)  # an adapter made for a smaller base model
    write_raw_safetensors(d / "adapter_model.safetensors", tensors)


def _offsets(d: Path) -> None:
    tensors = read_tensors(d)
    write_raw_safetensors(d / "adapter_model.safetensors", tensors, offset_shift={B_NAME: 1 << 40})


def _huge_header(d: Path) -> None:
    tensors = read_tensors(d)
    write_raw_safetensors(d / "adapter_model.safetensors", tensors, header_len_override=1 << 50)


HOSTILE: list[tuple[str, Callable[[Path], None], str]] = [
    ("pickle", _pickle, "pickle"),
    ("wrong base", lambda d: edit_config(d, base_model_name_or_path="mistralai/Mistral-7B"), "base model"),
    ("peft type", lambda d: edit_config(d, peft_type="IA3"), "peft_type must be LORA"),
    ("rank", lambda d: edit_config(d, r=64), "max_lora_rank 16"),
    ("targets", lambda d: edit_config(d, target_modules=["q_proj", "embed_tokens"]), "target modules"),
    ("modules_to_save", lambda d: edit_config(d, modules_to_save=["lm_head"]), "modules_to_save"),
    ("dora", lambda d: edit_config(d, use_dora=True), "DoRA"),
    ("header shape", _header_shape, "does not match"),
    ("tensor shape", _tensor_shape, "shape [8, 64]"),
    ("offsets", _offsets, "past the end"),
    ("huge header", _huge_header, "header claims"),
]  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
async def test_hostile_adapters_are_400_and_the_engine_keeps_serving(
    client, adapter_dirs, tmp_path, case
):
    _, corrupt, words = case
    assert (await load(client, "sql", adapter_dirs["sql"])).status_code == 200
    bad = copy_adapter(adapter_dirs["sql"], tmp_path / "bad")
    corrupt(bad)
    response = await load(client, "hostile", bad)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"], error
    assert "hostile" not in await models(client)
    await still_serving(client, "sql")


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd", "a/b", "a\\b", "line\nbreak", "nul\x00", "esc\x1b[31m", "x" * 10_240],
)
async def test_bad_adapter_names_are_400(client, adapter_dirs, name):
    response = await load(client, name, adapter_dirs["sql"])
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "lora_name"
    await still_serving(client)


@pytest.mark.parametrize(
    "content", [b"not json", b"[]", b'{"lora_name": "x"}', b'{"lora_name": 5, "lora_path": "/"}',
                b"[" * 100_000 + b"]" * 100_000],
)  # fmt: skip
async def test_malformed_load_bodies_are_400(client, content):
    response = await client.post(
        "/v1/load_lora_adapter",
        content=content,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 400
    await still_serving(client)


async def test_missing_directory_is_400(client, tmp_path):
    response = await load(client, "ghost", tmp_path / "nothing-here")
    assert response.status_code == 400
    assert "not a readable adapter directory" in response.json()["error"]["message"]


async def test_rank_above_max_from_peft_itself_is_400(client, adapter_dirs):
    response = await load(client, "big", adapter_dirs["big"])
    assert response.status_code == 400 and "max_lora_rank" in response.json()["error"]["message"]


async def test_unload_waits_for_running_requests(client, engine, adapter_dirs):
    assert (await load(client, "chat", adapter_dirs["chat"])).status_code == 200
    request = EngineRequest(
        request_id=RequestId("long"),
        prompt_token_ids=(5, 6, 7),
        # hundreds of steps, so the request is surely still running 0.2 s in (40 tokens of the
        # tiny model once finished within that on a quiet 2-core box)
        sampling_params=SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True),
        adapter_name="chat",
    )
    stream = await engine.add_request(request)
    first = await anext(stream.__aiter__())
    assert first.choices and not first.finished
    unload = asyncio.create_task(
        client.post("/v1/unload_lora_adapter", json={"lora_name": "chat"}, headers=AUTH)
    )
    await asyncio.sleep(0.2)
    assert not unload.done(), "unload must wait for the running request"
    # Already refused for new requests while it drains.
    assert (await generate(client, "chat")).status_code == 404
    assert "chat" not in await models(client)
    outputs = [o async for o in stream]
    assert outputs[-1].finished and outputs[-1].error is None
    response = await asyncio.wait_for(unload, TIMEOUT_S)
    assert response.status_code == 200
    assert (
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "chat"}, headers=AUTH)
    ).status_code == 404
    # The name is free again, and loads afresh (a new id: no stale prefix-cache blocks).
    assert (await load(client, "chat", adapter_dirs["chat"])).status_code == 200
    await still_serving(client, "chat")


async def test_prefix_cache_is_separate_per_adapter(client, adapter_dirs):
    await load(client, "sql", adapter_dirs["sql"])
    await load(client, "chat", adapter_dirs["chat"])
    prompt = list(range(40, 80))  # two and a half blocks of 16
    body = {"token_ids": prompt, "sampling_params": {"temperature": 0, "max_tokens": 2}}
    first = await client.post("/inference/v1/generate", json={**body, "model": "sql"})
    again = await client.post("/inference/v1/generate", json={**body, "model": "sql"})
    other = await client.post("/inference/v1/generate", json={**body, "model": "chat"})
    assert first.json()["usage"]["cached_tokens"] == 0
    assert again.json()["usage"]["cached_tokens"] == 32
    assert other.json()["usage"]["cached_tokens"] == 0
