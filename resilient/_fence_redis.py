"""
The resource side of fencing, for data kept in Redis: a write that the
server applies only when its fencing token is above every token that wrote
before it.

The fenced value lives in a hash with two fields, ``value`` and ``fence``
(the token of the write that stored it); the check and the write are one
Lua script, so no stale holder can slip in between. Tokens are compared as
decimal strings, by length then digit by digit, so any size of integer
compares exactly (Lua's numbers are doubles, exact only below 2**53).

Works with any redis-py client, sync (`fenced_redis_set`) or asyncio
(`afenced_redis_set`); the script is loaded once per client (``EVALSHA``, and
again after ``SCRIPT FLUSH``).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Final


if TYPE_CHECKING:
    from redis import Redis
    from redis.asyncio import Redis as AsyncRedis


__all__ = ["FENCED_SET", "afenced_redis_set", "fenced_redis_set"]

#: KEYS[1] the fenced hash; ARGV[1] the token (decimal), ARGV[2] the value.
#: -> 1 written, 0 refused (a write with an equal or higher token came first).
FENCED_SET: Final = """\
local seen = redis.call('HGET', KEYS[1], 'fence')
local token = ARGV[1]
if seen and (#seen > #token or (#seen == #token and seen >= token)) then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', token, 'value', ARGV[2])
return 1
"""


def _token(token: object) -> str:
    if not isinstance(token, int) or isinstance(token, bool) or token < 0:
        raise TypeError(
            f"a fencing token is a non-negative int, not {token!r}"
        )
    return str(operator.index(token))


def fenced_redis_set(
    client: Redis, key: str, value: bytes | str, token: int
) -> bool:
    """
    Store *value* at the hash *key* (field ``value``) if *token* is above
    the token of every write before; return whether it was written.

    Use the lease's ``token``: a holder that lost its lease while paused
    has a lower token than its successor, so its late write is refused::

        with resilient.lock("report", backend=REDIS) as lease:
            if not resilient.fenced_redis_set(
                client, "report", data, lease.token
            ):
                raise RuntimeError("a newer holder wrote first")

    Raises:
        TypeError: *token* is not a non-negative int.

    .. versionadded:: 26.11.0
    """
    script: Any = client.register_script(FENCED_SET)
    return bool(script(keys=[key], args=[_token(token), value]) == 1)


async def afenced_redis_set(
    client: AsyncRedis, key: str, value: bytes | str, token: int
) -> bool:
    """`fenced_redis_set` for redis-py's asyncio client.

    .. versionadded:: 26.11.0
    """
    script: Any = client.register_script(FENCED_SET)
    return bool(await script(keys=[key], args=[_token(token), value]) == 1)
