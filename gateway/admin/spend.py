"""/admin/v1/prices (admin only; a PUT is audited) and spend read from the usage ledger:
/admin/v1/spend (per tenant) and /admin/v1/tenants/{tenant_id}/spend (its total, per key, per
model). Amounts are decimal strings of LORAGATE_CURRENCY beside exact integer micro-units."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Request

from gateway.admin.deps import AuditDep, PrincipalDep, RuntimeDep, SessionDep
from tenancy.spend.prices import list_prices, put_price
from tenancy.spend.report import spend_by_tenant, spend_report
from tenancy.spend.schemas import PriceIn, PriceOut, SpendReport, SpendRow

router = APIRouter(tags=["spend"])


@router.get("/prices", response_model=list[PriceOut], summary="Prices per model and adapter")
async def get_prices(session: SessionDep, principal: PrincipalDep, runtime: RuntimeDep) -> object:
    settings = runtime.settings
    return await list_prices(
        session, principal=principal, defaults=settings.prices, currency=settings.currency
    )


@router.put("/prices", response_model=PriceOut, summary="Set a model's (or an adapter's) price")
async def put_prices(
    body: PriceIn, request: Request, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    out = await put_price(session, ctx=ctx, body=body, currency=runtime.settings.currency)
    gateway = getattr(request.app.state, "gateway", None)  # None: the admin routers alone
    if gateway is not None:
        gateway.policy.forget_prices()  # this process at once; the others within the cache TTL
    return out


@router.get("/spend", response_model=list[SpendRow], summary="Spend per tenant")
async def get_spend(
    session: SessionDep,
    principal: PrincipalDep,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> object:
    return await spend_by_tenant(session, principal=principal, since=since, until=until)


@router.get(
    "/tenants/{tenant_id}/spend",
    response_model=SpendReport,
    summary="A tenant's spend: total, per key, per model",
)
async def get_tenant_spend(
    tenant_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    runtime: RuntimeDep,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> object:
    return await spend_report(
        session, principal=principal, tenant_id=tenant_id, currency=runtime.settings.currency,
        since=since, until=until,
    )  # fmt: skip
