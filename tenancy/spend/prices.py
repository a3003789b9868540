"""Prices in the database (the admin API sets them; admin only, audited), and the price a
request pays: its adapter's row, else its base model's row, else the model's default from
settings (`LORAGATE_PRICES`), else nothing (free)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.auditing.write import record_event, snapshot
from tenancy.auth.authz import require_admin
from tenancy.auth.principal import AuditContext, Principal
from tenancy.errors import NotFound
from tenancy.ids import new_id
from tenancy.spend.money import Price, from_micros
from tenancy.spend.schemas import PriceIn, PriceOut, PriceSpec
from tenancy.sql.models import Adapter, utcnow
from tenancy.sql.models import Price as PriceRow


async def _find(session: AsyncSession, model: str, adapter_id: str | None) -> PriceRow | None:
    query = select(PriceRow).where(PriceRow.model == model)
    query = query.where(
        PriceRow.adapter_id.is_(None) if adapter_id is None else PriceRow.adapter_id == adapter_id
    )
    return (await session.scalars(query)).first()


def _price(row: PriceRow) -> Price:
    return Price(
        prompt_micros_per_mtok=row.prompt_micros_per_mtok,
        cached_micros_per_mtok=row.cached_micros_per_mtok,
        completion_micros_per_mtok=row.completion_micros_per_mtok,
    )


def price_out(
    *, model: str, adapter_id: str | None, price: Price, currency: str, source: str,
    updated_at: object = None,
) -> PriceOut:  # fmt: skip
    return PriceOut(
        model=model,
        adapter_id=adapter_id,
        currency=currency,
        prompt=from_micros(price.prompt_micros_per_mtok),
        cached=from_micros(price.cached_micros_per_mtok),
        completion=from_micros(price.completion_micros_per_mtok),
        prompt_micros_per_mtok=price.prompt_micros_per_mtok,
        cached_micros_per_mtok=price.cached_micros_per_mtok,
        completion_micros_per_mtok=price.completion_micros_per_mtok,
        source=source,
        updated_at=updated_at,  # type: ignore[arg-type]
    )


async def list_prices(
    session: AsyncSession, *, principal: Principal, defaults: dict[str, PriceSpec], currency: str
) -> list[PriceOut]:
    """The database's rows, then the settings' defaults of models without a row of their own."""
    require_admin(principal)
    rows = (
        await session.scalars(select(PriceRow).order_by(PriceRow.model, PriceRow.adapter_id))
    ).all()
    out = [
        price_out(
            model=r.model,
            adapter_id=r.adapter_id,
            price=_price(r),
            currency=currency,
            source="database",
            updated_at=r.updated_at,
        )
        for r in rows
    ]
    priced = {r.model for r in rows if r.adapter_id is None}
    out += [
        price_out(
            model=model,
            adapter_id=None,
            price=spec.to_price(),
            currency=currency,
            source="settings",
        )
        for model, spec in sorted(defaults.items())
        if model not in priced
    ]
    return out


async def put_price(
    session: AsyncSession, *, ctx: AuditContext, body: PriceIn, currency: str
) -> PriceOut:
    """Create or replace the price of a model (or of one adapter on it). Takes effect on every
    gateway within its policy cache TTL; requests already admitted keep their price."""
    require_admin(ctx.principal)
    if body.adapter_id is not None and await session.get(Adapter, body.adapter_id) is None:
        raise NotFound("Adapter")
    row = await _find(session, body.model, body.adapter_id)
    before = snapshot(row)
    if row is None:
        row = PriceRow(id=new_id(), model=body.model, adapter_id=body.adapter_id)
        session.add(row)
    price = body.to_price()
    row.prompt_micros_per_mtok = price.prompt_micros_per_mtok
    row.cached_micros_per_mtok = price.cached_micros_per_mtok
    row.completion_micros_per_mtok = price.completion_micros_per_mtok
    row.updated_at = utcnow()
    await session.flush()
    record_event(
        session, ctx=ctx, action="price.put", object_type="price", object_id=row.id,
        tenant_id=None, before=before, after=snapshot(row),
    )  # fmt: skip
    await session.commit()
    return price_out(
        model=row.model, adapter_id=row.adapter_id, price=price, currency=currency,
        source="database", updated_at=row.updated_at,
    )  # fmt: skip


async def price_for(
    session: AsyncSession, *, model: str, adapter_id: str | None, defaults: dict[str, PriceSpec]
) -> Price:
    """The price a request to `model` (through `adapter_id`, if any) pays now."""
    if adapter_id is not None and (row := await _find(session, model, adapter_id)) is not None:
        return _price(row)
    if (row := await _find(session, model, None)) is not None:
        return _price(row)
    spec = defaults.get(model)
    return spec.to_price() if spec is not None else Price()
