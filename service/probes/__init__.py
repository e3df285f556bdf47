"""Golden sets and probes: known questions sent as tagged traffic, scored for retrieval quality.

Owns: golden sets (`golden.py`) and their store with probe runs and baselines (`store.py`), the probe
runner and its tagging (`runner.py`, `tagging.py`), scoring and comparing runs (`scoring.py`),
retrieval metrics as trec_eval computes them (`retrieval_metrics.py`, `trec.py`), probe gauges
(`gauges.py`), per-line input problems (`line_problems.py`), and `ragmon probe|golden|eval`
(`cli.py`, `eval_cli.py`).

May import: `judge` (answer correctness), `store`, `metrics`, `config`, `model`, `errors`.
"""
