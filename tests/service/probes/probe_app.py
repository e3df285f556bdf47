"""A tiny real RAG "app" for probe tests: an HTTP server that answers probe questions and reports traces.

It answers `POST /ask` in the shape `ragmon probe` sends, records every
request, and (when `ragmon_url` is given) reports one instrumented trace per
request to ragmon's JSON API, tagged with `ragmon_probe_fields(headers)`:
retrieved chunk ids in rank order, the filter predicate it applied, the ids
that filter excluded, and an answer built from the chunks it kept.

`corpus` maps a question text to (gold chunk id, the fact the gold states);
`drop_gold_for` is a set of question texts for which a relevance filter
silently drops the gold chunk (it then appears in `excluded_ids`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from service.probes.tagging import ragmon_probe_fields


@dataclass
class ProbeApp:
    corpus: dict[str, tuple[str, str]]
    ragmon_url: str | None = None
    drop_gold_for: set[str] = field(default_factory=set)
    fail_for: set[str] = field(default_factory=set)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def answer(self, headers: dict[str, str], body: dict[str, Any]) -> int:
        self.requests.append({"headers": headers, "body": body})
        question = str(body.get("question", ""))
        if question in self.fail_for:
            return 500
        gold, fact = self.corpus.get(question, ("none", ""))
        ranking = [gold, f"{gold}-near", f"{gold}-far"]
        excluded: list[str] = []
        if question in self.drop_gold_for:
            excluded = [gold]
            ranking = [c for c in ranking if c != gold] + [f"{gold}-other"]
        answer = fact if gold in ranking else "I could not find that in the documents."
        if self.ragmon_url is not None:
            trace = {
                "trace_id": uuid.uuid4().hex,
                "app": "probe-app",
                "query": question,
                "answer": answer,
                "retrieval": {
                    "chunks": [{"id": c, "content": fact if c == gold else f"text of {c}"} for c in ranking],
                    "filter": "tenant = 'acme' AND relevant",
                    "excluded_ids": excluded,
                },
                **ragmon_probe_fields(headers),
            }
            sent = httpx.post(f"{self.ragmon_url}/api/v1/traces", json={"traces": [trace]}, timeout=10)
            sent.raise_for_status()
            if sent.json()["rejected"]:
                raise ValueError(f"ragmon refused the trace: {sent.json()['rejected']}")
        return 200


@contextmanager
def probe_app(app: ProbeApp) -> Iterator[ProbeApp]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            status = app.answer({k.lower(): v for k, v in self.headers.items()}, body)
            payload = json.dumps({"answer": "ok" if status == 200 else "error"}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    app.url = f"http://127.0.0.1:{server.server_address[1]}/ask"
    try:
        yield app
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
