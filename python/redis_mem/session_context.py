"""The seed's ``session:context:{session_id}`` layer: context shared by the
nodes of an agent graph (the channel, the task in progress, what a router
decided), kept **in the session** as an attribute with a lifetime of its own
(``MEM.ATTRSET ... EX``, SPEC v3): one hour by default, as the seed's key had,
while the history lives its 24 h.

    ctx = SessionContext(redis.Redis(), "mem:{alice}")        # ttl=3600, name="context"
    ctx.set({"channel": "web", "step": "search"})
    ctx.update({"step": "book"})        # -> {"channel": "web", "step": "book"}
    ctx.get()                           # None once its hour is over (or never set)
    ctx.delete()

``AsyncSessionContext`` is the same over ``redis.asyncio``. Every write renews
the lifetime (``ttl=None``: the context has none of its own and lives with the
session). The value is any JSON value; :meth:`~SessionContext.update` merges a
dict into a dict context (missing or expired: the patch alone) under WATCH, so
two nodes updating at once lose neither's change (it gives up with
``redis.WatchError`` after 100 attempts that each found the session
changed). On a cluster client (``RedisCluster``) it is a plain read then
write.

The module checks a JSON value of 256 KB or more off the main thread, which
a MULTI/EXEC cannot wait for, so there is no atomic update of a context that
large (and no Lua-free alternative): :meth:`~SessionContext.update` raises
``ValueError`` naming :meth:`~SessionContext.set` when the merged value would
be 256 KB or more, before writing anything (the context is left as it was).
``set()`` stores a value of any size (up to the module's limits), unguarded.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

import redis
import redis.asyncio

from . import _commands as c
from .client import AsyncRedisMemClient, RedisMemClient

__all__ = ["SessionContext", "AsyncSessionContext", "DEFAULT_CONTEXT_TTL", "DEFAULT_CONTEXT_NAME"]

#: The seed's lifetime of its session context: one hour.
DEFAULT_CONTEXT_TTL = 3600
DEFAULT_CONTEXT_NAME = "context"
#: Updates tried before giving up when every one found the session changed.
_MAX_ATTEMPTS = 100
#: From this many bytes of JSON the module checks an ATTRSET value off the
#: main thread, which MULTI/EXEC cannot wait for (MAX_INLINE_JSON_BYTES).
MAX_UPDATE_JSON_BYTES = 256 << 10

# -- the core both drivers share: commands and the merge ----------------------


def _check(key: c.Key, ttl: Optional[int], name: str) -> None:
    if not key:
        raise ValueError("session_key must be a non-empty key such as 'mem:{alice}'")
    if not name:
        raise ValueError("name must be a non-empty attribute name")
    if ttl is not None and ttl < 1:
        raise ValueError("ttl must be at least 1 second (None: no lifetime of its own)")


def _merged(current: Any, patch: Mapping[str, Any]) -> Dict[str, Any]:
    """``patch`` over the current value: a dict context is updated (top-level
    members replaced, None removes one), anything else (missing, expired, not
    a dict) is replaced by the patch."""
    out: Dict[str, Any] = dict(current) if isinstance(current, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _set_args(key: c.Key, name: str, value: Any, ttl: Optional[int]) -> List[Any]:
    args = c.attrset(key, name, value, False, ttl)[0]
    size = len(str(args[3]).encode("utf-8"))
    if size >= MAX_UPDATE_JSON_BYTES:
        raise ValueError(
            f"the updated context of {key!r} would be {size} bytes of JSON (256 KB or more): the module "
            "checks such a value off the main thread, which update()'s WATCH/MULTI cannot wait for; "
            "nothing was written: store it with set() (not atomic against concurrent updates)")
    return args


def _parse_get(reply: Any) -> Any:
    return c.attrget("", "x", False)[1](reply)


def _expires(doc: Mapping[str, Any], name: str) -> Optional[int]:
    """The attribute's expiry in a FORMAT JSON document (``redis_mem.attribute_expires``)."""
    if name not in doc:  # not set, or past its lifetime
        return None
    at = (doc.get("redis_mem") or {}).get("attribute_expires", {}).get(name)
    return None if at is None else int(at)


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


