"""How a probe request is tagged, and `ragmon_probe_attributes`, the helper an instrumented app calls.

`ragmon probe` sends each golden question to the app as

    POST <endpoint>
    x-ragmon-probe-run: <run id>
    x-ragmon-probe-question: <question id>
    content-type: application/json

    {"question": "<text>", "probe": {"run_id": "<run id>", "question_id": "<question id>"}}

The app answers as it answers anyone, and tags the trace of that request so
ragmon can score it against the golden set. With OpenTelemetry, set the span
attributes on the request's root span:

    from service.probes.tagging import ragmon_probe_attributes
    span.set_attributes(ragmon_probe_attributes(request.headers))

With the JSON API, send `probe_run_id` and `probe_question_id`
(`ragmon_probe_fields(request.headers)` gives them). The retriever should also
log the filter it applied and the ids it excluded (`ragmon.retrieval.filter`,
`ragmon.retrieval.excluded_ids`), so the filter false-exclusion rate can be
computed.

Guarantees: an ordinary request (no probe headers) gives `{}`, so the helper
can run on every request; header names match case-insensitively; values are
stripped and capped at 200 characters; a request with only one of the two
headers is tagged with the one it has. This module imports nothing outside
the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "PROBE_QUESTION_ATTRIBUTE",
    "PROBE_QUESTION_HEADER",
    "PROBE_RUN_ATTRIBUTE",
    "PROBE_RUN_HEADER",
    "ragmon_probe_attributes",
    "ragmon_probe_fields",
]

PROBE_RUN_HEADER = "x-ragmon-probe-run"
PROBE_QUESTION_HEADER = "x-ragmon-probe-question"
# Spelled out rather than imported from service/conventions/attributes.py, which pulls in the
# OpenInference package; a test keeps the two equal.
PROBE_RUN_ATTRIBUTE = "ragmon.probe.run_id"
PROBE_QUESTION_ATTRIBUTE = "ragmon.probe.question_id"
_MAX_CHARS = 200


def _header(headers: Mapping[str, str] | Iterable[tuple[str, str]], name: str) -> str | None:
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key.lower() == name:
            text = str(value).strip()[:_MAX_CHARS]
            return text or None
    return None


def ragmon_probe_fields(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """`probe_run_id` / `probe_question_id` for a JSON API trace, read from the request headers."""
    fields: dict[str, str] = {}
    run_id = _header(headers, PROBE_RUN_HEADER)
    question_id = _header(headers, PROBE_QUESTION_HEADER)
    if run_id is not None:
        fields["probe_run_id"] = run_id
    if question_id is not None:
        fields["probe_question_id"] = question_id
    return fields


def ragmon_probe_attributes(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """The span attributes that mark a request as golden-set probe traffic; `{}` for other requests.

    `headers` is any mapping of header names to values (Starlette, Flask,
    Django's `request.headers`, a plain dict) or a list of (name, value) pairs.
    """
    fields = ragmon_probe_fields(headers)
    attributes: dict[str, str] = {}
    if "probe_run_id" in fields:
        attributes[PROBE_RUN_ATTRIBUTE] = fields["probe_run_id"]
    if "probe_question_id" in fields:
        attributes[PROBE_QUESTION_ATTRIBUTE] = fields["probe_question_id"]
    return attributes
