"""Typed identifiers shared by every tenancy layer (all are UUID4 strings on the wire and in SQL)."""

from __future__ import annotations

import uuid
from typing import NewType

TenantId = NewType("TenantId", str)
ApiKeyId = NewType("ApiKeyId", str)
AdapterId = NewType("AdapterId", str)
QuotaPolicyId = NewType("QuotaPolicyId", str)
RequestId = NewType("RequestId", str)
AuditEventId = NewType("AuditEventId", str)


def new_id() -> str:
    return str(uuid.uuid4())