class SessionContext:
    """The context of one session (``session_key``, e.g. ``mem:{alice}``),
    the session attribute ``name`` with a lifetime of ``ttl`` seconds."""

    def __init__(
        self,
        client: Union["redis.Redis", RedisMemClient],
        session_key: c.Key,
        ttl: Optional[int] = DEFAULT_CONTEXT_TTL,
        name: str = DEFAULT_CONTEXT_NAME,
    ) -> None:
        _check(session_key, ttl, name)
        self.mem = client if isinstance(client, RedisMemClient) else RedisMemClient(client)
        self.key = session_key
        self.ttl = ttl
        self.name = name

    def get(self) -> Any:
        """The context (parsed JSON), or None: never set, deleted or expired."""
        return self.mem.attrget(self.key, self.name)

    def set(self, value: Any) -> None:
        """Stores ``value`` (any JSON value) for ``ttl`` seconds from now."""
        self.mem.attrset(self.key, self.name, value, ex=self.ttl)

    def update(self, patch: Mapping[str, Any]) -> Dict[str, Any]:
        """Merges ``patch`` into the context (see the module doc), renews its
        lifetime, and returns the new context. ``ValueError`` (nothing
        written) when the new context would be 256 KB of JSON or more: a
        WATCH/MULTI write of that size is refused by the module; use
        :meth:`set` for it."""
        r = self.mem.redis
        if _is_cluster(r):
            new = _merged(self.get(), patch)
            self.mem.redis.execute_command(*_set_args(self.key, self.name, new, self.ttl))
            return new
        with r.pipeline(transaction=True) as pipe:
            for _attempt in range(_MAX_ATTEMPTS):
                try:
                    pipe.watch(self.key)
                    new = _merged(_parse_get(pipe.execute_command("MEM.ATTRGET", self.key, self.name)), patch)
                    pipe.multi()
                    pipe.execute_command(*_set_args(self.key, self.name, new, self.ttl))
                    pipe.execute()
                    return new
                except redis.WatchError:
                    continue  # the session changed meanwhile: read it again
        raise redis.WatchError(f"{self.key!r} changed during each of {_MAX_ATTEMPTS} updates of its context")

    def delete(self) -> bool:
        """Removes the context; True when it was set."""
        return self.mem.attrdel(self.key, self.name)

    def expires_at(self) -> Optional[int]:
        """When the context's lifetime ends (Unix ms, the server's clock), or
        None: not set, or no lifetime of its own (it lives with the session)."""
        return _expires(self.mem.get_json(self.key, last=0), self.name)


class AsyncSessionContext:
    """:class:`SessionContext` for asyncio (``redis.asyncio``)."""

    def __init__(
        self,
        client: Union["redis.asyncio.Redis", AsyncRedisMemClient],
        session_key: c.Key,
        ttl: Optional[int] = DEFAULT_CONTEXT_TTL,
        name: str = DEFAULT_CONTEXT_NAME,
    ) -> None:
        _check(session_key, ttl, name)
        self.mem = client if isinstance(client, AsyncRedisMemClient) else AsyncRedisMemClient(client)
        self.key = session_key
        self.ttl = ttl
        self.name = name

    async def get(self) -> Any:
        """The context (parsed JSON), or None: never set, deleted or expired."""
        return await self.mem.attrget(self.key, self.name)

    async def set(self, value: Any) -> None:
        """Stores ``value`` (any JSON value) for ``ttl`` seconds from now."""
        await self.mem.attrset(self.key, self.name, value, ex=self.ttl)

    async def update(self, patch: Mapping[str, Any]) -> Dict[str, Any]:
        """Merges ``patch`` into the context, renews its lifetime, and returns
        the new context (see :meth:`SessionContext.update`)."""
        r = self.mem.redis
        if _is_cluster(r):
            new = _merged(await self.get(), patch)
            await self.mem.redis.execute_command(*_set_args(self.key, self.name, new, self.ttl))
            return new
        async with r.pipeline(transaction=True) as pipe:
            for _attempt in range(_MAX_ATTEMPTS):
                try:
                    await pipe.watch(self.key)
                    cur = await pipe.execute_command("MEM.ATTRGET", self.key, self.name)
                    new = _merged(_parse_get(cur), patch)
                    pipe.multi()
                    pipe.execute_command(*_set_args(self.key, self.name, new, self.ttl))
                    await pipe.execute()
                    return new
                except redis.WatchError:
                    continue
        raise redis.WatchError(f"{self.key!r} changed during each of {_MAX_ATTEMPTS} updates of its context")

    async def delete(self) -> bool:
        """Removes the context; True when it was set."""
        return await self.mem.attrdel(self.key, self.name)

    async def expires_at(self) -> Optional[int]:
        """When the context's lifetime ends (Unix ms, the server's clock), or
        None (see :meth:`SessionContext.expires_at`)."""
        return _expires(await self.mem.get_json(self.key, last=0), self.name)
