"""/admin/v1/tenants/{tenant_id}/adapters (tenant-owned) and /admin/v1/adapters (public)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile, status

from gateway.admin.deps import (
    AdapterRemovalDep,
    AuditDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
)
from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.errors import AdapterRejected
from tenancy.crud import adapters as crud
from tenancy.schemas import AdapterOut

router = APIRouter(tags=["adapters"])

FilesForm = Annotated[list[UploadFile], File(description="PEFT files, or one .zip / .tar.gz")]
NameForm = Annotated[str, Form(max_length=10_000)]


async def _read(files: list[UploadFile], limit: int) -> list[UploadedFile]:
    out, total = [], 0
    for f in files:
        data = await f.read(limit - total + 1)
        total += len(data)
        if total > limit:
            raise AdapterRejected("The upload exceeds the size limit.")
        out.append(UploadedFile(filename=f.filename or "", data=data))
    return out


@router.post(
    "/tenants/{tenant_id}/adapters", status_code=status.HTTP_201_CREATED, response_model=AdapterOut
)
async def upload_adapter(
    tenant_id: str,
    name: NameForm,
    files: FilesForm,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
) -> object:
    uploads = await _read(files, runtime.settings.adapter_limits.max_upload_bytes)
    return await crud.register_adapter(
        session, ctx=ctx, service=runtime.adapters, tenant_id=tenant_id, name=name, uploads=uploads
    )


@router.post("/adapters", status_code=status.HTTP_201_CREATED, response_model=AdapterOut)
async def upload_public_adapter(
    name: NameForm, files: FilesForm, session: SessionDep, ctx: AuditDep, runtime: RuntimeDep
) -> object:
    uploads = await _read(files, runtime.settings.adapter_limits.max_upload_bytes)
    return await crud.register_adapter(
        session, ctx=ctx, service=runtime.adapters, tenant_id=None, name=name, uploads=uploads
    )


@router.get("/tenants/{tenant_id}/adapters", response_model=list[AdapterOut])
async def list_adapters(tenant_id: str, session: SessionDep, principal: PrincipalDep) -> object:
    return await crud.list_adapters(session, principal=principal, tenant_id=tenant_id)


@router.get("/tenants/{tenant_id}/adapters/{adapter_id}", response_model=AdapterOut)
async def get_adapter(
    tenant_id: str, adapter_id: str, session: SessionDep, principal: PrincipalDep
) -> object:
    return await crud.load_adapter(
        session, principal=principal, tenant_id=tenant_id, adapter_id=adapter_id
    )


@router.delete("/tenants/{tenant_id}/adapters/{adapter_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter(
    tenant_id: str,
    adapter_id: str,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
) -> None:
    engine_name = await crud.delete_adapter(
        session, ctx=ctx, service=runtime.adapters, tenant_id=tenant_id, adapter_id=adapter_id
    )
    removal.removed([engine_name])
