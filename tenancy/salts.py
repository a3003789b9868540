"""Per-tenant prefix-cache salt: HMAC-SHA256(server secret, tenant id | salt epoch), base64url.

The engine keys the first KV block of every prompt by this salt, so two tenants never share
cached blocks. Bumping the tenant's epoch yields a new salt, orphaning its cached prefixes.
A salt is derived, never stored, never logged, and never chosen by a client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from tenancy.ids import TenantId


@dataclass(frozen=True)
class SaltDeriver:
    secret: bytes

    def salt(self, tenant_id: TenantId, epoch: int) -> str:
        message = f"loragate-cache-salt\x00{tenant_id}\x00{epoch}".encode()
        digest = hmac.new(self.secret, message, hashlib.sha256).digest()  # 256 bits
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def __repr__(self) -> str:  # the secret never reaches a log line through repr()
        return "SaltDeriver(secret=***)"
