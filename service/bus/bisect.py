"""`deliver_in_parts`: after a subscriber refused a batch for good, deliver all of it that it takes.

A permanent (non-retryable) refusal of a batch may be one bad record in it: the
batch is delivered again as two halves, each half split again if refused,
down to single records, which go to the dead-letter handler with the error
that refused them. One poison record among 500 costs about 2 log2(500) ~ 18
extra deliveries and nothing else. A `RetryableError` on the way ends the
split at once (raised): the caller retries what it has not settled, and a part
delivered twice is harmless, as every subscriber is idempotent by record id.

Used by the memory bus (`memory.py`) and the Kafka receiver (`kafka.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from service.errors import RetryableError

__all__ = ["deliver_in_parts"]

T = TypeVar("T")


async def deliver_in_parts(
    part: Sequence[T],
    error: Exception,
    deliver: Callable[[Sequence[T]], Awaitable[None]],
    dead_letter: Callable[[Sequence[T], Exception], Awaitable[None]],
    delivered: Callable[[int], None] = lambda n: None,
) -> None:
    """Settle `part`, which `deliver` refused with `error`: one record goes to `dead_letter`, a longer
    part is delivered as two halves, each settled again if refused. `delivered(n)` is told of each
    part taken, in order. Raises `RetryableError` from either callable."""
    if len(part) == 1:
        await dead_letter(part, error)
        return
    middle = len(part) // 2
    for half in (part[:middle], part[middle:]):
        try:
            await deliver(half)
        except RetryableError:
            raise
        except Exception as exc:
            await deliver_in_parts(half, exc, deliver, dead_letter, delivered)
        else:
            delivered(len(half))
