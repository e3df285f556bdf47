"""Which traces get judged, and what the judged sample says about all traces.

`TraceSampler` (policy) picks traces by stratum with known inclusion
probabilities, `JudgeBudget` caps judge calls and spend, `JudgeQueue` /
`SqlJudgeQueue` hold the selected traces durably until a judge worker takes
them, and `hajek` turns judged scores back into a population rate with a
confidence interval; `corrected` adds the blind human labels' correction of the judge's error
(a two-phase difference estimator) and `plan_labels` says how many labels that needs.
"""

from sampler.budget import (
    SKIP_REASONS,
    AdmissionBudget,
    BudgetConfig,
    BudgetCounts,
    JudgeBudget,
    SkipReason,
    TokenBucket,
)
from sampler.corrected import (
    CorrectedEstimate,
    LabelledSample,
    LabelPlan,
    corrected,
    corrected_by,
    corrected_cells,
    plan_labels,
)
from sampler.estimate import (
    GROUPINGS,
    OUTCOMES,
    FaithfulnessEstimate,
    Grouping,
    JudgedSample,
    Outcome,
    SampleCell,
    cells_of,
    estimate_by,
    estimate_cells_by,
    hajek,
    hajek_cells,
)
from sampler.policy import (
    STRATA,
    Decision,
    DriftOutlierHook,
    SamplerConfig,
    SamplerCounts,
    StrataRates,
    Stratum,
    TraceSampler,
    TraceSummary,
    selection_u,
)
from sampler.queue import (
    ITEM_STATES,
    ItemKey,
    ItemState,
    JudgeItem,
    JudgeQueue,
    QueueRecord,
    QueueStats,
    SqlJudgeQueue,
    create_tables,
)

__all__ = [
    "GROUPINGS",
    "ITEM_STATES",
    "OUTCOMES",
    "SKIP_REASONS",
    "STRATA",
    "AdmissionBudget",
    "BudgetConfig",
    "BudgetCounts",
    "CorrectedEstimate",
    "Decision",
    "DriftOutlierHook",
    "FaithfulnessEstimate",
    "Grouping",
    "ItemKey",
    "ItemState",
    "JudgeBudget",
    "JudgeItem",
    "JudgeQueue",
    "JudgedSample",
    "LabelPlan",
    "LabelledSample",
    "Outcome",
    "QueueRecord",
    "QueueStats",
    "SampleCell",
    "SamplerConfig",
    "SamplerCounts",
    "SkipReason",
    "SqlJudgeQueue",
    "StrataRates",
    "Stratum",
    "TokenBucket",
    "TraceSampler",
    "TraceSummary",
    "cells_of",
    "corrected",
    "corrected_by",
    "corrected_cells",
    "create_tables",
    "estimate_by",
    "estimate_cells_by",
    "hajek",
    "hajek_cells",
    "plan_labels",
    "selection_u",
]
