"""GET /v1/models and /v1/models/{id}: the served base models and the adapters this key may use.

The list holds every base model (the primary first) and each adapter alias (a name, as `model`
takes it), an adapter's `parent` and `root` its base model (vLLM's fields for a LoRA module);
versions are not listed, though `/v1/models/name@3` answers for each one the key may name."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.deps import StateDep, TenantDep
from gateway.policy import AdapterRef, PolicyService

router = APIRouter(tags=["models"])


def _model(model_id: str, created: int, owned_by: str, root: str) -> dict[str, Any]:
    return {
        "id": model_id, "object": "model", "created": created, "owned_by": owned_by,
        "root": root, "parent": None if root == model_id else root,
    }  # fmt: skip


def _base(policy: PolicyService, name: str) -> dict[str, Any]:
    return _model(name, policy.started_at, "loragate", name)


def _adapter(policy: PolicyService, model_id: str, adapter: AdapterRef) -> dict[str, Any]:
    owner = "loragate" if adapter.owner_tenant_id is None else "tenant"
    return _model(model_id, int(adapter.created_at), owner, adapter.base_model or policy.base_model)


@router.get("/v1/models")
async def list_models(state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    policy = state.policy
    aliases = (await policy.adapters(ctx)).aliases
    data = [_base(policy, name) for name in policy.base_models]
    data += [_adapter(policy, name, aliases[name].version) for name in sorted(aliases)]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    resolved = await state.policy.resolve(ctx, model_id)  # 404 for what this key may not see
    if resolved.adapter is None:
        return _base(state.policy, model_id)
    return _adapter(state.policy, model_id, resolved.adapter)
