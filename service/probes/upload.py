"""A golden set uploaded through the API (`POST /api/v1/probes/golden`): the body's schema and its reader.

`read_golden_upload` turns the raw request body into what the store keeps
(`GoldenText`): JSON decoding, the body's schema, every JSONL row, the
content version and the canonical JSONL. For a 10 MB body that is seconds of
pure-Python work, so the API runs it in a worker process
(`service/api/request_pool.py`), never on the event loop; its answer is a few
strings, cheap to send back. Errors are ragmon's own (`DecodeError`: not
JSON or not UTF-8; `InvalidInput`: the body or a row breaks the format), and
pickle with their message, so the process boundary changes nothing a caller
sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.errors import DecodeError, InvalidInput
from service.probes.golden import GoldenSet, GoldenText, parse_golden

__all__ = ["GoldenIn", "GoldenUpload", "read_golden_upload"]


class GoldenIn(BaseModel):
    """A golden set as JSONL text (the format of `service/probes/golden.py`) and the name it is kept under."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    jsonl: str
    source: str | None = Field(default=None, max_length=500, description="where it came from (a file name)")


@dataclass(frozen=True, slots=True)
class GoldenUpload:
    """An uploaded golden set, parsed: the name to keep it under and the set as the store keeps it."""

    name: str
    text: GoldenText
    rows: GoldenSet | None = None  # the parsed rows too, when asked for (to redact them)


def read_golden_upload(body: bytes, keep_rows: bool = False) -> GoldenUpload:
    """Parse a `GoldenIn` JSON body and every row of its JSONL (`keep_rows`: return the parsed rows too).

    Raises `DecodeError` when the body is not JSON, `InvalidInput` when it breaks
    `GoldenIn` or any row breaks the golden-set format (every bad line named)."""
    try:
        upload = GoldenIn.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise DecodeError(f"body is not valid JSON: {first['msg']}") from None
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidInput(f"{where}: {first['msg']}") from None
    golden = parse_golden(upload.jsonl.splitlines(), source=upload.source or upload.name)
    return GoldenUpload(upload.name, golden.as_text(), golden if keep_rows else None)
