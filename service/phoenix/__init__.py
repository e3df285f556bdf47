"""Arize Phoenix interop: the OTLP tee to a Phoenix server and judgments as Phoenix annotations.

Owns: one bounded HTTP client and its failure reasons (`client.py`), the forwarding tee
(`forward.py`) and the annotator (`annotations.py`). The Phoenix evals judge is a judge and lives in
`service/judge/phoenix_evals.py`.

May import: `review`, `judge`, `metrics`, `config`, `model`, `lifecycle`.
"""
