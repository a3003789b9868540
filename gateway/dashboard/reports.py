"""Two read-only pages: a tenant's usage over a chosen time range (presets and custom dates),
charted by model and summed per key and per model; and the audit log, filtered by tenant (an
admin), actor, action and dates, with a CSV export of the same filters.

Both read through the scoped functions the admin API reads through (`load_tenant`,
`list_events`): a tenant-admin sees only its own tenant, whatever the query string says.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.dashboard import views
from gateway.dashboard.auth import ViewerDep
from gateway.dashboard.charts import usage_chart
from gateway.dashboard.routes import HEADERS, page
from gateway.dashboard.state import DashboardDep
from gateway.dashboard.time_range import TimeRange, day_range, time_range
from gateway.deps import StateDep
from tenancy.auditing.actors import actor_names
from tenancy.auditing.read import list_events
from tenancy.crud.tenants import list_tenants, load_tenant
from tenancy.crud.usage_breakdown import usage_totals
from tenancy.dashboard_reads import usage_series
from tenancy.errors import ClientError

router = APIRouter(prefix="/dashboard", tags=["dashboard"])

NUM_AUDIT_ROWS = 200  # on the page; the CSV holds up to NUM_CSV_ROWS
NUM_CSV_ROWS = 10_000
ACTIONS = (
    "tenant.create", "tenant.update", "tenant.delete", "tenant.rotate_salt", "key.create",
    "key.rotate", "key.revoke", "quota.put", "adapter.create", "adapter.delete", "alias.create",
    "alias.switch", "alias.canary_set", "alias.canary_clear", "alias.delete",
)  # fmt: skip
CSV_COLUMNS = (
    "created_at", "tenant_id", "actor", "actor_name", "action", "object_type", "object_id",
    "request_id", "client_addr", "before", "after",
)  # fmt: skip


@router.get("/tenants/{tenant_id}/usage")
async def usage_page(
    tenant_id: str,
    request: Request,
    dashboard: DashboardDep,
    state: StateDep,
    viewer: ViewerDep,
    range: str = "7d",
) -> Response:
    params, now = request.query_params, state.tenancy.now()
    span: TimeRange = time_range(range, params.get("from", ""), params.get("to", ""), now)
    principal = viewer.principal
    async with state.tenancy.sessionmaker() as session:
        try:
            tenant = await load_tenant(session, principal=principal, tenant_id=tenant_id)
        except ClientError:
            return page(dashboard, request, "error.html", 404, viewer=viewer,
                        message="No such tenant.")  # fmt: skip
        points = await usage_series(
            session, tenant_id=tenant_id, since=span.since, until=span.until,
            bucket="hour" if span.step == dt.timedelta(hours=1) else "day",
        )  # fmt: skip
        per_key, per_model = [
            await usage_totals(
                session, principal=principal, tenant_id=tenant_id, since=span.since,
                until=span.until, by=by,
            )
            for by in ("key", "model")
        ]  # fmt: skip
        keys = {k.id: k for k in await views.key_rows(session, principal, tenant_id, now)}
    chart = usage_chart(
        points, title=span.title, start=span.since, step=span.step,
        num_buckets=span.num_buckets, label_every=span.label_every,
        label_format=span.label_format,
    )  # fmt: skip
    return page(
        dashboard, request, "usage.html", 400 if span.error else 200, viewer=viewer,
        tenant=tenant, span=span, chart=chart, per_key=per_key, keys=keys, tab="usage",
        # named as the chart's legend names them
        per_model=[(f"{t.model} (adapter)" if t.adapter_id else t.model, t) for t in per_model],
    )  # fmt: skip


async def _audit_rows(
    state: StateDep, viewer: ViewerDep, request: Request, limit: int
) -> tuple[dict[str, str], list[views.AuditRow], str]:
    params = request.query_params
    filters = {k: params.get(k, "").strip()[:256] for k in ("tenant_id", "actor", "action")}
    since, until, error = day_range(params.get("from", ""), params.get("to", ""))
    async with state.tenancy.sessionmaker() as session:
        events = await list_events(
            session, principal=viewer.principal, tenant_id=filters["tenant_id"] or None,
            actor=filters["actor"] or None, action=filters["action"] or None, since=since,
            until=until, limit=limit,
        )  # fmt: skip
        names = await actor_names(session, (e.actor for e in events))
    rows = [views.AuditRow(event=e, actor_name=names[e.actor]) for e in events]
    shown = {**filters, "from": params.get("from", ""), "to": params.get("to", "")}
    return shown, rows, error


@router.get("/audit")
async def audit_page(
    request: Request, dashboard: DashboardDep, state: StateDep, viewer: ViewerDep
) -> Response:
    filters, rows, error = await _audit_rows(state, viewer, request, NUM_AUDIT_ROWS)
    async with state.tenancy.sessionmaker() as session:
        tenants = await list_tenants(session, principal=viewer.principal)
        # The actor choices: who acted in the viewer's scope lately, by name.
        recent = await list_events(session, principal=viewer.principal, limit=500)
        actors = await actor_names(session, (e.actor for e in recent))
    return page(
        dashboard, request, "audit.html", 400 if error else 200, viewer=viewer, rows=rows,
        filters=filters, error=error, tenants=tenants, actions=ACTIONS,
        actors=sorted(actors.items(), key=lambda a: a[1].lower()),
        tenant_names={t.id: t.name for t in tenants}, limit=NUM_AUDIT_ROWS,
        csv_query=request.url.query,
    )  # fmt: skip


def _cell(value: object) -> str:
    text = "" if value is None else json.dumps(value) if isinstance(value, dict) else str(value)
    # A spreadsheet runs a cell that starts with one of these as a formula.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@router.get("/audit.csv")
async def audit_csv(request: Request, state: StateDep, viewer: ViewerDep) -> Response:
    _, rows, _ = await _audit_rows(state, viewer, request, NUM_CSV_ROWS)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        e = row.event
        values = {c: getattr(e, c, None) for c in CSV_COLUMNS}
        values["created_at"] = e.created_at.isoformat()
        values["actor_name"] = row.actor_name
        writer.writerow([_cell(values[c]) for c in CSV_COLUMNS])
    stamp = state.tenancy.now().strftime("%Y%m%d-%H%M%S")
    headers = {
        **HEADERS,
        "content-disposition": f'attachment; filename="loragate-audit-{stamp}.csv"',
    }
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)
