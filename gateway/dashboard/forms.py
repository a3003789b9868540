"""What every dashboard form that changes something shares: the session's CSRF token checked
before anything runs, the audit context the admin API would build for the same principal, and
the result told after the redirect (post, redirect, get) by a fixed message's code.

A form acts as the viewer's principal through the same tenancy functions the admin API calls,
so the scoping (a tenant-admin reaches only its own tenant: another's is a 404) and the audit
entries are the API's, not a copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Form, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from gateway.admin.deps import get_audit_context
from gateway.dashboard.auth import Viewer, ViewerDep
from gateway.dashboard.routes import BAD_FORM, page, see_other
from gateway.dashboard.session import csrf_ok
from tenancy.auth.principal import AuditContext
from tenancy.errors import BadRequest

# ?done=<code> after a redirect: a code, never text from the request, so a link cannot make the
# page say something of its own.
FLASHES = {
    "tenant-created": "Tenant created.",
    "tenant-suspended": "Tenant suspended: its keys stop working within seconds.",
    "tenant-active": "Tenant reactivated.",
    "key-revoked": "Key revoked: it stops working within seconds.",
    "quota-saved": "Limits saved.",
    "quota-unchanged": "Nothing changed: no field was edited.",
    "adapter-uploaded": "Adapter uploaded.",
    "alias-switched": "Alias switched: every gateway serves the new version within seconds.",
}


NAME_RULE = (
    "letters, digits, '.', '_' and '-', starting with a letter or a digit, at most 64 characters"
)


class FormRefused(Exception):
    """A form without this session's CSRF token: refused before it does anything."""


@dataclass(frozen=True)
class Actor:
    viewer: Viewer
    ctx: AuditContext


async def get_actor(
    request: Request,
    viewer: ViewerDep,
    csrf_token: Annotated[str | None, Form(max_length=256)] = None,
) -> Actor:
    if not csrf_ok(viewer.session.csrf, csrf_token):
        raise FormRefused
    return Actor(viewer=viewer, ctx=get_audit_context(request, viewer.principal))


ActorDep = Annotated[Actor, Depends(get_actor)]


def wants_json(request: Request) -> bool:
    """The upload form's script asks for JSON; a form sent without script gets pages."""
    return "application/json" in request.headers.get("accept", "")


async def form_refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FormRefused)
    if wants_json(request):
        return JSONResponse({"error": {"message": BAD_FORM}}, status_code=403)
    dashboard = request.app.state.dashboard
    return page(dashboard, request, "error.html", 403, viewer=None, message=BAD_FORM)


def done(path: str, code: str) -> Response:
    assert code in FLASHES
    return see_other(f"{path}{'&' if '?' in path else '?'}done={code}")


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], **data: Any) -> M:
    """`model` from form fields; a refusal names the field, as the API's 400 does."""
    try:
        return model(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "form"
        # A name's pattern, said as a person would (pydantic quotes the regular expression).
        message = NAME_RULE if first["type"] == "string_pattern_mismatch" else first["msg"]
        raise BadRequest(f"{field}: {message}.", param=field) from exc


def optional_int(name: str, raw: str | None) -> int | None:
    """A limit field: empty means unlimited (None), otherwise a whole number >= 0."""
    text = (raw or "").strip().replace(",", "").replace("_", "")
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise BadRequest(
            f"{name}: a whole number of 0 or more, or empty for unlimited.", param=name
        )
    return int(text)


def duration_text(seconds: float) -> str:
    """A grace period as a person says it: 45 s, 10 min, 1 h, 2 days."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} days"
