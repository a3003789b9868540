"""The webhook signature: HMAC-SHA256 over `"<timestamp>.<body>"`, as Stripe signs its events.

Headers of every delivery:

    loragate-timestamp: 1764400000             (Unix seconds when this attempt was signed)
    loragate-signature: v1=<64 hex characters>  (HMAC-SHA256(secret, "1764400000." + body))

The timestamp is inside the signed text, so a receiver that refuses timestamps older than a few
minutes refuses replays of a captured delivery; a retry is signed afresh with its own time.
`verify` is the receiver's side (docs/operations.md shows it standalone).
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "loragate-timestamp"
SIGNATURE_HEADER = "loragate-signature"
EVENT_ID_HEADER = "loragate-event-id"
EVENT_TYPE_HEADER = "loragate-event-type"
ATTEMPT_HEADER = "loragate-delivery-attempt"
SCHEME = "v1"
DEFAULT_TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    return f"{SCHEME}={signature(secret, timestamp, body)}"


def verify(
    secret: str,
    *,
    body: bytes,
    timestamp: str,
    header: str,
    now: float | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> bool:
    """True when `header` holds a v1 signature of this body and timestamp under `secret` and
    the timestamp is within `tolerance_s` of now. Constant-time comparison."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent_at) > tolerance_s:
        return False
    expected = signature(secret, sent_at, body)
    for part in header.split(","):
        scheme, _, value = part.strip().partition("=")
        if scheme == SCHEME and hmac.compare_digest(value, expected):
            return True
    return False
