"""`ragmon demo`: a simulated RAG app, instrumented with the OpenTelemetry SDK, and its traffic.

Owns: the app's corpus (`corpus.py`), its traffic as data (`traffic.py`), the run that sends it
(`run.py`) and the command's flags (`cli.py`, light, so that `ragmon --help` loads no SDK).

May import: `model`, `config`, `errors`; the demo talks to ragmon over HTTP like any app.
"""
