"""Build the banking77 query set for the drift benchmark from a snapshot of its public repository.

    python bench/drift/banking77.py GIT_DIR [--out DIR]

GIT_DIR is a git directory of github.com/PolyAI-LDN/task-specific-datasets
(a clone, or the snapshot the search tool's `fetch` brings, e.g.
/work/.mirror/PolyAI-LDN+task-specific-datasets/repo). The script copies
banking_data/{train,test}.csv, categories.json and the licence (CC BY 4.0,
Casanueva et al. 2020) out of the commit it names into DIR (default
$RAGMON_BENCH_CACHE/banking77, i.e. /tmp/ragmon-bench-cache/banking77) and
writes SOURCE with the commit. Nothing goes into this repository.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from queries import bench_cache

FILES = {
    "banking_data/train.csv": "train.csv",
    "banking_data/test.csv": "test.csv",
    "banking_data/categories.json": "categories.json",
    "LICENSE": "LICENSE",
}


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args(argv)
    out = args.out or bench_cache() / "banking77"
    out.mkdir(parents=True, exist_ok=True)
    commit = git(args.git_dir, "rev-parse", args.commit).decode().strip()
    for source, target in FILES.items():
        (out / target).write_bytes(git(args.git_dir, "show", f"{commit}:{source}"))
    (out / "SOURCE").write_text(f"github.com/PolyAI-LDN/task-specific-datasets@{commit}\n")
    print(f"banking77 from {commit[:12]} written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
