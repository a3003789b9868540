"""The quota stores' subject keys: who a counter counts, as one string.

    t:<tenant id>               the tenant's all-models policy (always the first of an admission)
    k:<key id>                  one key's all-models policy
    t:<tenant id>/m:<model>     the tenant's policy for one served base model
    k:<key id>/m:<model>        one key's policy for one served base model

Ids are UUIDs and never hold '/', so the part before the first '/m:' names the tenant or key,
and a model's subject never collides with the all-models one. The Redis store's keys take the
first subject of an admission, the tenant's (no braces), as their hash tag
(tenancy/quota/redis_store.py): whatever a served name holds after it leaves the slot alone.
"""

from __future__ import annotations

MODEL_SEPARATOR = "/m:"


def tenant_subject(tenant_id: str, model: str | None = None) -> str:
    return f"t:{tenant_id}" if model is None else f"t:{tenant_id}{MODEL_SEPARATOR}{model}"


def key_subject(key_id: str, model: str | None = None) -> str:
    return f"k:{key_id}" if model is None else f"k:{key_id}{MODEL_SEPARATOR}{model}"


def key_id_of(subject: str) -> str | None:
    """The key a subject counts (None: a tenant's)."""
    if not subject.startswith("k:"):
        return None
    return subject[2:].partition(MODEL_SEPARATOR)[0]


def model_of(subject: str) -> str | None:
    """The base model a subject counts (None: every model)."""
    _, separator, model = subject.partition(MODEL_SEPARATOR)
    return model if separator else None
