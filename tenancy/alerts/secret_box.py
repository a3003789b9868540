"""Webhook signing secrets at rest.

Unlike an API key (stored only as an HMAC), a signing secret must be read back to sign each
delivery. It is stored encrypted (AES-256-GCM, a fresh 96-bit nonce per secret, the webhook's
id as associated data so a ciphertext copied onto another tenant's row does not decrypt), under
a key derived from `LORAGATE_KEY_PEPPER`: a copy of the database alone reveals no secret. The
clear secret appears once, in the answer that created (or rotated) it, and never in a log.
Changing the pepper makes stored secrets unreadable: rotate each webhook's secret afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SECRET_PREFIX = "whsec_"
_CONTEXT = b"loragate/webhook-signing-secret/v1"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class SecretBox:
    def __init__(self, pepper: bytes) -> None:
        self._aead = AESGCM(hmac.new(pepper, _CONTEXT, hashlib.sha256).digest())

    def seal(self, secret: str, *, webhook_id: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, secret.encode(), webhook_id.encode())
        return base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, stored: str, *, webhook_id: str) -> str:
        """Raises ValueError when the stored value was not sealed for this webhook and key."""
        raw = base64.urlsafe_b64decode(stored.encode())
        try:
            return self._aead.decrypt(raw[:12], raw[12:], webhook_id.encode()).decode()
        except InvalidTag as exc:
            raise ValueError("the webhook secret cannot be decrypted with this key") from exc
