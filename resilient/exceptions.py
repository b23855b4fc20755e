"""
The exceptions resilient raises.

resilient never wraps the exception of a call it gave up on: it re-raises that
exception itself, with a note.
The exceptions here are for what resilient itself decides: bad configuration,
a deadline that passed, a breaker that is open or a bulkhead that is full.

Every exception here pickles, copies and deep-copies with its message and its
attributes, so it crosses a `concurrent.futures.ProcessPoolExecutor` or a
`multiprocessing` pool intact: `ResilientError` (and `ScopeCancelled`)
rebuild an exception from its ``args`` and its ``__dict__`` without calling
``__init__`` again, so a subclass gets this for free whatever its signature.
An attribute that holds something local to the process (a live
`resilient.TimeoutScope`) is listed in ``_process_local``: it becomes None in
a pickle and is shared, not copied, by `copy.deepcopy`.
A new exception must pickle: ``tests/test_exceptions.py`` checks every class
in ``__all__``.

The classes are written in ``resilient._errors``, one module per family;
this module is their public home: ``__module__`` says
``resilient.exceptions``, so pickles, reprs and the docs name them here.
"""

from __future__ import annotations

from resilient._errors._base import ResilientError, _rebuild
from resilient._errors._config import ConfigError, ConfigTypeError
from resilient._errors._locks import (
    LockBackendError,
    LockLost,
    LockNotAcquired,
)
from resilient._errors._rejections import BulkheadFull, CircuitOpen, Rejected
from resilient._errors._retry import GaveUpOnResult
from resilient._errors._timeouts import (
    DeadlineExceeded,
    ScopeCancelled,
    TimedOut,
)


__all__ = [
    "BulkheadFull",
    "CircuitOpen",
    "ConfigError",
    "ConfigTypeError",
    "DeadlineExceeded",
    "GaveUpOnResult",
    "LockBackendError",
    "LockLost",
    "LockNotAcquired",
    "Rejected",
    "ResilientError",
    "ScopeCancelled",
    "TimedOut",
]

# Public paths: what pickles refer to (classes, and the function that
# rebuilds an exception: ``resilient.exceptions._rebuild`` in pickles made
# before the split, too), what reprs and the docs show.
for _obj in (*(globals()[_name] for _name in __all__), _rebuild):
    _obj.__module__ = __name__
del _obj
