"""`ragmon demo`: a simulated RAG app, instrumented with the OpenTelemetry SDK, and its traffic.

Owns: the app's corpus (`corpus.py`), its traffic as data (`traffic.py`) and the run that sends it
(`run.py`).

May import: `model`, `config`, `errors`; the demo talks to ragmon over HTTP like any app.
"""
