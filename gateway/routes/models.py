"""GET /v1/models and /v1/models/{id}: the base model and the adapters this key may use."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.deps import StateDep, TenantDep
from gateway.policy import AdapterRef

router = APIRouter(tags=["models"])


def _model(model_id: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def _adapter(adapter: AdapterRef) -> dict[str, Any]:
    owner = "loragate" if adapter.owner_tenant_id is None else "tenant"
    return _model(adapter.name, int(adapter.created_at), owner)


@router.get("/v1/models")
async def list_models(state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    base = _model(state.policy.base_model, state.policy.started_at, "loragate")
    adapters = await state.policy.adapters(ctx)
    data = [base, *(_adapter(a) for a in sorted(adapters.values(), key=lambda a: a.name))]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep, ctx: TenantDep) -> dict[str, Any]:
    resolved = await state.policy.resolve(ctx, model_id)  # 404 for what this key may not see
    if resolved.adapter is None:
        return _model(model_id, state.policy.started_at, "loragate")
    return _adapter(resolved.adapter)
