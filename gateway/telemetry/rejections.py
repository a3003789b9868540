"""Rejected inference requests into the rejection log (the quota-state API's last hour).

Called by the error boundary after the metrics count. The log is beside the quota store (Redis in
the distributed mode); if it is down the rejection is answered all the same, and the lost count
is one WARNING line, never an error for the client.
"""

from __future__ import annotations

import logging

from tenancy.errors import ClientError
from tenancy.quota.rejections import RejectionLog

log = logging.getLogger(__name__)


async def record_rejection(
    rejections: RejectionLog, tenant_id: str, key_id: str | None, reason: str
) -> None:
    subjects = (f"t:{tenant_id}",) if key_id is None else (f"t:{tenant_id}", f"k:{key_id}")
    try:
        await rejections.record(subjects, reason)
    except ClientError:
        log.warning("rejection log unavailable; a %s rejection was not counted", reason)
