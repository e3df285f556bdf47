"""`ragmon eval retrieval`: score a TREC run offline and print the metrics as JSON.

    ragmon eval retrieval (--qrels FILE | --golden FILE) --run FILE
                          [--k 5,10] [--relevance-level 1] [--tenant T] [--complete]

Judgments come from TREC qrels or from a golden-set JSONL (which adds
expected behaviour, category and tenant eligibility); the run is a TREC run
file ranked as trec_eval ranks it. The JSON on stdout holds the denominators
and the members of every slice, the means overall and per category, the
filter false-exclusion counts, and every scored query — the same numbers a
CI gate reads. Exit status: 0 when scored, 2 for bad arguments or input
(stderr names the file and each bad line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from service.errors import InvalidInput

__all__ = ["add_arguments", "main"]

_PROG = "ragmon eval retrieval"
EXIT_BAD_INPUT = 2


def _cutoffs(text: str) -> tuple[int, ...]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cutoffs must be positive integers like 5,10, got {text!r}"
        ) from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"cutoffs must be positive integers like 5,10, got {text!r}")
    return tuple(sorted(set(ks)))


def _level(text: str) -> int:
    try:
        level = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"relevance level must be an integer >= 1, got {text!r}") from None
    if level < 1:
        raise argparse.ArgumentTypeError(f"relevance level must be an integer >= 1, got {text!r}")
    return level


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `ragmon eval` subcommands (now `retrieval`) to the `eval` parser.

    Option values land on `args` under `qrels_file`, `golden_file` and
    `run_file`, leaving `args.run` free for the caller's dispatch.
    """
    commands = parser.add_subparsers(dest="eval_command", required=True, metavar="COMMAND")
    retrieval = commands.add_parser(
        "retrieval",
        help="score a TREC run against qrels or a golden set; print JSON",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    judgments = retrieval.add_mutually_exclusive_group(required=True)
    judgments.add_argument(
        "--qrels", dest="qrels_file", type=Path, metavar="FILE", help="TREC qrels: QID ITER DOCNO REL"
    )
    judgments.add_argument(
        "--golden",
        dest="golden_file",
        type=Path,
        metavar="FILE",
        help="golden-set JSONL (see service/probes/golden.py) instead of qrels",
    )
    retrieval.add_argument(
        "--run",
        dest="run_file",
        type=Path,
        required=True,
        metavar="FILE",
        help="TREC run: QID Q0 DOCNO RANK SCORE TAG",
    )
    retrieval.add_argument(
        "--k", type=_cutoffs, default=(5, 10), metavar="K[,K...]", help="cutoffs (default 5,10)"
    )
    retrieval.add_argument(
        "--relevance-level",
        type=_level,
        default=1,
        metavar="N",
        help="grade at or above which an id is relevant, as trec_eval -l (default 1)",
    )
    retrieval.add_argument(
        "--tenant",
        default=None,
        help="with --golden: score only gold this tenant may see (default: all gold)",
    )
    retrieval.add_argument(
        "--complete",
        action="store_true",
        help="score questions missing from the run as empty rankings (trec_eval -c) instead of a slice",
    )


def main(args: argparse.Namespace) -> int:
    """Runs the parsed `eval` subcommand: prints the JSON report and returns the exit status."""
    if args.eval_command != "retrieval":
        print(f"ragmon eval: error: unknown command {args.eval_command!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.tenant is not None and args.golden_file is None:
        print(f"{_PROG}: error: --tenant needs --golden (qrels carry no tenant eligibility)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        report = _report(args)
    except (InvalidInput, OSError, ValueError) as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _report(args: argparse.Namespace) -> dict[str, object]:
    # the scorers load here, not when `ragmon --help` builds the flags
    from service.probes.golden import load_golden
    from service.probes.retrieval_metrics import evaluate, targets_from_golden, targets_from_qrels
    from service.probes.trec import read_qrels, read_run

    run = read_run(args.run_file)
    header: dict[str, object] = {"run": str(args.run_file)}
    if args.golden_file is not None:
        golden = load_golden(args.golden_file)
        targets = targets_from_golden(golden, args.tenant)
        header |= {"golden": str(args.golden_file), "golden_version": golden.version, "tenant": args.tenant}
    else:
        targets = targets_from_qrels(read_qrels(args.qrels_file))
        header |= {"qrels": str(args.qrels_file)}
    evaluation = evaluate(
        run, targets, ks=args.k, relevance_level=args.relevance_level, complete=args.complete
    )
    return header | evaluation.to_dict()
