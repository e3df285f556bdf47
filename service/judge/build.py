"""`build_judge`: which judge a configuration runs.

The choice is made in one place so that the judges do not import each other:
the LLM judge, the offline heuristic and the Phoenix evals judge each stand
alone, and only this module knows all three.
"""

from __future__ import annotations

from service.config import JudgeConfig
from service.judge.heuristic import HeuristicJudge
from service.judge.judgment import CostFn, Judge

__all__ = ["build_judge"]


def build_judge(config: JudgeConfig | None = None, *, cost_fn: CostFn | None = None) -> Judge:
    """The judge to run: phoenix_evals when `judge.backend` says so, else the LLM judge when an endpoint is
    configured, else the offline judge `judge.offline` names (heuristic, the default, or learned).
    Raises ValueError for phoenix_evals without an endpoint."""
    config = config or JudgeConfig()
    if config.backend == "phoenix_evals":
        # arize-phoenix-evals is needed only by this backend
        from service.judge.phoenix_evals import PhoenixEvalsJudge

        return PhoenixEvalsJudge(config, cost_fn=cost_fn)
    if config.endpoint_configured():
        # the openai SDK takes half a second to import; the offline judge never needs it
        from service.judge.llm import LlmJudge

        return LlmJudge(config, cost_fn=cost_fn)
    if config.offline == "learned":
        from service.judge.learned import LearnedJudge

        return LearnedJudge()
    return HeuristicJudge()
