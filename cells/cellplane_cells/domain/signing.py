"""HMAC-SHA256 signatures of outgoing calls and webhooks.

The signed message is ``timestamp + "." + body``, so a receiver can refuse a
replayed body by its age, as Stripe-style receivers do. The timestamp is a
parameter: this module reads no clock.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["sign", "verify", "SIGNATURE_HEADER", "TIMESTAMP_HEADER"]

SIGNATURE_HEADER = "X-Cellplane-Signature"
TIMESTAMP_HEADER = "X-Cellplane-Timestamp"


def sign(secret: str, body: bytes, *, timestamp: int) -> str:
    message = str(timestamp).encode() + b"." + body
    return "v1=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, *, timestamp: int, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, body, timestamp=timestamp), signature)
