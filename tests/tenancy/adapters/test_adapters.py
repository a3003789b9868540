"""Acceptance 5: a PEFT adapter is accepted and listed; every SECURITY.md upload case is a 400
naming the problem, leaving nothing on disk or in the database."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_builders import (
    arrays_safetensors,
    make_peft_adapter,
    read_arrays,
    safetensors_bytes,
    scratch_dir,
    targz_bytes,
    zip_bytes,
)
from admin_harness import Harness, admin_harness
from sqlalchemy import func, select
from tenancy_factories import ADMIN_CTX, SecretRegistry

from lora.adapter_format import bundle_sha256, read_bundle
from tenancy.crud.adapters import delete_adapter
from tenancy.crud.tenants import delete_tenant
from tenancy.settings import BaseModelSpec, TenancySettings
from tenancy.sql.models import Adapter, AdapterBlob, AuditEvent

Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def peft_files() -> Iterator[dict[str, bytes]]:
    out = scratch_dir()
    make_peft_adapter(out / "a")
    yield {p.name: p.read_bytes() for p in (out / "a").iterdir()}
    shutil.rmtree(out)


async def _tenant(h: Harness) -> str:
    return str((await h.call("POST", "/tenants", json={"name": "owner"})).json()["id"])


def _multipart(files: dict[str, bytes]) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (name, data)) for name, data in files.items()]


async def stored_files(h: Harness, sha256: str) -> dict[str, bytes]:
    """An adapter's files as the store holds them (the database store: one blob per content)."""
    async with h.runtime.sessionmaker() as session:
        blob = await session.get(AdapterBlob, sha256)
    assert blob is not None and blob.data is not None
    return read_bundle(io.BytesIO(blob.data), max_bytes=len(blob.data))


async def num_blobs(h: Harness) -> int:
    async with h.runtime.sessionmaker() as session:
        return int(await session.scalar(select(func.count(AdapterBlob.sha256))) or 0)


async def upload(h: Harness, tenant_id: str, files: dict[str, bytes], name: str = "my-lora") -> Any:
    return await h.call(
        "POST", f"/tenants/{tenant_id}/adapters", data={"name": name}, files=_multipart(files)
    )


def _config(files: dict[str, bytes], **changes: Any) -> dict[str, bytes]:
    config = json.loads(files["adapter_config.json"])
    config.update(changes)
    return {**files, "adapter_config.json": json.dumps(config).encode()}


async def test_peft_adapter_is_accepted_and_listed(
    h: Harness, peft_files: dict[str, bytes]
) -> None:
    tid = await _tenant(h)
    r = await upload(h, tid, peft_files)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["rank"] == 8 and body["alpha"] == 16.0
    assert body["target_modules"] == ["q_proj", "v_proj", "down_proj"]
    weights = peft_files["adapter_model.safetensors"]
    assert body["sha256"] == bundle_sha256(peft_files)  # its bundle's: its address in the store
    listed = (await h.call("GET", f"/tenants/{tid}/adapters")).json()
    assert [a["name"] for a in listed] == ["my-lora"]
    assert (await stored_files(h, body["sha256"]))["adapter_model.safetensors"] == weights
    # the same adapter as one archive of each kind, and a public one
    for i, archive in enumerate([("a.zip", zip_bytes), ("a.tar.gz", targz_bytes)]):
        nested = {f"adapter/{k}": v for k, v in peft_files.items()}
        r = await upload(h, tid, {archive[0]: archive[1](nested)}, name=f"arch-{i}")
        assert r.status_code == 201, r.text
    r = await h.call("POST", "/adapters", data={"name": "shared"}, files=_multipart(peft_files))
    assert r.status_code == 201
    assert len((await h.call("GET", f"/tenants/{tid}/adapters")).json()) == 4
    again = await upload(h, tid, peft_files)  # a name uploaded again: its next version
    assert again.status_code == 201 and again.json()["version"] == 2
    other = (await h.call("POST", "/tenants", json={"name": "other"})).json()["id"]
    r = await h.call("GET", f"/tenants/{other}/adapters/{body['id']}")
    assert r.status_code == 404
    r = await h.call("DELETE", f"/tenants/{tid}/adapters/{body['id']}")
    # Every upload above held the same files: one blob, kept while any version names it.
    assert r.status_code == 204 and await num_blobs(h) == 1


