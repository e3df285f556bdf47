"""Tests of service/redaction.py: what each built-in kind takes and leaves, and that a redacted trace is
what is stored, judged and shown (through a real server), counted by kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.config import ConfigError, RedactionConfig, load_config
from service.metrics import Metrics
from service.redaction import Redactor
from tests.live_server import live_server


def redactor(**config: object) -> Redactor:
    return Redactor(RedactionConfig(enabled=True, **config), Metrics())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail jane.doe+x@example.co.uk now", "mail [REDACTED:email] now"),
        ("card 4111 1111 1111 1111 ok", "card [REDACTED:card] ok"),
        ("card 4111-1111-1111-1112 fails Luhn", "card 4111-1111-1111-1112 fails Luhn"),
        ("call +44 20 7946 0958 today", "call [REDACTED:phone] today"),
        ("order 12345 of 2026-12-01", "order 12345 of 2026-12-01"),
        ("call 415-555-2671", "call [REDACTED:phone]"),
        ("version 1.2.3.4 and 10.0.0.1", "version 1.2.3.4 and 10.0.0.1"),
        ("key sk-proj-abcdefghijklmnop1234 leaked", "key [REDACTED:api_key] leaked"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "aws [REDACTED:api_key] here"),
        ("header Bearer eyJhbGciOiJIUzI1NiJ9.payload", "header Bearer [REDACTED:api_key]"),
        ("nothing personal here", "nothing personal here"),
    ],
)
def test_builtin_kinds_take_what_they_name_and_leave_the_rest(text: str, expected: str) -> None:
    assert redactor().text(text) == expected


def test_kinds_and_patterns_are_chosen_and_counted() -> None:
    metrics = Metrics()
    only_email = Redactor(
        RedactionConfig(enabled=True, builtin=["email"], patterns={"ticket": r"TCK-\d+"}), metrics
    )
    out = only_email.text("a@b.io, b@c.io, TCK-991, +44 20 7946 0958")
    assert out == "[REDACTED:email], [REDACTED:email], [REDACTED:ticket], +44 20 7946 0958"
    assert metrics.registry.get_sample_value("ragmon_redactions_total", {"kind": "email"}) == 2
    assert metrics.registry.get_sample_value("ragmon_redactions_total", {"kind": "ticket"}) == 1


def test_redaction_and_the_raw_phoenix_tee_are_refused_together() -> None:
    with pytest.raises(ConfigError, match="Phoenix tee"):
        load_config(
            environ={},
            overrides={"redaction": {"enabled": True}, "phoenix": {"endpoint": "http://phoenix:6006"}},
        )
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        load_config(environ={}, overrides={"redaction": {"enabled": True, "patterns": {"bad": "(("}}})


def test_what_is_stored_and_shown_is_redacted(tmp_path: Path) -> None:
    settings = {"redaction": {"enabled": True}, "assembler": {"grace_s": 0.05}}
    record = {
        "trace_id": f"{7:032x}",
        "app": "pii-app",
        "query": "my card is 4111 1111 1111 1111, mail me at ann@example.com",
        "answer": "We emailed ann@example.com.",
        "retrieval": {"chunks": [{"id": "c1", "content": "Customer phone +1 (415) 555-2671"}]},
    }
    with live_server(tmp_path, **settings) as server:
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": [record]}).status_code == 200
            event = {"trace_id": record["trace_id"], "kind": "down", "text": "call me on +1 415 555 2671"}
            assert client.post("/api/v1/feedback", json=event).status_code == 200
        server.flush()
        with server.client() as client:
            stored = client.get(f"/api/v1/traces/{record['trace_id']}").json()
        with server.pipeline.store.engine.connect() as conn:
            rows = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM traces")).all()], default=str
            )
            contexts = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM trace_contexts")).all()]
            )
            feedback = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM feedback")).all()], default=str
            )
        for text in (json.dumps(stored), rows, contexts, feedback):
            assert "4111 1111" not in text and "ann@example.com" not in text and "555" not in text
        assert stored["query"] == "my card is [REDACTED:card], mail me at [REDACTED:email]"
        assert server.metric("ragmon_redactions_total", kind="email") == 2
        assert server.metric("ragmon_redactions_total", kind="phone") == 2
