"""ragmon's exception tree, and the one place that maps it to HTTP.

    RagmonError
    ├── PermanentError            same input, same failure: 4xx, never retried
    │   ├── DecodeError           body is not valid protobuf / JSON / UTF-8
    │   ├── InvalidInput          decodes, but breaks the schema (types, NaN, dimensions)
    │   ├── PayloadTooLarge       body over the configured limit
    │   ├── UnsupportedMediaType  content type or encoding we do not read
    │   ├── Unauthenticated       missing or unknown API key
    │   └── UnknownTenant         key valid, tenant not allowed here
    └── RetryableError            may pass later: 503 + Retry-After
        ├── QueueFull             a bounded queue or buffer is full
        ├── StoreUnavailable      the database did not answer
        └── JudgeUnavailable      the judge endpoint did not answer

Exceptions from kafka-python, SQLAlchemy and openai are caught only in
`service/bus/`, the stores (`service/store/` and each feature's `store.py`)
and the judges (`service/judge/`), and re-raised as one of these.
"""

from __future__ import annotations

from typing import Any


class RagmonError(Exception):
    """Base of every error ragmon raises on purpose. `reason` is a metric label value."""

    reason: str = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (service/ingest/pool.py). The default pickling
        # calls `cls(*args)` and loses keyword-only state such as `reason` and `retry_after_s`.
        return (_restore, (type(self), self.message, dict(self.__dict__)))


def _restore(cls: type[RagmonError], message: str, state: dict[str, Any]) -> RagmonError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class PermanentError(RagmonError):
    status_code = 400


class DecodeError(PermanentError):
    reason = "decode_error"


class InvalidInput(PermanentError):
    status_code = 422
    reason = "invalid_input"


class PayloadTooLarge(PermanentError):
    status_code = 413
    reason = "too_large"


class UnsupportedMediaType(PermanentError):
    status_code = 415
    reason = "unsupported_media_type"


class RequestTimeout(PermanentError):
    status_code = 408
    reason = "body_timeout"


class Unauthenticated(PermanentError):
    status_code = 401
    reason = "unauthenticated"


class UnknownTenant(PermanentError):
    status_code = 403
    reason = "forbidden"


class RetryableError(RagmonError):
    status_code = 503
    reason = "unavailable"

    def __init__(self, message: str, *, reason: str | None = None, retry_after_s: float = 1.0) -> None:
        super().__init__(message, reason=reason)
        self.retry_after_s = retry_after_s


class QueueFull(RetryableError):
    reason = "queue_full"


class StoreUnavailable(RetryableError):
    reason = "store_unavailable"


class JudgeUnavailable(RetryableError):
    reason = "judge_unavailable"


def http_status(exc: RagmonError) -> int:
    """The HTTP status for an error: the single place this mapping lives."""
    return int(getattr(exc, "status_code", 500))


def retry_after_header(exc: RagmonError) -> dict[str, str]:
    """`Retry-After` (whole seconds, at least 1) for retryable errors, nothing otherwise."""
    if isinstance(exc, RetryableError):
        return {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    return {}
