"""Build the offline judge's labelled dev set from public sources of four kinds (QA, summarization,
dialogue, long-form), split into a tuning half and a test half by source group.

Sources (none of them FaithBench, BEGIN or LFQA-Verification, which are kept for acceptance):

* `halueval_qa` (QA): `../shared/data/faithfulness/halueval_qa_dev.jsonl` (HaluEval, MIT), 600 rows
  (300 questions, each with its gold answer, faithful by construction, and a generated hallucination);
* `qags` (summarization): W4ngatang/qags `data/mturk_{cnndm,xsum}.jsonl`, 474 model summaries,
  faithful when every sentence has a majority "yes" of its 3 annotators;
* `summedits` (summarization): salesforce/factualNLG `data/summedits/*.json`, 480 rows (60 from each
  of 8 domains, half consistent where the domain has them), label 1 = annotated consistent;
* `q2_dialogue` (dialogue): orhonovich/q-squared `third_party/data/*.csv` (Wizard of Wikipedia
  turns), 600 responses, faithful = the `*_consistent` files;
* `wice` (long-form): ryokamoi/wice `data/entailment_retrieval/claim/{dev,test}.jsonl`, 707
  Wikipedia sentences against the web page they cite, faithful = `supported` (partially or not
  supported: unfaithful).

Each row: `{id, source, kind, group, split, question, contexts, answer, label_faithful}`. `group`
keeps what belongs together on one side of the split (a question's two answers, a document's
summaries, a dialogue turn's two responses, a claim); `split` is `tune` or `test` by a hash of
the group, so the same input always gives the same split. Long sources (WiCE's cited web pages)
are cut into chunks of 8 sentences, as a retriever would return them.

Read from snapshots fetched as git directories (`--mirror DIR`: DIR/<owner>+<name>/repo, read
with `git show`) or from plain checkouts (`--source DIR`: DIR/<name>/<path>). The dev set is
written outside the repository (default `~/.cache/ragmon/judge_devset/devset.jsonl`) and never
committed.

    python bench/judge/build_devset.py [--mirror /work/.mirror | --source DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragmon" / "judge_devset"
Row = dict[str, Any]
Reader = Callable[[str, str], bytes]  # (owner/name, path) -> file content


def split_of(source: str, group: str) -> str:
    """`tune` or `test`, half and half by a hash of the group: stable across runs and machines."""
    digest = hashlib.sha256(f"{source}/{group}".encode()).digest()
    return "tune" if digest[0] % 2 == 0 else "test"


def row(
    source: str,
    kind: str,
    group: str,
    rid: str,
    question: str,
    contexts: list[str],
    answer: str,
    faithful: bool,
) -> Row:
    return {
        "id": f"{source}-{rid}",
        "source": source,
        "kind": kind,
        "group": group,
        "split": split_of(source, group),
        "question": question,
        "contexts": contexts,
        "answer": answer,
        "label_faithful": faithful,
    }


def halueval_qa(shared: Path, questions: int = 300, seed: int = 24) -> Iterator[Row]:
    path = shared / "faithfulness" / "halueval_qa_dev.jsonl"
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    by_question: dict[str, list[Row]] = {}
    for r in rows:
        qid = r["id"].split("-")[3]  # halueval-qa-dev-<n>-<kind>
        by_question.setdefault(qid, []).append(r)
    chosen = sorted(random.Random(seed).sample(sorted(by_question), questions), key=int)
    for qid in chosen:
        for r in by_question[qid]:
            yield row(
                "halueval_qa",
                "qa",
                qid,
                r["id"].removeprefix("halueval-qa-dev-"),
                r["question"],
                r["contexts"],
                r["answer"],
                bool(r["label_faithful"]),
            )


def qags(read: Reader) -> Iterator[Row]:
    for part in ("cnndm", "xsum"):
        text = read("W4ngatang/qags", f"data/mturk_{part}.jsonl").decode("utf-8")
        for i, line in enumerate(x for x in text.splitlines() if x.strip()):
            item = json.loads(line)
            sentences = item["summary_sentences"]
            faithful = all(
                sum(r["response"] == "yes" for r in s["responses"]) * 2 > len(s["responses"])
                for s in sentences
            )
            summary = " ".join(s["sentence"].strip() for s in sentences)
            yield row(
                "qags",
                "summarization",
                f"{part}-{i}",
                f"{part}-{i}",
                "Summarize the article.",
                [item["article"]],
                summary,
                faithful,
            )


SUMMEDITS_DOMAINS = ("news", "podcast", "samsum", "sales_call", "sales_email", "qmsumm", "ectsum", "scitldr")


def summedits(read: Reader, per_domain: int = 60, seed: int = 24) -> Iterator[Row]:
    rng = random.Random(seed)
    for domain in SUMMEDITS_DOMAINS:
        items = json.loads(read("salesforce/factualNLG", f"data/summedits/summedits_{domain}.json"))
        rng.shuffle(items)
        # as many consistent as inconsistent rows where the domain has them: the source is 2:1 unfaithful
        half = per_domain // 2
        picked = [x for x in items if int(x["label"]) == 1][:half]
        picked += [x for x in items if int(x["label"]) == 0][: per_domain - len(picked)]
        for x in picked:
            doc = hashlib.sha256(x["doc"].encode()).hexdigest()[:12]
            yield row(
                "summedits",
                "summarization",
                f"{domain}-{doc}",
                x["id"],
                "Summarize the document.",
                [x["doc"]],
                x["summary"],
                int(x["label"]) == 1,
            )


def q2_dialogue(read: Reader) -> Iterator[Row]:
    for system in ("dodeca", "memnet"):
        for kind, faithful in (("consistent", True), ("inconsistent", False)):
            text = read("orhonovich/q-squared", f"third_party/data/{system}_{kind}.csv").decode("utf-8")
            for r in csv.DictReader(io.StringIO(text)):
                turn = f"{r['episode_idx']}-{r['round']}"
                yield row(
                    "q2_dialogue",
                    "dialogue",
                    turn,
                    f"{system}-{turn}",
                    r["message"] or r["topic"],
                    [r["knowledge"]],
                    r["response"],
                    faithful,
                )


def _chunks(sentences: list[str], size: int = 8) -> list[str]:
    return [" ".join(sentences[i : i + size]) for i in range(0, len(sentences), size)]


def wice(read: Reader) -> Iterator[Row]:
    for part in ("dev", "test"):
        text = read("ryokamoi/wice", f"data/entailment_retrieval/claim/{part}.jsonl").decode("utf-8")
        for line in text.splitlines():
            if not line.strip():
                continue
            x = json.loads(line)
            meta = x["meta"] if isinstance(x["meta"], dict) else ast.literal_eval(x["meta"])
            evidence = x["evidence"] if isinstance(x["evidence"], list) else ast.literal_eval(x["evidence"])
            question = f"{meta['claim_title']}: {meta['claim_section']}".strip(" :")
            yield row(
                "wice",
                "long_form",
                meta["id"],
                meta["id"],
                question,
                _chunks([str(s) for s in evidence]),
                x["claim"],
                x["label"] == "supported",
            )


def git_reader(mirror: Path) -> Reader:
    def read(repo: str, path: str) -> bytes:
        git_dir = mirror / repo.replace("/", "+") / "repo"
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"HEAD:{path}"], check=True, capture_output=True
        ).stdout

    return read


def dir_reader(source: Path) -> Reader:
    def read(repo: str, path: str) -> bytes:
        return (source / repo.split("/")[1] / path).read_bytes()

    return read


def build(read: Reader, shared: Path) -> list[Row]:
    rows = [*halueval_qa(shared), *qags(read), *summedits(read), *q2_dialogue(read), *wice(read)]
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate row ids")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--mirror", type=Path, default=Path("/work/.mirror"), help="dir of fetched git snapshots"
    )
    where.add_argument("--source", type=Path, help="dir of plain checkouts, one per repository name")
    env = os.environ.get("RAGMON_SHARED_DATA")
    parser.add_argument(
        "--shared", type=Path, default=Path(env) if env else REPO_ROOT / ".." / "shared" / "data"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "devset.jsonl")
    args = parser.parse_args()
    read = dir_reader(args.source) if args.source else git_reader(args.mirror)
    rows = build(read, args.shared)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for r in rows:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
    counts: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        c = counts.setdefault((r["source"], r["split"]), [0, 0])
        c[0] += 1
        c[1] += r["label_faithful"]
    print(f"{len(rows)} rows -> {args.out}")
    for (source, split), (n, faithful) in sorted(counts.items()):
        print(f"  {source:<12} {split:<5} {n:>4} rows, {faithful:>4} faithful")
    return 0


if __name__ == "__main__":
    sys.exit(main())
