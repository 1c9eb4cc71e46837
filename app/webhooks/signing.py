"""Standard Webhooks signatures, as OpenAI sends them and `client.webhooks.unwrap()` checks them.

The signed text is `"{webhook-id}.{webhook-timestamp}.{body}"`, HMAC-SHA256 under the secret
(the base64-decoded part after `whsec_`, or the raw text of any other secret), sent as
`webhook-signature: v1,<base64>`. The timestamp is the time of each attempt, so a retry is
signed afresh while its id and body stay the same.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from app.config.webhook_secret import secret_key


def sign(secret: str, webhook_id: str, timestamp: int, body: str) -> str:
    signed = f"{webhook_id}.{timestamp}.{body}".encode()
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, webhook_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The headers of one delivery attempt."""
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, webhook_id, timestamp, body),
    }
