"""Interpreter and allocator settings of a serving process (service/runtime.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = "from service.runtime import tune_malloc; print(tune_malloc())"


def _tune_malloc_in_a_fresh_process(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_malloc_settings_apply_on_glibc_unless_the_environment_chose() -> None:
    assert _tune_malloc_in_a_fresh_process() == "True"
    # a user's own allocator settings win: glibc has read them already, and ours would overwrite them
    assert _tune_malloc_in_a_fresh_process(MALLOC_ARENA_MAX="4") == "False"
    assert _tune_malloc_in_a_fresh_process(MALLOC_MMAP_THRESHOLD_="1048576") == "False"
