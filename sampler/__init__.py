"""Which traces get judged, and what the judged sample says about all traces.

`TraceSampler` (policy) picks traces by stratum with known inclusion
probabilities, `JudgeQueue` / `SqlJudgeQueue` hold the selected traces durably
until a judge worker takes them, `JudgeBudget` caps judge calls and spend and
`FairAdmission` shares it between tenants as workers take work (a tenant over
its share waits, deferred), and `hajek` turns judged scores back into a
population rate with a confidence interval; `corrected` adds the blind human
labels' correction of the judge's error (a two-phase difference estimator) and
`plan_labels` says how many labels that needs.
"""

from sampler.budget import (
    REFUSAL_REASONS,
    AdmissionBudget,
    BudgetConfig,
    BudgetCounts,
    JudgeBudget,
    RefusalReason,
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
from sampler.fair import FairAdmission, FairShares
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
    EXPIRED,
    ITEM_STATES,
    Admission,
    Claim,
    ItemKey,
    ItemState,
    JudgeItem,
    JudgeQueue,
    QueueRecord,
    QueueStats,
)
from sampler.queue_table import create_tables
from sampler.sql_queue import SqlJudgeQueue

__all__ = [
    "EXPIRED",
    "GROUPINGS",
    "ITEM_STATES",
    "OUTCOMES",
    "REFUSAL_REASONS",
    "STRATA",
    "Admission",
    "AdmissionBudget",
    "BudgetConfig",
    "BudgetCounts",
    "Claim",
    "CorrectedEstimate",
    "Decision",
    "DriftOutlierHook",
    "FairAdmission",
    "FairShares",
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
    "RefusalReason",
    "SampleCell",
    "SamplerConfig",
    "SamplerCounts",
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
