"""service.runtime: the interpreter settings of a long-running ragmon process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from service.runtime import trim_memory

# Run in a child so the test process's own heap does not matter. 2 KB blocks come from glibc's heap
# (not pymalloc, not mmap); keeping every 50th alive pins the heap, so freeing the rest leaves the
# pages resident until something hands them back.
_CHILD = textwrap.dedent(
    """
    import gc, resource, sys
    from service.runtime import trim_memory

    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() // 1024

    blocks = [bytes(2048) + bytes([i % 251]) for i in range(150_000)]
    kept = blocks[::50]
    del blocks
    gc.collect()
    before = rss_kib()
    assert trim_memory()
    after = rss_kib()
    print(before, after, len(kept))
    """
)


def test_trim_memory_hands_freed_heap_pages_back_to_the_os() -> None:
    if not trim_memory():
        pytest.skip("malloc_trim is glibc's; this C library has none")
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True)
    before, after, kept = (int(x) for x in out.stdout.split())
    assert kept == 3000
    # ~300 MB were freed while pinned by the survivors; trimming returns most of it.
    assert before - after > 100_000, (before, after)
