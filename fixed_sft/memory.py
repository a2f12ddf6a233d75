"""How the build's processes allocate memory: Arrow's pool, and the C allocator's mapping and free pages.

All act on the whole process: ``system_allocator`` switches Arrow's pool for the time
of a block; ``map_large_allocations`` sets the C allocator for the rest of the process;
``give_back_free`` returns its free pages to the system once, ``give_back_between``
after each step of a task where ``give_back_often`` says so.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

_allocator_lock = threading.Lock()
_allocator_users = 0
_allocator_previous: pa.MemoryPool | None = None


@contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow allocates from the C library's allocator inside the block, and from the
    previous default pool after it. A build decodes, copies and frees buffers of many MB
    at a high rate. With pyarrow's default pool (mimalloc) freed memory goes back to the
    OS and is faulted in again, zeroed, when it is reused; the C allocator reuses it.
    Measured on a 6,400-row 2-worker build on 2 cores: 0.6-0.8 s less CPU in the main
    process, about 1 s less system time in all."""
    global _allocator_users, _allocator_previous
    with _allocator_lock:  # builds may overlap in threads: the first switches, the last switches back
        if _allocator_users == 0:
            _allocator_previous = pa.default_memory_pool()
            pa.set_memory_pool(pa.system_memory_pool())
        _allocator_users += 1
    try:
        yield
    finally:
        with _allocator_lock:
            _allocator_users -= 1
            if _allocator_users == 0:
                pa.set_memory_pool(_allocator_previous)


MMAP_THRESHOLD_BYTES = 4 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_allocations() -> None:
    """From now on, the C allocator maps every allocation of ``MMAP_THRESHOLD_BYTES`` or
    more, and unmaps it when freed. By default glibc raises that threshold, up to 32 MB,
    as such blocks are freed, and then serves them from its heaps, where what a large
    conversation's texts, ids and rendering freed stays, fragmented, under the next one's.
    Set for the rest of the process (glibc's dynamic threshold is then off): in every
    worker, and in a build's process when its source's rows are large (a 2-worker build of
    4 MiB conversations peaked at 546 MiB in the build's process without it and 355 MiB
    with it) or it reads more than one band, where the decode batches of a band read (up
    to 4 MiB, freed as they go) otherwise stay in the heaps under the band's rows and the
    band held before it (benchmarks/README.md). Each such block is then faulted in anew:
    a build of one band keeps the default. Nothing where the C library is not glibc."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "gnu_get_libc_version"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


_often = False


def give_back_often(often: bool) -> None:
    """Whether ``give_back_between`` gives free memory back, for the rest of the process:
    in each worker of a build of ``engine.MANY_WORKERS`` or more. A worker's steps (a batch of
    its fill task, a part it writes) free 10-25 MB that the C allocator keeps in its heap,
    fragmented, and many workers hold it at once: 16 workers on 2 cores, 80,000
    conversations, tree PSS 1,056-1,092 -> 925-993 MiB, at 1-3% more CPU (each step's
    pages faulted in again). With few workers that CPU is not worth the memory."""
    global _often
    _often = often


def give_back_between() -> None:
    """``give_back_free`` where ``give_back_often`` said so."""
    if _often:
        give_back_free()


def give_back_free() -> None:
    """The C allocator gives the free pages inside its heaps back to the system (glibc's
    ``malloc_trim``). A fill task leaves tens of MB free in its worker's heap, fragmented
    by what is still held (the BPE's cache), which would otherwise stay its own: given back
    at its end (4 workers on 2 cores, 31-43 MB of heap after the fill, 10-11 MB given
    back). Nothing where the C library is not glibc."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
