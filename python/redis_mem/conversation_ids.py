"""Orchestrator conversation ids (Dify, n8n, Flowise, ...) kept with the
redis-mem session they belong to (MEM.EXTSET / MEM.EXTGET).

An orchestrator such as Dify answers the first message of a conversation with
its own ``conversation_id`` and wants it back on every later message; n8n's
chat trigger carries a ``sessionId``. An adapter keeps that id beside the
session, with its own expiry, and never has to manage a second key:

    ids = ConversationIds(redis.Redis(), "dify")
    cid = ids.get("alice")                     # None on the first message
    reply = dify.chat_messages(query, conversation_id=cid or "")
    ids.remember("alice", reply["conversation_id"])

The key of a session is ``key_template % session_id`` (default
``mem:{<session_id>}``, the key the middleware and the clients use), so the
id lives and expires with the session (the session's expiry is never set
earlier than the id's).
"""

from __future__ import annotations

import inspect
from typing import Awaitable, Callable, Optional, Union

import redis
import redis.asyncio

from .client import AsyncRedisMemClient, RedisMemClient

__all__ = ["ConversationIds", "AsyncConversationIds", "DEFAULT_KEY_TEMPLATE"]

DEFAULT_KEY_TEMPLATE = "mem:{%s}"


class ConversationIds:
    """Conversation ids of one orchestrator (``system``, e.g. ``"dify"`` or
    ``"n8n"``). ``ex``: their expiry in seconds (None: ``mem.ext-ttl``,
    default 24 h); every :meth:`remember` renews it."""

    def __init__(
        self,
        client: Union["redis.Redis", RedisMemClient, None] = None,
        system: str = "",
        key_template: str = DEFAULT_KEY_TEMPLATE,
        ex: Optional[int] = None,
        *,
        redis_client: Optional["redis.Redis"] = None,
        redis_url: Optional[str] = None,
    ) -> None:
        if not system:
            raise ValueError("system must be a non-empty name such as 'dify'")
        client = client if client is not None else redis_client
        if client is None:
            if redis_url is None:
                raise ValueError("give client=redis.Redis(...), redis_client=... or redis_url=...")
            client = redis.Redis.from_url(redis_url)
        self.mem = client if isinstance(client, RedisMemClient) else RedisMemClient(client)
        self.system = system
        self.key_template = key_template
        self.ex = ex

    def key(self, session_id: str) -> str:
        """The session key of ``session_id``."""
        return self.key_template % session_id

    def get(self, session_id: str) -> Optional[str]:
        """The stored id, or None (never stored, or expired)."""
        return self.mem.extget(self.key(session_id), self.system)

    def remember(self, session_id: str, conversation_id: str) -> None:
        """Stores the id the orchestrator answered with (or renews its expiry)."""
        if not conversation_id:
            raise ValueError("an empty conversation id is not stored")
        self.mem.extset(self.key(session_id), self.system, conversation_id, ex=self.ex)

    def get_or_create(self, session_id: str, create: Callable[[], str]) -> str:
        """The stored id, or a new one from ``create()`` (stored). For
        orchestrators that take an id chosen by the caller (n8n's
        ``sessionId``). Two callers racing on a new session may both create
        one: the last one stored wins, as with the orchestrator's own ids."""
        cid = self.get(session_id)
        if cid is None:
            cid = create()
            self.remember(session_id, cid)
        return cid


class AsyncConversationIds:
    """:class:`ConversationIds` for asyncio (``redis.asyncio``)."""

    def __init__(
        self,
        client: Union["redis.asyncio.Redis", AsyncRedisMemClient, None] = None,
        system: str = "",
        key_template: str = DEFAULT_KEY_TEMPLATE,
        ex: Optional[int] = None,
        *,
        redis_client: Optional["redis.asyncio.Redis"] = None,
        redis_url: Optional[str] = None,
    ) -> None:
        if not system:
            raise ValueError("system must be a non-empty name such as 'dify'")
        client = client if client is not None else redis_client
        if client is None:
            if redis_url is None:
                raise ValueError("give client=redis.asyncio.Redis(...), redis_client=... or redis_url=...")
            client = redis.asyncio.Redis.from_url(redis_url)
        self.mem = client if isinstance(client, AsyncRedisMemClient) else AsyncRedisMemClient(client)
        self.system = system
        self.key_template = key_template
        self.ex = ex

    def key(self, session_id: str) -> str:
        """The session key of ``session_id``."""
        return self.key_template % session_id

    async def get(self, session_id: str) -> Optional[str]:
        """The stored id, or None (never stored, or expired)."""
        return await self.mem.extget(self.key(session_id), self.system)

    async def remember(self, session_id: str, conversation_id: str) -> None:
        """Stores the id the orchestrator answered with (or renews its expiry)."""
        if not conversation_id:
            raise ValueError("an empty conversation id is not stored")
        await self.mem.extset(self.key(session_id), self.system, conversation_id, ex=self.ex)

    async def get_or_create(self, session_id: str,
                            create: Callable[[], Union[str, Awaitable[str]]]) -> str:
        """The stored id, or a new one from ``create()`` (stored): a plain
        function or a coroutine function (``async def``), e.g. one that asks
        the orchestrator for a new conversation."""
        cid = await self.get(session_id)
        if cid is None:
            made = create()
            cid = await made if inspect.isawaitable(made) else made
            if not isinstance(cid, str):
                raise TypeError(f"create() must give a str conversation id, not {type(cid).__name__}")
            await self.remember(session_id, cid)
        return cid
