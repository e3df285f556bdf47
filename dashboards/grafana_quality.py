"""The quality dashboard: judged faithfulness with its intervals, the judge against the reviewers,
verdicts and diagnoses, judge cost and the judge queue.
"""

from __future__ import annotations

from typing import Any

from dashboards.grafana_board import APPS, Band, Board, Limit, single_value
from dashboards.thresholds import Thresholds

__all__ = ["quality"]


def quality(t: Thresholds) -> dict[str, Any]:
    """Faithfulness with its interval, verdicts and diagnoses, judge calibration, cost and the judge queue."""
    b = Board(
        t, "ragmon / quality", "ragmon-quality", "Judged faithfulness of the answers and the judge behind it."
    )
    floor = Limit((t.faithfulness.upper_bound_min,), floor=True)
    b.variable(
        single_value(
            "judge_version",
            "Judge version",
            "label_values(ragmon_judge_calibration_pairs, judge_version)",
            "the judge version whose agreement with the reviewers the calibration panels show",
        )
    )
    b.variable(
        single_value(
            "sample",
            "Calibration sample",
            "label_values(ragmon_judge_calibration_pairs, sample)",
            "blind: the random sample of judged answers (the unbiased one); other queues are flagged answers",
            default="blind",
        )
    )
    est = f'{{release="all",intent="all",{APPS}}}'
    b.row("Faithfulness: the judge's estimate and the one corrected by reviewers")
    readings = (
        (
            "Faithfulness with 95% interval",
            "Share of the answers' claims that the context supports over the rolling window",
            "ragmon_faithfulness_estimate",
            "ragmon_faithfulness_corrected_estimate",
            "claims",
        ),
        (
            "Faithful answers with 95% interval",
            "Share of answers with no unsupported claim, over the same judged answers: lower than the "
            "claim-level rate whenever some answers are partly supported",
            "ragmon_faithful_answers_ratio",
            "ragmon_faithful_answers_corrected_ratio",
            "answers",
        ),
    )
    for title, what, judge_only, corrected, reading in readings:
        is_claims = reading == "claims"
        b.series(
            f"{title}: $app",
            what + ". Judge-only: the judge's Hajek estimate, its band sampling error only. Human-corrected: "
            "plus the mean reviewer-minus-judge difference on the blind review sample, its band also "
            "carrying the judge's error (shown from review.min_labels blind labels). Right axis: the "
            "judged answers without claims (in neither) and the blind labels. One panel per app"
            + (
                "; the alert compares each release's upper bound, corrected where it exists, with the "
                "dashed line (faithfulness.upper_bound_min)"
                if is_claims
                else ""
            ),
            "percentunit",
            [
                (f"max by (tenant, app) ({judge_only}{est})", "judge-only"),
                (f"max by (tenant, app) ({judge_only}_lower{est})", "judge-only lower"),
                (f"max by (tenant, app) ({judge_only}_upper{est})", "judge-only upper"),
                (f"max by (tenant, app) ({corrected}{est})", "human-corrected"),
                (f"max by (tenant, app) ({corrected}_lower{est})", "human-corrected lower"),
                (f"max by (tenant, app) ({corrected}_upper{est})", "human-corrected upper"),
                (f"max by (tenant, app) (ragmon_faithfulness_no_claims{est})", "n no claims"),
                (
                    f'max by (tenant, app) (ragmon_faithfulness_human_labels{{release="all",intent="all",'
                    f'reading="{reading}",{APPS}}})',
                    "n blind labels",
                ),
            ],
            bands=[
                Band("judge-only lower", "judge-only upper", "judge-only"),
                Band("human-corrected lower", "human-corrected upper", "human-corrected"),
            ],
            limit=floor if is_claims else None,
            repeat="app",
            runbooks=["RagmonFaithfulnessLow"] if is_claims else (),
            counts="^n ",
        )
    for by, other in (("release", "intent"), ("intent", "release")):
        sel = f'{other}="all",{by}!="all",{APPS}'
        b.series(
            f"Faithfulness by {by}",
            (
                "the alert compares each release's upper bound (human-corrected where it exists) with the "
                "dashed line (faithfulness.upper_bound_min); "
                if by == "release"
                else ""
            )
            + "dotted, right axis: judged answers without claims",
            "percentunit",
            [
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_estimate{{{sel}}})",
                    f"{{{{app}}}} {{{{{by}}}}} judge-only",
                ),
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_corrected_estimate{{{sel}}})",
                    f"{{{{app}}}} {{{{{by}}}}} human-corrected",
                ),
                (
                    f"max by (tenant, app, {by}) (ragmon_faithfulness_no_claims{{{sel}}})",
                    f"n no claims {{{{app}}}} {{{{{by}}}}}",
                ),
            ],
            limit=floor,
            runbooks=["RagmonFaithfulnessLow"] if by == "release" else (),
            data_links=[("Review queue", "${ragmon_url}/review")] if by == "release" else (),
            counts="^n ",
        )
    b.series(
        "Judged sample size",
        "scored judgments behind both readings, answers without claims (in neither), and the blind human "
        "labels behind each corrected reading",
        "short",
        [
            (f"max by (tenant, app) (ragmon_faithfulness_sample_size{est})", "{{app}} scored"),
            (f"max by (tenant, app) (ragmon_faithfulness_no_claims{est})", "{{app}} no claims"),
            (
                f"max by (tenant, app, reading) (ragmon_faithfulness_human_labels{est})",
                "{{app}} blind labels ({{reading}})",
            ),
        ],
    )
    people = f"{{{APPS}}}"
    b.series(
        "Judge and reviewers: $app",
        "Per app over the rolling window, on the blind sample's pairs: agreement and Cohen's kappa with 95% "
        "intervals, and the reference period's disagreement as 1 - it (the alert tests the window's "
        "disagreement against it); right axis: the pairs in each period",
        "percentunit",
        [
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio{people})", "agreement"),
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio_lower{people})", "agreement lower"),
            (f"max by (tenant, app) (ragmon_judge_human_agreement_ratio_upper{people})", "agreement upper"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa{people})", "kappa"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa_lower{people})", "kappa lower"),
            (f"max by (tenant, app) (ragmon_judge_human_kappa_upper{people})", "kappa upper"),
            (
                f"1 - max by (tenant, app) (ragmon_judge_human_disagreement_reference_ratio{people})",
                "reference agreement",
            ),
            (f"max by (tenant, app) (ragmon_judge_human_pairs{people})", "n pairs"),
            (f"max by (tenant, app) (ragmon_judge_human_reference_pairs{people})", "n reference pairs"),
        ],
        bands=[
            Band("agreement lower", "agreement upper", "agreement"),
            Band("kappa lower", "kappa upper", "kappa"),
        ],
        repeat="app",
        runbooks=["RagmonJudgeHumanDisagreementRose"],
        data_links=[("Review queue", "${ragmon_url}/review")],
        counts="^n ",
    )
    cal = '{judge_version="$judge_version",sample="$sample"}'
    b.row("Judge calibration (judge vs reviewers)")
    rates = (
        ("agreement", "ragmon_judge_agreement_ratio"),
        ("false approval", "ragmon_judge_false_approval_ratio"),
        ("false rejection", "ragmon_judge_false_rejection_ratio"),
    )
    b.series(
        "Agreement and error rates with 95% intervals",
        "judge version $judge_version on the $sample sample: agreement, false approvals (judge faithful,"
        " reviewer not) and false rejections; shaded: each rate's interval",
        "percentunit",
        [
            q
            for name, metric in rates
            for q in (
                (f"max ({metric}{cal})", name),
                (f"max ({metric}_lower{cal})", f"{name} lower"),
                (f"max ({metric}_upper{cal})", f"{name} upper"),
            )
        ],
        bands=[Band(f"{name} lower", f"{name} upper", name) for name, _ in rates],
        data_links=[("Review queue", "${ragmon_url}/review")],
    )
    b.series(
        "Cohen's kappa with 95% interval",
        "judge version $judge_version on the $sample sample; the pairs behind it on the right axis",
        "none",
        [
            (f"max (ragmon_judge_kappa{cal})", "kappa"),
            (f"max (ragmon_judge_kappa_lower{cal})", "kappa lower"),
            (f"max (ragmon_judge_kappa_upper{cal})", "kappa upper"),
            (f"max (ragmon_judge_calibration_pairs{cal})", "pairs"),
        ],
        bands=[Band("kappa lower", "kappa upper", "kappa")],
    )
    b.row("Verdicts and diagnoses")
    for title, metric, label in (
        ("Verdicts", "ragmon_judge_verdicts_total", "verdict"),
        ("Diagnoses", "ragmon_judge_diagnoses_total", "diagnosis"),
        ("Review flags", "ragmon_review_flags_total", "reason"),
    ):
        b.series(
            f"{title} per minute",
            "",
            "short",
            [
                (
                    f"60 * sum by (tenant, app, {label}) (rate({metric}{{{APPS}}}[$__rate_interval]))",
                    f"{{{{app}}}} {{{{{label}}}}}",
                )
            ],
            width=8,
            data_links=[("Review queue", "${ragmon_url}/review")],
        )
    b.row("Judge cost")
    b.single(
        "Judge spend, last 24h",
        "red over the daily budget (cost.judge_usd_per_day)",
        "currencyUSD",
        [("sum(job:ragmon_judge_cost_usd:increase1d)", "")],
        limit=Limit((t.cost.judge_usd_per_day,)),
        runbooks=["RagmonJudgeSpendOverBudget"],
    )
    b.single(
        "Judge calls per minute",
        "",
        "short",
        [("60 * sum(rate(ragmon_judge_requests_total[$__rate_interval]))", "")],
    )
    b.single(
        "Judge failures per call",
        "15m window; red over judge.failure_ratio",
        "percentunit",
        [("max(job:ragmon_judge_failures_per_requests:ratio_rate15m)", "")],
        limit=Limit((t.judge.failure_ratio,)),
        runbooks=["RagmonJudgeFailureRateHigh"],
    )
    b.single(
        "Judge p95 duration",
        "",
        "s",
        [
            (
                "histogram_quantile(0.95,"
                " sum by (le) (rate(ragmon_judge_duration_seconds_bucket[$__rate_interval])))",
                "",
            )
        ],
    )
    b.series(
        "Judge spend per hour",
        "",
        "currencyUSD",
        [("3600 * sum by (judge) (rate(ragmon_judge_cost_usd_total[$__rate_interval]))", "{{judge}}")],
    )
    b.series(
        "Judge tokens per second",
        "",
        "short",
        [("sum by (judge, kind) (rate(ragmon_judge_tokens_total[$__rate_interval]))", "{{judge}} {{kind}}")],
    )
    b.row("Judge queue")
    b.series(
        "Queue depth and failed items",
        "waiting or leased; failed items stay visible; dashed line: judge.backlog_min_items (the backlog"
        " alert also needs growth over judge.backlog_window)",
        "short",
        [
            ("max(ragmon_judge_queue_depth)", "depth"),
            ("max(ragmon_judge_queue_deferred)", "deferred (waiting for the budget)"),
            ("max(ragmon_judge_queue_failed)", "failed"),
        ],
        limit=Limit((float(t.judge.backlog_min_items),)),
        runbooks=["RagmonJudgeQueueBacklogGrowing"],
    )
    b.series(
        "Since the last judgment",
        "alert when the queue is not empty and this passes the dashed line (judge.stalled_after_seconds)",
        "s",
        [
            ("time() - max(ragmon_judge_last_success_timestamp_seconds)", "since last judgment"),
            ("max(ragmon_judge_queue_oldest_age_seconds)", "oldest queued item's age"),
        ],
        limit=Limit((t.judge.stalled_after_seconds,)),
        runbooks=["RagmonJudgeStalled"],
    )
    b.series(
        "Sampled, deferred and skipped per minute",
        "traces put in the queue by stratum; traces the budget had no room for when their turn came "
        "(deferred: judged as it refills, in fair shares of the tenants); traces never judged by reason "
        "(expired: deferred past budget.max_deferral_s)",
        "short",
        [
            (
                "60 * sum by (stratum) (rate(ragmon_judge_sampled_total[$__rate_interval]))",
                "sampled {{stratum}}",
            ),
            ("60 * sum(rate(ragmon_judge_deferred_total[$__rate_interval]))", "deferred"),
            (
                "60 * sum by (reason) (rate(ragmon_judge_skipped_total[$__rate_interval]))",
                "skipped {{reason}}",
            ),
        ],
    )
    b.series(
        "Judge failures per minute",
        "by reason",
        "short",
        [("60 * sum by (reason) (rate(ragmon_judge_failures_total[$__rate_interval]))", "{{reason}}")],
    )
    b.row("Human review queue")
    b.series(
        "Review items by queue and state",
        "flagged: answers the judge or feedback flagged; blind: the random sample reviewers label without"
        " the judge's verdict (an expired lease counts as open)",
        "short",
        [("max by (queue, state) (ragmon_review_items)", "{{queue}} {{state}}")],
    )
    b.series(
        "Oldest open review item",
        "how long the oldest item of each queue has waited for a reviewer; dashed line:"
        " judge.review_oldest_open_seconds",
        "s",
        [("max by (queue) (ragmon_review_oldest_open_age_seconds)", "{{queue}}")],
        limit=Limit((t.judge.review_oldest_open_seconds,)),
        runbooks=["RagmonReviewQueueStale"],
    )
    b.series(
        "Reviews per hour",
        "labels recorded, by queue and verdict",
        "short",
        [
            (
                "3600 * sum by (queue, verdict) (rate(ragmon_reviews_total[$__rate_interval]))",
                "{{queue}} {{verdict}}",
            )
        ],
    )
    return b.json()