def _cases(peft: dict[str, bytes]) -> list[tuple[str, dict[str, bytes], str, str]]:
    """(id, files, name, expected words in the message)."""
    cfg, st = peft["adapter_config.json"], peft["adapter_model.safetensors"]
    ok = {"adapter_config.json": cfg, "adapter_model.safetensors": st}
    zeros = b"\0" * (20 * 1024 * 1024)
    many = {f"adapter/README{i}.md": b"x" for i in range(20)}
    a_shape = {f"{Q}.lora_A.weight": ("F32", [8, 64]), f"{Q}.lora_B.weight": ("F32", [64, 8])}
    return [
        ("pickle-bin", {**ok, "adapter_model.bin": b"\x80\x04K\x01."}, "my", "not allowed"),
        (
            "pickle-pt",
            {"adapter_config.json": cfg, "adapter.pt": b"\x80\x04."},
            "my",
            "not allowed",
        ),
        ("not-allow-listed", {**ok, "train.py": b"print(1)"}, "my", "not allowed"),
        ("missing-weights", {"adapter_config.json": cfg}, "my", "Missing"),
        ("zip-dotdot", {"a.zip": zip_bytes({"../adapter_config.json": cfg})}, "my", ".."),
        ("zip-absolute", {"a.zip": zip_bytes({"/adapter_config.json": cfg})}, "my", "absolute"),
        ("zip-symlink", {"a.zip": zip_bytes(ok, {"README.md": "/etc/passwd"})}, "my", "link"),
        ("tar-dotdot", {"a.tar.gz": targz_bytes({"x/../../adapter_config.json": cfg})}, "my", ".."),
        ("tar-symlink", {"a.tar.gz": targz_bytes(ok, {"README.md": "/etc/passwd"})}, "my", "link"),
        ("zip-bomb", {"a.zip": zip_bytes({**ok, "README.md": zeros})}, "my", "ratio"),
        ("targz-bomb", {"a.tar.gz": targz_bytes({**ok, "README.md": zeros})}, "my", "ratio"),
        ("too-many-files", {"a.zip": zip_bytes(many)}, "my", "more than"),
        ("wrong-base", _config(ok, base_model_name_or_path="meta/llama-70b"), "my", "base_model"),
        ("not-lora", _config(ok, peft_type="PREFIX_TUNING"), "my", "peft_type"),
        ("rank-too-high", _config(ok, r=128), "my", "Rank"),
        ("unknown-targets", _config(ok, target_modules=["q_proj", "lm_head"]), "my", "lm_head"),
        ("regex-too-wide", _config(ok, target_modules=".*"), "my", "regex"),
        ("modules-to-save", _config(ok, modules_to_save=["lm_head"]), "my", "modules_to_save"),
        ("dora", _config(ok, use_dora=True), "my", "DoRA"),
        (
            "shape-mismatch",
            {
                **ok,
                "adapter_model.safetensors": safetensors_bytes(
                    {
                        f"{Q}.lora_A.weight": ("F32", [8, 128]),
                        f"{Q}.lora_B.weight": ("F32", [64, 8]),
                    }
                ),
            },
            "my",
            "shape",
        ),
        (
            "offsets-past-end",
            {**ok, "adapter_model.safetensors": safetensors_bytes(a_shape)[:-100]},
            "my",
            "past the end",
        ),
        (
            "huge-header",
            {**ok, "adapter_model.safetensors": (2**40).to_bytes(8, "little") + b"{}"},
            "my",
            "header",
        ),
        (
            "unknown-dtype",
            {
                **ok,
                "adapter_model.safetensors": safetensors_bytes(
                    {f"{Q}.lora_A.weight": ("Q4", [8, 64])}
                ),
            },
            "my",
            "dtype",
        ),
        ("name-slash", ok, "a/b", "name"),
        ("name-control", ok, "ab\x01c", "name"),
        ("name-10kb", ok, "a" * 10_000, "name"),
        ("name-dotdot", ok, "..", "name"),
    ]


CASE_IDS = [c[0] for c in _cases({"adapter_config.json": b"{}", "adapter_model.safetensors": b""})]


@pytest.mark.parametrize("case", CASE_IDS)
async def test_bad_uploads_are_refused_and_leave_nothing(
    h: Harness, peft_files: dict[str, bytes], case: str
) -> None:
    tid = await _tenant(h)
    _, files, name, words = next(c for c in _cases(peft_files) if c[0] == case)
    r = await upload(h, tid, files, name=name)
    await _refused_leaving_nothing(h, r, words)


async def _refused_leaving_nothing(h: Harness, r: Any, words: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words.lower() in error["message"].lower() or words == error["param"], error
    store = Path(h.runtime.settings.adapter_store_dir)
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]
    assert await num_blobs(h) == 0
    async with h.runtime.sessionmaker() as session:
        assert await session.scalar(select(func.count(Adapter.id))) == 0
        n = await session.scalar(
            select(func.count(AuditEvent.id)).where(AuditEvent.action.like("adapter.%"))
        )
        assert n == 0


# (id, tensor poisoned or None for every tensor, value, dtype, words the 400 must hold). The
# PEFT adapter has r=8, lora_alpha=16: B is served times 2, so 40000 in B leaves float16's range.
NON_FINITE = [
    ("nan-in-b", f"{Q}.lora_B.weight", float("nan"), "F32", "holds NaN"),
    ("inf-in-a", f"{Q}.lora_A.weight", float("inf"), "F32", "holds inf"),
    ("a-beyond-fp16", f"{Q}.lora_A.weight", 1e6, "F32", "magnitude 1e+06"),
    ("b-beyond-fp16-once-scaled", f"{Q}.lora_B.weight", 40000.0, "F32", "times its scale 2"),
    ("nan-in-bf16", f"{Q}.lora_B.weight", float("nan"), "BF16", "holds NaN"),
    ("inf-in-f16", f"{Q}.lora_A.weight", float("inf"), "F16", "holds inf"),
    ("all-nan", None, float("nan"), "F32", "must be finite"),
]


