"""GET /v1/models and /v1/models/{id}: the base model and the adapters this key may use.

The list holds the base model and each adapter alias (a name, as `model` takes it); versions
are not listed, though `/v1/models/name@3` answers for each one the key may name."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.deps import StateDep, TenantDep
from gateway.policy import AdapterRef

router = APIRouter(tags=["models"])


def _model(model_id: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def _adapter(model_id: str, adapter: AdapterRef) -> dict[str, Any]:
    owner = "loragate" if adapter.owner_tenant_id is None else "tenant"
    return _model(model_id, int(adapter.created_at), owner)


@router.get("/v1/models")
async def list_models(state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    base = _model(state.policy.base_model, state.policy.started_at, "loragate")
    aliases = (await state.policy.adapters(ctx)).aliases
    data = [base, *(_adapter(name, aliases[name].version) for name in sorted(aliases))]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    resolved = await state.policy.resolve(ctx, model_id)  # 404 for what this key may not see
    if resolved.adapter is None:
        return _model(model_id, state.policy.started_at, "loragate")
    return _adapter(model_id, resolved.adapter)
