"""/admin/v1/tenants/{tenant_id}/webhook: the tenant's budget-alert webhook and its delivery log
(tenancy/alerts/; docs/operations.md, Budget alerts)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status

from gateway.admin.deps import AuditDep, PrincipalDep, RuntimeDep, SessionDep
from tenancy.alerts.schemas import (
    DeliveryOut,
    TestEventOut,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookUpdate,
)
from tenancy.alerts.secret_box import SecretBox
from tenancy.crud import webhooks as crud
from tenancy.runtime import TenancyRuntime

router = APIRouter(prefix="/tenants/{tenant_id}/webhook", tags=["webhooks"])
NO_STORE = {"cache-control": "no-store"}


def get_box(runtime: RuntimeDep) -> SecretBox:
    return SecretBox(runtime.settings.key_pepper.get_secret_value().encode())


BoxDep = Annotated[SecretBox, Depends(get_box)]


def _allow_private(runtime: TenancyRuntime) -> bool:
    return runtime.settings.alerts.allow_private_urls


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookCreated)
async def create_webhook(
    tenant_id: str,
    body: WebhookCreate,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    box: BoxDep,
    response: Response,
) -> object:
    response.headers.update(NO_STORE)  # the answer holds the signing secret
    return await crud.create_webhook(
        session, ctx=ctx, tenant_id=tenant_id, data=body, box=box,
        allow_private=_allow_private(runtime),
    )  # fmt: skip


@router.get("", response_model=WebhookOut)
async def get_webhook(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.get_webhook(session, principal=principal, tenant_id=tenant_id)


@router.patch("", response_model=WebhookOut)
async def update_webhook(
    tenant_id: str, body: WebhookUpdate, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    return await crud.update_webhook(
        session, ctx=ctx, tenant_id=tenant_id, data=body, allow_private=_allow_private(runtime)
    )


@router.delete("", status_code=status.HTTP_204_NO_CONTENT)
async def delete_webhook(tenant_id: str, session: SessionDep, ctx: AuditDep) -> None:
    await crud.delete_webhook(session, ctx=ctx, tenant_id=tenant_id)


@router.post("/rotate-secret", response_model=WebhookCreated)
async def rotate_secret(
    tenant_id: str, session: SessionDep, ctx: AuditDep, box: BoxDep, response: Response
) -> object:
    response.headers.update(NO_STORE)
    return await crud.rotate_secret(session, ctx=ctx, tenant_id=tenant_id, box=box)


@router.post("/test", status_code=status.HTTP_202_ACCEPTED, response_model=TestEventOut)
async def send_test(
    tenant_id: str,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    request: Request,
) -> object:
    delivery_id = await crud.send_test(session, ctx=ctx, tenant_id=tenant_id, now=runtime.now())
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is not None and gateway.alerts is not None:
        gateway.alerts.worker.wake()  # else the next poll of any replica sends it
    return TestEventOut(delivery_id=delivery_id)


@router.get("/deliveries", response_model=list[DeliveryOut])
async def list_deliveries(
    tenant_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> object:
    return await crud.list_deliveries(
        session, principal=principal, tenant_id=tenant_id, limit=limit
    )
