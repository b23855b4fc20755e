"""
Which event loop, if any, runs in this thread, and how another thread
reaches it.

The library's sync forms block the thread they run in (a retry's backoff
sleep, a bulkhead's queue, a lock's wait). On a thread that runs an event
loop that stalls every task of the loop, and can deadlock it (the task
that would release the slot never runs), so those waits ask
`refuse_blocking` first and raise a clear error naming the async form.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from resilient._core import _internals


if TYPE_CHECKING:
    from collections.abc import Callable


def current_async_library() -> str | None:
    """The async library running in this thread, or None in sync code."""
    try:
        import sniffio  # noqa: PLC0415
    except ImportError:  # pragma: no cover - anyio brings sniffio
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return "asyncio"
    if (
        sniffio.thread_local.name is None
        and sniffio.current_async_library_cvar.get() is None
        and _internals.get_running_loop() is None
        and "curio" not in sys.modules
    ):
        # Sync code, the common case: what sniffio would find, without the
        # exceptions it raises and catches on the way (a hold of a lock
        # or a timeout scope asks on every entry).
        return None
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def loop_caller(library: str) -> Callable[[Callable[[], object]], None]:
    """
    How another thread asks the event loop running in this thread to call
    something soon (call it from the loop's own thread).
    """
    if library == "trio":
        import trio  # noqa: PLC0415

        return trio.lowlevel.current_trio_token().run_sync_soon
    loop = asyncio.get_running_loop()

    def call(fn: Callable[[], object]) -> None:
        if asyncio._get_running_loop() is loop:  # noqa: SLF001
            # From the loop itself (a release of another task): no need
            # to write to the loop's wake-up pipe.
            loop.call_soon(fn)
        else:
            loop.call_soon_threadsafe(fn)

    return call


def thread_caller() -> Callable[[Callable[[], object]], None]:
    """
    From a task: `loop_caller` of its event loop, through the libraries'
    public calls (``call_soon_threadsafe``, trio's token). Where the loop
    is gone the call raises `RuntimeError` (trio's ``RunFinishedError``
    is one). anyio's ``current_token().backend_class.run_sync_soon``,
    used here before, is a token anyio calls opaque (and anyio 4.11+).

    Raises:
        RuntimeError: No event loop runs in this thread.
    """
    library = current_async_library()
    if library is None:
        raise RuntimeError("resilient: no event loop runs in this thread")
    return loop_caller(library)


def refuse_blocking(what: str, instead: str) -> None:
    """
    Raise if this thread runs an event loop: *what* (``"a sync retry of
    'payments'"``) would block it; *instead* names the async form to use.

    Raises:
        RuntimeError: An event loop runs in this thread.
    """
    library = current_async_library()
    if library is not None:
        raise RuntimeError(
            f"resilient: {what} would block the {library} event loop that "
            f"runs in this thread; use {instead} (or run the sync code in "
            "a worker thread, e.g. anyio.to_thread.run_sync)"
        )
