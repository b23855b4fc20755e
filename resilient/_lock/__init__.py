"""
Distributed locks: leases with renewal, fencing tokens and loss detection.

`_config` holds the frozen configuration, `_machine` the pure lease machine,
`_renewer` the one renewer per process and backend, `_lock` the sync and
async shells. The stores are in `resilient._backends`.
"""

from __future__ import annotations

from resilient._lock._config import LockConfig
from resilient._lock._lock import Lease, Lock, lock


__all__ = ["Lease", "Lock", "LockConfig", "lock"]
