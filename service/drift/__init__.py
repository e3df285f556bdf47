"""Drift in the running service: observation windows, pinned references, scheduled checks, the CLI.

Owns: the window sink (`window_sink.py`), the scheduler (`monitor.py`), pinning references
(`pinning.py`), one check of every detector against a reference (`checks.py`), observations and
their uniform samples (`sample.py`), references and runs in the database (`store.py`; its tables in
`tables.py`, the records it takes and returns and their rows in `records.py`), the query embedder
fitted on a reference and stored with it (`embedders.py`), and `ragmon drift` (`cli.py`).
The detectors themselves are in `detectors/`.

May import: `detectors`, `store`, `metrics`, `config`, `model`, `errors`, `lifecycle`.
"""
