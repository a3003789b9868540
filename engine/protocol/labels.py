"""How a tenant appears in metric labels, on both sides of the wire: a short digest of its key
(the gateway's tenant id; the engine's fairness key, which the gateway sets to the same id), so
the gateway's and the engine's series of one tenant carry the same label and neither exposes
the id. The engine falls back to a cache salt when no fairness key is sent, which must never
appear in clear either."""

from __future__ import annotations

import hashlib

NO_TENANT = "none"


def tenant_label(key: str) -> str:
    if not key:
        return NO_TENANT
    return "t_" + hashlib.sha256(key.encode()).hexdigest()[:12]
