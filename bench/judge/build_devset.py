"""Build the offline judge's labelled data from public sources: the dev set (five sources of four kinds,
split into a tuning half and a test half by source group) and the leave-one-source-out set (nine
sources of five kinds: QA, summarization, dialogue, long-form, RAG answers).

The dev set's sources (`devset.jsonl`):

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

The leave-one-source-out set (`sources.jsonl`, read by `loso.py`) holds those five and four more,
each source cut to at most `SOURCE_ROWS` (500) rows by drawing whole groups with a fixed seed:

* `faithbench` (summarization): vectara/FaithBench `FaithBench.csv`, 800 LLM summaries of 80
  passages; faithful when the worst annotation is Consistent or Benign, unfaithful when it is
  Unwanted; the 77 Questionable ones are left out;
* `begin` (dialogue): google/BEGIN-dataset `wow/begin_{dev,test}_wow.tsv`,
  `cmu-dog/begin_dev_cmu.tsv`, `topicalchat/begin_dev_tc.tsv` (the other test files are over the
  snapshot's 4 MiB limit), a third of the rows from each corpus; faithful = "Fully attributable",
  "Generic" replies left out;
* `lfqa_verification` (long-form): timchen0618/LFQA-Verification, the 400 annotated answers written
  with documents (`gpt3_wdoc`, `alpaca_wdoc`, `gpt3_whudoc`, `webgpt`) against those documents
  (`docs-webgpt.json`, `docs-human.json` for `whudoc`); faithful when a majority of the 3 annotators
  calls every sentence supported;
* `expertqa` (RAG answers): chaitanyamalaviya/ExpertQA `data/lfqa/{rand,domain}_{val,test}.jsonl`,
  the claims of the two retrieve-and-read systems (`rr_gs_gpt4`, `rr_sphere_gpt4`) against the
  retrieved evidence they cite; faithful = support "Complete", unfaithful = "Partial" or
  "Incomplete"; claims without evidence ("Missing", "N/A") left out.

RAGTruth (ParticleMedia/RAGTruth) would be a second RAG source, but its two data files are over the
snapshot's size limit, so it is not read.

Each row: `{id, source, kind, group, split, question, contexts, answer, label_faithful}`. `group`
keeps what belongs together on one side of the split (a question's two answers, a document's
summaries, a dialogue turn's two responses, a claim); `split` is `tune` or `test` by a hash of
the group, so the same input always gives the same split. Long sources (WiCE's cited web pages)
are cut into chunks of 8 sentences, as a retriever would return them.

Read from snapshots fetched as git directories (`--mirror DIR`: DIR/<owner>+<name>/repo, read
with `git show`) or from plain checkouts (`--source DIR`: DIR/<name>/<path>). The dev set is
written outside the repository (default `~/.cache/ragmon/judge_devset/devset.jsonl`) and never
committed.

    python bench/judge/build_devset.py [--mirror /work/.mirror | --source DIR] [--out PATH] \\
        [--sources-out PATH]
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
import re
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


def faithbench(read: Reader) -> Iterator[Row]:
    text = read("vectara/FaithBench", "FaithBench.csv").decode("utf-8")
    for i, r in enumerate(csv.DictReader(io.StringIO(text))):
        worst = r["worst-label"]
        if worst == "Questionable":
            continue  # neither reading is the annotators'
        passage = " ".join(r["source"].split())
        yield row(
            "faithbench",
            "summarization",
            hashlib.sha256(passage.encode()).hexdigest()[:12],
            str(i),
            "Summarize the passage.",
            [r["source"]],
            r["summary"].strip(),
            worst in ("Consistent", "Benign"),
        )


BEGIN_FILES = (
    ("wow", "wow/begin_dev_wow.tsv"),
    ("wow", "wow/begin_test_wow.tsv"),
    ("cmu", "cmu-dog/begin_dev_cmu.tsv"),
    ("tc", "topicalchat/begin_dev_tc.tsv"),
)


def begin(read: Reader, rows_per_corpus: int = 167, seed: int = 24) -> Iterator[Row]:
    csv.field_size_limit(1 << 24)
    by_corpus: dict[str, list[Row]] = {}
    for corpus, path in BEGIN_FILES:
        text = read("google/BEGIN-dataset", path).decode("utf-8")
        for i, r in enumerate(csv.DictReader(io.StringIO(text), delimiter="\t")):
            if r["begin_label"] not in ("Fully attributable", "Not fully attributable"):
                continue  # "Generic": a reply that says nothing to attribute
            turn = hashlib.sha256(f"{r['knowledge']}\n{r['message']}".encode()).hexdigest()[:12]
            by_corpus.setdefault(corpus, []).append(
                row(
                    "begin",
                    "dialogue",
                    turn,
                    f"{path.rsplit('/', 1)[1].removesuffix('.tsv')}-{i}",
                    r["message"],
                    [r["knowledge"]],
                    r["response"],
                    r["begin_label"] == "Fully attributable",
                )
            )
    for corpus in sorted(by_corpus):
        yield from cap(by_corpus[corpus], rows_per_corpus, seed)


LFQA_SYSTEMS = (
    ("gpt3_wdoc", "webgpt"),
    ("alpaca_wdoc", "webgpt"),
    ("gpt3_whudoc", "human"),
    ("webgpt", "webgpt"),
)


def lfqa_verification(read: Reader) -> Iterator[Row]:
    docs = {
        name: {
            int(q["question_id"]): [f"{d['title']}: {d['text']}" for d in q["docs"]]
            for q in json.loads(read("timchen0618/LFQA-Verification", f"data/docs/docs-{name}.json"))
        }
        for name in ("webgpt", "human")
    }
    for system, doc_set in LFQA_SYSTEMS:
        path = f"data/annotations/annotations-{system}.json"
        for x in json.loads(read("timchen0618/LFQA-Verification", path)):
            qid = int(x["question_id"])
            labels = [a["labels"] for a in x["annotations"]]
            if len(labels) != len(x["answers"]) or qid not in docs[doc_set]:
                continue
            faithful = all(sum(v == "supported" for v in votes) * 2 > len(votes) for votes in labels)
            yield row(
                "lfqa_verification",
                "long_form",
                str(qid),
                f"{system}-{qid}",
                x["question"],
                docs[doc_set][qid],
                " ".join(s.strip() for s in x["answers"]),
                faithful,
            )


EXPERTQA_FILES = ("rand_val", "rand_test", "domain_val", "domain_test")
_EVIDENCE_HEAD = re.compile(r"^\s*\[\d+\]\s*\S*\s*")


def expertqa(read: Reader) -> Iterator[Row]:
    seen: set[tuple[str, str, str]] = set()
    for part in EXPERTQA_FILES:
        text = read("chaitanyamalaviya/ExpertQA", f"data/lfqa/{part}.jsonl").decode("utf-8")
        for line in text.splitlines():
            if not line.strip():
                continue
            x = json.loads(line)
            question = x["question"]
            qid = hashlib.sha256(question.encode()).hexdigest()[:12]
            for system in ("rr_gs_gpt4", "rr_sphere_gpt4"):
                answer = x["answers"].get(system)
                if not answer:
                    continue
                for k, claim in enumerate(answer.get("claims") or []):
                    support = claim.get("support")
                    evidence = [_EVIDENCE_HEAD.sub("", e).strip() for e in claim.get("evidence") or []]
                    evidence = [e for e in evidence if e]
                    key = (qid, system, claim["claim_string"])
                    if support not in ("Complete", "Partial", "Incomplete") or not evidence or key in seen:
                        continue  # the same question is in two files when two experts answered it
                    seen.add(key)
                    yield row(
                        "expertqa",
                        "rag",
                        qid,
                        f"{part}-{qid}-{system}-{k}",
                        question,
                        evidence,
                        claim["claim_string"].strip(),
                        support == "Complete",
                    )


SOURCE_ROWS = 500


def cap(rows: list[Row], limit: int = SOURCE_ROWS, seed: int = 24) -> list[Row]:
    """At most about `limit` rows, whole groups drawn in a seeded order (a group is never cut)."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(str(r["group"]), []).append(r)
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    kept: list[Row] = []
    for g in order:
        if len(kept) >= limit:
            break
        kept.extend(groups[g])
    return sorted(kept, key=lambda r: str(r["id"]))


