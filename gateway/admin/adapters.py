"""/admin/v1/tenants/{tenant_id}/adapters (tenant-owned), /admin/v1/adapters (public) and
/admin/v1/adapters/limits (what an upload must fit, for a client to check before it sends).

Each upload of a name adds its next version; `activate` (default true) points the name's alias
at it (gateway/admin/aliases.py for the alias itself)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from pydantic import BaseModel

from gateway.admin.deps import (
    AdapterRemovalDep,
    AuditDep,
    PrincipalDep,
    RuntimeDep,
    SessionDep,
)
from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.base_model import LORA_MODULES
from tenancy.adapters.errors import AdapterRejected
from tenancy.auth.authz import require_any_admin
from tenancy.crud import adapters as crud
from tenancy.schemas import AdapterOut

router = APIRouter(tags=["adapters"])

FilesForm = Annotated[list[UploadFile], File(description="PEFT files, or one .zip / .tar.gz")]
NameForm = Annotated[str, Form(max_length=10_000)]
ActivateForm = Annotated[
    bool,
    Form(
        description="Point the name's alias at this version (dropping any canary); false "
        "stages it, served only as `name@N` until a switch or a canary names it. The first "
        "version of a name always creates the alias."
    ),
]
BaseModelForm = Annotated[
    str | None,
    Form(
        max_length=256,
        description="The served base model the adapter is for (its shapes are checked against "
        "it); unset: the primary one. Every version of a name is on one base model.",
    ),
]
NameQuery = Annotated[
    str | None, Query(max_length=256, description="only the versions of this name")
]


async def read_uploads(files: list[UploadFile], limit: int) -> list[UploadedFile]:
    """The files' bytes, refused once they pass `limit` together (the API and the dashboard's
    upload form both read them here)."""
    out, total = [], 0
    for f in files:
        data = await f.read(limit - total + 1)
        total += len(data)
        if total > limit:
            raise AdapterRejected("The upload exceeds the size limit.")
        out.append(UploadedFile(filename=f.filename or "", data=data))
    return out


class AdapterLimitsOut(BaseModel):
    """The limits the server checks an upload against (LORAGATE_ADAPTER_LIMITS__*, the served
    base model): `loragate admin adapters upload` checks adapter_config.json and the files'
    sizes against them before it sends any weights."""

    max_rank: int
    max_upload_bytes: int
    max_files: int
    max_safetensors_header_bytes: int
    max_name_length: int
    base_model: str  # the primary one: an upload naming no base model is for it
    base_models: list[str]  # every served one, the primary first
    target_modules: list[str]


@router.get("/adapters/limits", response_model=AdapterLimitsOut)
async def adapter_limits(principal: PrincipalDep, runtime: RuntimeDep) -> AdapterLimitsOut:
    require_any_admin(principal)  # those who may upload; an inference key has no use for them
    limits, base = runtime.settings.adapter_limits, runtime.settings.base_model
    return AdapterLimitsOut(
        **limits.model_dump(exclude={"max_compression_ratio"}),
        base_model=base.name,
        base_models=runtime.adapters.base_models,
        target_modules=list(LORA_MODULES),
    )


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
    removal: AdapterRemovalDep,
    activate: ActivateForm = True,
    base_model: BaseModelForm = None,
) -> object:
    uploads = await read_uploads(files, runtime.settings.adapter_limits.max_upload_bytes)
    row = await crud.register_adapter(
        session, ctx=ctx, service=runtime.adapters, tenant_id=tenant_id, name=name,
        uploads=uploads, activate=activate, base_model=base_model,
    )  # fmt: skip
    removal.changed()
    return row


@router.post("/adapters", status_code=status.HTTP_201_CREATED, response_model=AdapterOut)
async def upload_public_adapter(
    name: NameForm,
    files: FilesForm,
    session: SessionDep,
    ctx: AuditDep,
    runtime: RuntimeDep,
    removal: AdapterRemovalDep,
    activate: ActivateForm = True,
    base_model: BaseModelForm = None,
) -> object:
    uploads = await read_uploads(files, runtime.settings.adapter_limits.max_upload_bytes)
    row = await crud.register_adapter(
        session, ctx=ctx, service=runtime.adapters, tenant_id=None, name=name, uploads=uploads,
        activate=activate, base_model=base_model,
    )  # fmt: skip
    removal.changed()
    return row


@router.get("/adapters", response_model=list[AdapterOut])
async def list_public_adapters(
    session: SessionDep, principal: PrincipalDep, name: NameQuery = None
) -> object:
    return await crud.list_public_adapters(session, principal=principal, name=name)


@router.get("/tenants/{tenant_id}/adapters", response_model=list[AdapterOut])
async def list_adapters(
    tenant_id: str, session: SessionDep, principal: PrincipalDep, name: NameQuery = None
) -> object:
    return await crud.list_adapters(session, principal=principal, tenant_id=tenant_id, name=name)


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
