"""Rejected inference requests into the rejection log (the quota-state API's last hour).

Called by the error boundary after the metrics count. The log is beside the quota store (Redis in
the distributed mode); if it is down the rejection is answered all the same, and the lost count
is one WARNING line, never an error for the client.
"""

from __future__ import annotations

import logging

from tenancy.errors import ClientError
from tenancy.quota.rejections import RejectionLog
from tenancy.quota.subjects import key_subject, tenant_subject

log = logging.getLogger(__name__)


async def record_rejection(
    rejections: RejectionLog, tenant_id: str, key_id: str | None, reason: str
) -> None:
    tenant = tenant_subject(tenant_id)
    subjects = (tenant,) if key_id is None else (tenant, key_subject(key_id))
    try:
        await rejections.record(subjects, reason)
    except ClientError:
        log.warning("rejection log unavailable; a %s rejection was not counted", reason)