def build_sources(read: Reader, shared: Path) -> list[Row]:
    """The leave-one-source-out set: nine sources, each cut to `SOURCE_ROWS` by `cap`."""
    readers: list[Callable[[], Iterator[Row]]] = [
        lambda: halueval_qa(shared),
        lambda: qags(read),
        lambda: summedits(read),
        lambda: faithbench(read),
        lambda: q2_dialogue(read),
        lambda: begin(read),
        lambda: wice(read),
        lambda: lfqa_verification(read),
        lambda: expertqa(read),
    ]
    rows = [r for make in readers for r in cap(list(make()))]
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate row ids")
    return rows


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
    parser.add_argument("--sources-out", type=Path, default=DEFAULT_OUT / "sources.jsonl")
    args = parser.parse_args()
    read = dir_reader(args.source) if args.source else git_reader(args.mirror)
    write(build(read, args.shared), args.out, by_split=True)
    write(build_sources(read, args.shared), args.sources_out, by_split=False)
    return 0


def write(rows: list[Row], out: Path, by_split: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    counts: dict[tuple[str, str, str], list[int]] = {}
    for r in rows:
        c = counts.setdefault((r["source"], r["kind"], r["split"] if by_split else ""), [0, 0, 0])
        c[0] += 1
        c[1] += r["label_faithful"]
    groups: dict[tuple[str, str, str], set[str]] = {}
    for r in rows:
        groups.setdefault((r["source"], r["kind"], r["split"] if by_split else ""), set()).add(
            str(r["group"])
        )
    print(f"{len(rows)} rows -> {out}")
    for key, (n, faithful, _) in sorted(counts.items()):
        source, kind, split = key
        print(
            f"  {source:<17} {kind:<13} {split:<5} {n:>4} rows, {faithful:>4} faithful, "
            f"{len(groups[key]):>4} groups"
        )


if __name__ == "__main__":
    sys.exit(main())
