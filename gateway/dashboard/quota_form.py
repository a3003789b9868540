"""The quota form: a tenant's policy (an admin edits it) or one key's own policy (an admin, or a
tenant-admin within its tenant's limits), shown pre-filled with what is in force.

Only the fields the viewer edited change: the form carries each field's value as it was shown
(`was_<field>`), and a field whose sent value equals it keeps whatever the policy holds at the
moment of saving, so two people editing different limits at once do not undo each other (the
merge `loragate admin quotas set` does). The save is the admin API's `put_policy`, with its
checks and its `quota.put` audit entry; a form with no edited field saves nothing. A key a
tenant-admin limits must stay within its tenant: a field it leaves unlimited and unedited is
saved as the tenant's limit (the bound it had anyway), as the form says.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from gateway.dashboard import views
from gateway.dashboard.auth import Viewer, ViewerDep
from gateway.dashboard.forms import ActorDep, done, optional_int
from gateway.dashboard.routes import page
from gateway.dashboard.state import DashboardDep
from gateway.deps import StateDep
from tenancy.crud import quotas as crud
from tenancy.crud.tenants import load_tenant
from tenancy.errors import ClientError
from tenancy.schemas import QuotaLimitsIn

router = APIRouter(prefix="/dashboard", tags=["dashboard"])

FIELDS = tuple(QuotaLimitsIn.model_fields)
KeyId = Annotated[str, Form(max_length=64)]


async def _quota_page(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: Viewer,
    tenant_id: str,
    key_id: str | None,
    *,
    error: str = "",
    status: int = 200,
    sent: dict[str, str] | None = None,
) -> Response:
    """`sent`: after a refusal, what the viewer typed, shown again in the fields."""
    principal = viewer.principal
    async with state.tenancy.sessionmaker() as session:
        try:
            tenant = await load_tenant(session, principal=principal, tenant_id=tenant_id)
            keys = await views.key_rows(session, principal, tenant_id, state.tenancy.now())
            policy = await crud.get_policy(
                session, principal=principal, tenant_id=tenant_id, key_id=key_id
            )
            ceiling = await crud.get_policy(session, principal=principal, tenant_id=tenant_id)
        except ClientError:  # another tenant, or a key not of this tenant: one 404
            return page(dashboard, request, "error.html", 404, viewer=viewer,
                        message="No such tenant or key.")  # fmt: skip
    subject = next((k for k in keys if k.id == key_id), None)
    return page(
        dashboard, request, "quota_form.html", status, viewer=viewer, tenant=tenant, keys=keys,
        subject=subject, policy=policy, ceiling=ceiling, fields=FIELDS, error=error, sent=sent,
        # A tenant's own limits are the operator's to set; a tenant-admin sets its keys'.
        editable=viewer.is_admin or key_id is not None, tab="quotas",
    )  # fmt: skip


@router.get("/tenants/{tenant_id}/quotas")
async def quota_page(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: ViewerDep,
    key_id: str | None = None,
) -> Response:
    return await _quota_page(request, dashboard, state, viewer, tenant_id, key_id or None)


@router.post("/tenants/{tenant_id}/quotas")
async def save_quotas(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    key_id: KeyId = "",
) -> Response:
    form = await request.form()  # already read for the CSRF token: the same parsed form
    subject = key_id or None
    here = f"/dashboard/tenants/{quote(tenant_id)}/quotas" + (
        f"?key_id={quote(key_id)}" if key_id else ""
    )
    try:
        changed = {}
        for name in FIELDS:
            sent = optional_int(name, _text(form.get(name)))
            if sent != optional_int(name, _text(form.get(f"was_{name}"))):
                changed[name] = sent
        async with state.tenancy.sessionmaker() as session:
            current = await crud.get_policy(
                session, principal=actor.viewer.principal, tenant_id=tenant_id, key_id=subject
            )
            if not changed:
                return done(here, "quota-unchanged")
            values = {**current.model_dump(include=set(FIELDS)), **changed}
            if subject is not None and not actor.viewer.is_admin:
                # A tenant-admin's key may not be wider than its tenant (put_policy refuses an
                # unlimited field where the tenant has a limit): a field left unlimited and
                # not edited takes the tenant's limit, which bound the key already.
                ceiling = await crud.get_policy(
                    session, principal=actor.viewer.principal, tenant_id=tenant_id
                )
                for name in set(FIELDS) - set(changed):
                    values[name] = (
                        values[name] if values[name] is not None else ceiling.model_dump()[name]
                    )
            merged = QuotaLimitsIn(**values)
            await crud.put_policy(
                session, ctx=actor.ctx, tenant_id=tenant_id, limits=merged, key_id=subject
            )
    except ClientError as exc:
        typed = {name: _text(form.get(name)) or "" for name in FIELDS}
        return await _quota_page(request, dashboard, state, actor.viewer, tenant_id, subject,
                                 error=exc.message, status=exc.status_code, sent=typed)  # fmt: skip
    return done(here, "quota-saved")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
