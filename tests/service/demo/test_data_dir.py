"""service/demo/data_dir.py: each demo starts from an empty data directory, says what became of the
last one, and never touches data that is not a demo's."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import RagmonConfig, load_config
from service.demo.data_dir import MARK, NotDemoData, fresh_data_dir


def _config(data: Path, **overrides: object) -> RagmonConfig:
    return load_config(environ={}, overrides={"data_dir": str(data), **overrides})


def test_a_new_directory_is_made_and_marked(tmp_path: Path) -> None:
    data = tmp_path / "ragmon-data"
    line = fresh_data_dir(_config(data))
    assert line == f"this demo starts afresh in {data}"
    assert sorted(p.name for p in data.iterdir()) == [MARK]


def test_an_earlier_demo_is_moved_aside_and_an_older_one_replaced(tmp_path: Path) -> None:
    data = tmp_path / "ragmon-data"
    fresh_data_dir(_config(data))
    (data / "ragmon.db").write_text("first run")
    line = fresh_data_dir(_config(data))
    previous = tmp_path / "ragmon-data.previous"
    assert line == f"the earlier demo's data was moved to {previous}; this demo starts afresh in {data}"
    assert (previous / "ragmon.db").read_text() == "first run"
    assert sorted(p.name for p in data.iterdir()) == [MARK]
    (data / "ragmon.db").write_text("second run")
    fresh_data_dir(_config(data))
    assert (previous / "ragmon.db").read_text() == "second run"  # one previous run is kept


def test_data_that_is_not_a_demos_is_refused_and_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "production"
    data.mkdir()
    (data / "ragmon.db").write_text("real traces")
    with pytest.raises(NotDemoData, match=r"not a demo's .*--data-dir"):
        fresh_data_dir(_config(data))
    assert (data / "ragmon.db").read_text() == "real traces" and not (data / MARK).exists()
    # nor is a `.previous` that some other run left there
    demo = tmp_path / "demo"
    fresh_data_dir(_config(demo))
    (tmp_path / "demo.previous").mkdir()
    (tmp_path / "demo.previous" / "keep.txt").write_text("mine")
    with pytest.raises(NotDemoData, match=r"demo\.previous holds data"):
        fresh_data_dir(_config(demo))
    assert (tmp_path / "demo.previous" / "keep.txt").read_text() == "mine"


def test_a_configured_store_is_named_masked_and_left_as_it_is(tmp_path: Path) -> None:
    url = "postgresql+psycopg://ragmon:pw-secret@db:5432/ragmon"
    line = fresh_data_dir(_config(tmp_path / "d", store={"url": url}))
    assert "pw-secret" not in line and "earlier data stays and is counted" in line
