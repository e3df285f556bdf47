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
    assert _tune_malloc_in_a_fresh_process(MALLOC_TRIM_THRESHOLD_="1048576") == "False"


# glibc's mallinfo2: the 4th of its ten size_t fields (hblks) counts blocks served by mmap
MMAPPED_BLOCKS = """
import ctypes, sys
from service.runtime import tune_malloc
tuned = tune_malloc()
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblks
blocks = [bytearray(size) for size in (300_000, 1_000_000, 3_000_000, 6_000_000)]
print(tuned, libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_request_sized_blocks_come_from_the_heap_not_fresh_mappings() -> None:
    """A request body, its pickle to a decoder and the answer are 0.3-3 MB: served from the heap
    (pages already mapped), not each from an mmap of its own whose pages fault in (session 36:
    ~300 us for 375 KB against ~12 us); only a block over 4 MiB gets its own mapping."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", MMAPPED_BLOCKS],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["True", "1"]  # the 6 MB block alone
    untuned = subprocess.run(
        [sys.executable, "-c", MMAPPED_BLOCKS],
        env={**clean, "MALLOC_MMAP_THRESHOLD_": "262144"},  # the threshold before session 36
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert untuned.stdout.split() == ["False", "4"]
