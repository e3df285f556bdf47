"""The embedded demo's data directory: every `ragmon demo` starts from an empty one, and says so.

A second demo on the data of the first mixed the two runs' totals, and pinned nothing: the first
run's drift alarm covered the hours the second run's traffic fell into, and an alarming window never
feeds a reference. So the demo marks the directory it fills (`MARK`), and the next demo moves that
directory aside to `<dir>.previous` (replacing an older previous run's) before it starts afresh. A
directory holding data that is not a demo's is never touched: the demo refuses it and names
`--data-dir`. A store configured elsewhere (`store.url`) is left as it is, and the demo says that
earlier data there is counted with this run's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from service.config import RagmonConfig, masked_url

__all__ = ["MARK", "NotDemoData", "fresh_data_dir"]

MARK = ".ragmon-demo"
"""The file the demo leaves in the data directory it fills."""


class NotDemoData(Exception):
    """The data directory holds data that is not a demo's; the message says what to do."""


def _holds_data(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def fresh_data_dir(config: RagmonConfig) -> str:
    """Make `config.data_dir` an empty directory for this demo run (see the module docstring) and
    return the line that tells the user what happened to earlier data.

    Raises NotDemoData when the directory (or `<dir>.previous`) holds data no demo left there."""
    data = Path(config.data_dir)
    if config.store.url is not None:
        return (
            f"demo data in {data}; traces go to the configured store ({masked_url(config.store.url)}), where "
            "earlier data stays and is counted with this run's"
        )
    previous = data.with_name(data.name + ".previous")
    moved = ""
    if _holds_data(data):
        if not (data / MARK).exists():
            raise NotDemoData(
                f"{data} holds data that is not a demo's ({MARK} is not in it); the demo starts from an "
                "empty data directory: give it another one (--data-dir DIR), or move that one away"
            )
        if previous.exists():
            if _holds_data(previous) and not (previous / MARK).exists():
                raise NotDemoData(
                    f"{previous} holds data that is not a demo's; move it away, or give the demo another "
                    "--data-dir"
                )
            shutil.rmtree(previous)
        data.rename(previous)
        moved = f"the earlier demo's data was moved to {previous}; "
    data.mkdir(parents=True, exist_ok=True)
    (data / MARK).write_text(
        "Data of `ragmon demo`. The next demo moves this directory to <name>.previous and starts afresh.\n",
        encoding="utf-8",
    )
    return f"{moved}this demo starts afresh in {data}"
