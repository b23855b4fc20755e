"""
What the scope's modules share: the lock over the state other threads
touch, the timings of the main-thread interrupt, and the real clock its
signal timers run on.

Not the context variables a scope sets (`_clock._DEADLINE` and
`_clock._SCOPE`): each module names them itself. CPython 3.11 compiles a
method call on a name bound by an import (``_SCOPE.get()``) as if the name
were a module, an attribute load and a call, which costs more than the
method call it makes on a name bound by an assignment.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from resilient._core import _clock


# Guards the children sets, wakers and cancel flags, which other threads
# touch.
_LOCK: Final = threading.Lock()

# A timer that is due "now" is armed for this long: zero would disarm it.
_SOON: Final = 1e-6

# How soon the interrupt comes back when it cannot raise now: our own
# bookkeeping runs (_AGAIN), or the code it stopped is still unwinding, or
# in case what it raised was swallowed (_RETRY).
_AGAIN: Final = 1e-4
_RETRY: Final = 1e-3

# The longest single real wait or timer: the OS refuses much longer ones
# (``setitimer`` past about 1e9 s on some platforms). A longer wait is
# cut into pieces of this size; a longer timer fires early and re-arms.
LONGEST_WAIT: Final = 1e6

# "Not read yet", for the values a partial entry puts back.
_UNSET: Final[Any] = object()


def _now() -> float:
    """Real monotonic time: signal timers run on it whatever the clock."""
    return _clock.DEFAULT_CLOCK.now()
