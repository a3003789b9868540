"""The adapters page and its upload form: a tenant's own adapters and the public ones, the limits
an upload must fit, and a form that sends PEFT files (or one archive) to the same validation and
storage the admin API's upload uses (`read_uploads`, `register_adapter`: everything is checked
before anything is written, and the upload is audited as `adapter.create`). Each version is
listed; each of the tenant's aliases has a form that switches it to another version of its name
(`switch_alias`, as the admin API's PUT: audited as `alias.switch`; a rollback is a switch).

The page's script sends the form with XMLHttpRequest to show a progress bar, asking for JSON:
a refusal comes back as the API's error body (its message names the problem, e.g. a rank above
the server's maximum) and is shown beside the form. Without script the form posts as any other
and the answer is a page.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from gateway.admin.adapters import read_uploads
from gateway.dashboard.auth import Viewer, ViewerDep
from gateway.dashboard.forms import ActorDep, done, wants_json
from gateway.dashboard.routes import page
from gateway.dashboard.state import DashboardDep
from gateway.deps import StateDep
from tenancy.crud.adapters import list_adapters, register_adapter
from tenancy.crud.aliases import list_aliases, switch_alias
from tenancy.crud.tenants import load_tenant
from tenancy.errors import ClientError
from tenancy.schemas import AdapterOut
from tenancy.sql.models import Adapter

router = APIRouter(prefix="/dashboard", tags=["dashboard"])


async def _adapters_page(
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: Viewer,
    tenant_id: str,
    *,
    error: str = "",
    status: int = 200,
) -> Response:
    async with state.tenancy.sessionmaker() as session:
        try:
            tenant = await load_tenant(session, principal=viewer.principal, tenant_id=tenant_id)
            adapters = await list_adapters(session, principal=viewer.principal, tenant_id=tenant_id)
            aliases = await list_aliases(session, principal=viewer.principal, tenant_id=tenant_id)
        except ClientError:
            return page(dashboard, request, "error.html", 404, viewer=viewer,
                        message="No such tenant.")  # fmt: skip
    settings = state.tenancy.settings
    return page(
        dashboard, request, "adapters.html", status, viewer=viewer, tenant=tenant,
        adapters=adapters, limits=settings.adapter_limits, base_model=settings.base_model.name,
        base_models=state.tenancy.adapters.base_models, error=error, tab="adapters",
        aliases=aliases, versions=_own_versions(adapters),
    )  # fmt: skip


def _own_versions(adapters: list[Adapter]) -> dict[str, list[int]]:
    """name -> the tenant's own version numbers of it (what its alias may be switched to)."""
    out: dict[str, list[int]] = {}
    for a in adapters:
        if a.owner_tenant_id is not None:
            out.setdefault(a.name, []).append(a.version)
    return {name: sorted(numbers) for name, numbers in out.items()}


@router.get("/tenants/{tenant_id}/adapters")
async def adapters_page(
    tenant_id: str, request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    return await _adapters_page(request, dashboard, state, viewer, tenant_id)


@router.post("/tenants/{tenant_id}/adapters")
async def upload_adapter(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    name: Annotated[str, Form(max_length=10_000)],
    files: Annotated[list[UploadFile], File()],
    base_model: Annotated[str | None, Form(max_length=256)] = None,
) -> Response:
    runtime = state.tenancy
    try:
        uploads = await read_uploads(files, runtime.settings.adapter_limits.max_upload_bytes)
        async with runtime.sessionmaker() as session:
            row = await register_adapter(
                session, ctx=actor.ctx, service=runtime.adapters, tenant_id=tenant_id,
                name=name.strip(), uploads=uploads, base_model=base_model,
            )  # fmt: skip
    except ClientError as exc:
        if wants_json(request):
            return JSONResponse(exc.body(), status_code=exc.status_code)
        return await _adapters_page(request, dashboard, state, actor.viewer, tenant_id,
                                    error=exc.message, status=exc.status_code)  # fmt: skip
    state.policy.forget_adapters()  # the name's alias moved to it: served here at once
    if wants_json(request):
        body = AdapterOut.model_validate(row).model_dump(mode="json")
        return JSONResponse(body, status_code=201)
    return done(f"/dashboard/tenants/{tenant_id}/adapters", "adapter-uploaded")


@router.post("/tenants/{tenant_id}/adapter-aliases/{name}")
async def switch_adapter_alias(
    tenant_id: str,
    name: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    actor: ActorDep,
    version: Annotated[int, Form(ge=1, le=2**31 - 1)],
) -> Response:
    try:
        async with state.tenancy.sessionmaker() as session:
            await switch_alias(
                session, ctx=actor.ctx, tenant_id=tenant_id, name=name, version=version,
                serving_model=state.tenancy.adapters.serving_model,
            )  # fmt: skip
    except ClientError as exc:
        return await _adapters_page(request, dashboard, state, actor.viewer, tenant_id,
                                    error=exc.message, status=exc.status_code)  # fmt: skip
    state.policy.forget_adapters()  # this process serves the new version at once
    return done(f"/dashboard/tenants/{tenant_id}/adapters", "alias-switched")
