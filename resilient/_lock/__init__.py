"""
Distributed locks: leases with renewal, fencing tokens and loss detection.

`_config` holds the frozen configuration, `_machine` the pure lease machine,
`_renewer` the one renewer per process and backend (its schedule in
`_renewals`, its drivers in `_renew_thread` and `_renew_task`), `_lease`
the lease a held lock gives (its span in `_spans`, who holds it in
`_holders`, the release of one dropped unreleased in `_dropped`),
`_attempt` the steps of an acquisition both shells share, `_sync` and
`_async` the two shells, `_hold` what keeps an interrupted ``with`` from
leaking a lease, and `_lock` the public `Lock` (``with``, ``async with``,
decorator) and the `lock` factory. The stores are in
`resilient._backends`.
"""

from __future__ import annotations

from resilient._lock._config import LockConfig
from resilient._lock._lease import Lease
from resilient._lock._lock import Lock, lock


__all__ = ["Lease", "Lock", "LockConfig", "lock"]
