"""Reading the delay a server asks for in `Retry-After` (RFC 9110: delay-seconds or an HTTP date)."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` value, never negative; None when absent or unreadable."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
