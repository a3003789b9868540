"""Readable actors for the audit log: `key:<id>` -> the key's name.

The name is joined at read time, from the audit log itself, not stored at write time: every key
row is made by `create_key` or `rotate_key`, and each records a `key.create` event whose `after`
snapshot holds the key's name (names never change). That event is append-only and outlives the
key: a revoked or rotated key keeps its row, and a tenant's hard delete cascades its keys but
not its audit events. Storing the name on each event instead would put it on the `Principal`,
which the key verifier and its shared cache do not carry, and would add a column to a log whose
rows already say it once. A key with no creation event (a row made outside the CRUD functions)
falls back to its `api_keys` row; one with neither shows its raw actor.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenancy.sql.models import ApiKey, AuditEvent

KEY_ACTOR = "key:"


def key_id_of(actor: str) -> str | None:
    return actor[len(KEY_ACTOR) :] if actor.startswith(KEY_ACTOR) else None


async def actor_names(session: AsyncSession, actors: Iterable[str]) -> dict[str, str]:
    """actor -> readable name; an actor that is not a key (`oidc:...`, `system:...`) reads as
    itself, as does a key whose name is nowhere to be found."""
    actors = set(actors)
    key_ids = {k for k in map(key_id_of, actors) if k is not None}
    names: dict[str, str] = {}
    if key_ids:
        e = AuditEvent
        created = await session.execute(
            select(e.object_id, e.after).where(
                e.action == "key.create", e.object_type == "api_key", e.object_id.in_(key_ids)
            )
        )
        for key_id, after in created:
            name = (after or {}).get("name")
            if isinstance(name, str):
                names[key_id] = name
        missing = key_ids - names.keys()
        if missing:
            rows = await session.execute(
                select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(missing))
            )
            names.update({key_id: name for key_id, name in rows})
    out = {}
    for actor in actors:
        key_id = key_id_of(actor)
        out[actor] = names.get(key_id, actor) if key_id is not None else actor
    return out