@pytest.mark.parametrize("case", NON_FINITE, ids=[c[0] for c in NON_FINITE])
async def test_non_finite_weights_are_refused_naming_the_tensor(
    h: Harness, peft_files: dict[str, bytes], case: tuple[str, str | None, float, str, str]
) -> None:
    """The loader's value checks run at upload: such an adapter was 'ready', then a 500 on
    every request that used it."""
    _, tensor, value, dtype, words = case
    arrays = read_arrays(peft_files["adapter_model.safetensors"])
    for name, array in arrays.items():
        if tensor is None:
            array[...] = value
        elif name == tensor:
            array[0, 0] = value
    files = {**peft_files, "adapter_model.safetensors": arrays_safetensors(arrays, dtype=dtype)}
    r = await upload(h, await _tenant(h), files)
    await _refused_leaving_nothing(h, r, words)
    message = r.json()["error"]["message"]
    named = tensor or "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
    assert repr(named) in message, message


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
async def test_half_precision_adapters_are_accepted(
    h: Harness, peft_files: dict[str, bytes], dtype: str
) -> None:
    arrays = read_arrays(peft_files["adapter_model.safetensors"])
    files = {**peft_files, "adapter_model.safetensors": arrays_safetensors(arrays, dtype=dtype)}
    r = await upload(h, await _tenant(h), files)
    assert r.status_code == 201, r.text


async def test_rank_and_alpha_patterns_are_accepted(h: Harness) -> None:
    """The engine serves per-module ranks and alphas; uploads refused them (served with PEFT
    parity: tests/tenancy/adapters/test_upload_serves.py)."""
    out = scratch_dir()
    try:
        make_peft_adapter(out / "p", rank_pattern={"down_proj": 16}, alpha_pattern={"v_proj": 4})
        files = {p.name: p.read_bytes() for p in (out / "p").iterdir()}
    finally:
        shutil.rmtree(out)
    assert json.loads(files["adapter_config.json"])["rank_pattern"] == {"down_proj": 16}
    r = await upload(h, await _tenant(h), files)
    assert r.status_code == 201, r.text
    assert (r.json()["rank"], r.json()["alpha"]) == (16, 16.0)  # the largest module rank


async def test_an_adapter_may_not_take_the_base_models_name(
    make_settings: Callable[..., TenancySettings], secret_registry: SecretRegistry
) -> None:
    """/v1/models would list the name twice and `model` would always pick the base model."""
    out = scratch_dir()
    try:
        make_peft_adapter(out / "a", base_name="tiny")
        files = {p.name: p.read_bytes() for p in (out / "a").iterdir()}
    finally:
        shutil.rmtree(out)
    settings = make_settings(base_model=BaseModelSpec(name="tiny"))
    async with admin_harness(settings) as h:
        secret_registry.add(h.admin_key)
        tid = await _tenant(h)
        r = await upload(h, tid, files, name=settings.base_model.name)
        await _refused_leaving_nothing(h, r, "base model")
        assert r.json()["error"]["param"] == "name"
        r = await h.call("POST", "/adapters", data={"name": "tiny"}, files=_multipart(files))
        assert r.status_code == 400 and r.json()["error"]["param"] == "name"
        assert (await upload(h, tid, files, name="tiny-sql")).status_code == 201


async def test_deleting_a_tenant_removes_its_adapter_files(
    h: Harness, peft_files: dict[str, bytes]
) -> None:
    gone, kept = (
        await _tenant(h),
        str((await h.call("POST", "/tenants", json={"name": "kept"})).json()["id"]),
    )
    ids = [(await upload(h, gone, peft_files, name=n)).json()["id"] for n in ("a", "b")]
    kept_id = (await upload(h, kept, peft_files)).json()["id"]
    r = await h.call("POST", "/adapters", data={"name": "shared"}, files=_multipart(peft_files))
    public_id = r.json()["id"]
    store = Path(h.runtime.settings.adapter_store_dir)
    (store / gone / ".tmp-crashed").mkdir(parents=True)  # a pre-blob-store write cut short
    async with h.runtime.sessionmaker() as session:
        deleted = await delete_tenant(
            session, ctx=ADMIN_CTX, tenant_id=gone, service=h.runtime.adapters
        )
    assert sorted(deleted) == sorted(ids)  # the names engines hold them under, to unload
    assert not (store / gone).exists()
    assert await num_blobs(h) == 1  # the kept and the public version still name the content
    async with h.runtime.sessionmaker() as session:
        deleted_one = await delete_adapter(
            session, ctx=ADMIN_CTX, service=h.runtime.adapters, tenant_id=kept, adapter_id=kept_id
        )
    assert deleted_one == kept_id and await num_blobs(h) == 1  # the public one still does
    assert public_id
