"""Faithfulness judging: the judges, their records, and judging in the running service.

Owns: the judge's record (`judgment.py`: `Verdict`, `Judgment`, the `Judge` protocol), the LLM judge
(`llm.py`), its prompt (`prompt.py`), the offline heuristic judge (`heuristic.py`), the Phoenix evals
judge (`phoenix_evals.py`), the choice between them (`build.py`), the judgment store (`store.py`),
the judge-queue sink, judge worker and faithfulness estimator (`judging.py`), the deployment's judge
budget kept in the database and leased to each process (`shared_budget.py`), answer correctness
against golden facts (`correctness.py`) and `Retry-After` parsing (`retry_after.py`).

May import: `store`, `metrics`, `config`, `model`, `errors`, `lifecycle`, and `sampler`.
Add a judge here and choose it in `build.py`.
"""
