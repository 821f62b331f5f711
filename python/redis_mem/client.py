"""Typed clients for the redis-mem module: :class:`RedisMemClient` on a
``redis.Redis`` and :class:`AsyncRedisMemClient` on a ``redis.asyncio.Redis``.

Every MEM.* command of the module has a method (the same name, signature and
reply type on both). Replies are dataclasses whatever the connection looks
like: RESP2 or RESP3, ``decode_responses`` on or off.

    import redis
    from redis_mem import RedisMemClient

    mem = RedisMemClient(redis.Redis(decode_responses=True))
    r = mem.append("mem:{alice}", "user", "Hello!", meta={"lang": "en"})
    if r.summarize:
        ...  # time to summarize (or let redis-mem-summarizer do it)
    for m in mem.get("mem:{alice}", budget=4000):
        print(m.role, m.content)

Every append carries a MSGID (the caller's, or a fresh one), so a command
that redis-py resends after a timeout (``retry_on_timeout``) or that the
application sends again is stored once: the reply says ``duplicate``.
Module errors surface as ``redis.ResponseError``.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Union

import redis
import redis.asyncio

from . import _commands as c
from ._replies import (
    SUMMARY_ROLE,
    AppendResult,
    JsonObject,
    Message,
    ModelInfo,
    SessionInfo,
    SummarizeBegin,
    SummarizeCheck,
)

__all__ = [
    "AppendResult",
    "AsyncRedisMemClient",
    "Message",
    "ModelInfo",
    "SummarizeCheck",
    "SummarizeBegin",
    "SessionInfo",
    "RedisMemClient",
    "SUMMARY_ROLE",
]

Meta = Union[None, str, bytes, Mapping[str, Any]]
Doc = Union[str, bytes, Mapping[str, Any]]


class RedisMemClient:
    """Thin wrapper over a ``redis.Redis`` connection (any protocol, decoded
    or not). ``auto_msgid``: give every append without a ``msgid`` a fresh
    one, so the same command sent twice (a retry) is stored once."""

    def __init__(self, client: "redis.Redis", auto_msgid: bool = True):
        self.redis = client
        self.auto_msgid = auto_msgid

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "RedisMemClient":
        """A client on a new connection to ``url`` (``redis://...``)."""
        return cls(redis.Redis.from_url(url, **kwargs))

    def _run(self, cmd: "c.Command[c.T]") -> "c.T":
        args, parse = cmd
        return parse(self.redis.execute_command(*args))

    def _msgid(self, msgid: Optional[str]) -> Optional[str]:
        return c.new_msgid() if msgid is None and self.auto_msgid else msgid

    # -- writes ------------------------------------------------------------

    def append(
        self,
        key: c.Key,
        role: str,
        content: str,
        ts: Optional[int] = None,
        meta: Meta = None,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
        msgid: Optional[str] = None,
        tokens: Optional[int] = None,
    ) -> AppendResult:
        """MEM.APPEND. ``ts`` in Unix ms; ``meta`` a dict (sent as JSON) or a
        JSON object text; ``maxage`` in seconds (a session setting, 0 = none);
        ``msgid`` (1-128 bytes) the message's own id, so a retry is recognised
        (one is made up when None and ``auto_msgid``; the result's ``msgid``
        says which); ``tokens`` the message's tokens as the provider reported
        them (``TOKENS n``), instead of the module counting them."""
        return self._run(c.append(key, role, content, ts, meta, model, ttl, maxtokens, maxmsgs, maxage,
                                  self._msgid(msgid), tokens))

    def append_batch(
        self,
        key: c.Key,
        messages: Iterable[Mapping[str, Any]],
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
    ) -> List[AppendResult]:
        """MEM.APPENDBATCH: several messages (dicts with ``role``, ``content``
        and optional ``ts``, ``meta``, ``msgid``, ``tokens``: the provider's
        count, as :meth:`append`'s) appended in one atomic
        command, as consecutive MEM.APPENDs; one result per message (a
        message whose msgid the session already has: ``duplicate``)."""
        items = c.batch_items(messages, self.auto_msgid)
        return self._run(c.append_batch(key, items, model, ttl, maxtokens, maxmsgs, maxage))

    def summarize(self, key: c.Key, upto: int, text: str, lease: Optional[int] = None) -> AppendResult:
        """MEM.SUMMARIZE: replace the summary and every message with
        ``id <= upto`` by ``text``. ``lease``: the token MEM.SUMMARIZE_BEGIN
        granted (a summary without it is refused, ``LEASED``, while another
        worker's lease is live)."""
        return self._run(c.summarize(key, upto, text, lease))

    def summarize_begin(
        self, key: c.Key, lease_ms: int, model: Optional[str] = None, context: Optional[int] = None,
        keep: Optional[int] = None,
    ) -> SummarizeBegin:
        """MEM.SUMMARIZE_BEGIN: the check, and a lease of ``lease_ms`` when
        the session is due and no other worker holds it (``lease`` > 0)."""
        return self._run(c.summarize_begin(key, lease_ms, model, context, keep))

    def extset(self, key: c.Key, system: str, conversation_id: str, ex: Optional[int] = None) -> bool:
        """MEM.EXTSET (an orchestrator's conversation id); True on OK."""
        return self._run(c.extset(key, system, conversation_id, ex))

    def attrset(self, key: c.Key, name: str, value: Any, raw: bool = False, ex: Optional[int] = None) -> bool:
        """MEM.ATTRSET: store ``value`` (any JSON-serializable value; with
        ``raw=True`` a JSON text sent as is) as the session's ``name`` member
        (``user_profile``, ``context``, ...), returned at the top level of
        :meth:`get_json`. Creates the session, refreshes its TTL. ``ex``
        (seconds, SPEC v3): the attribute's own lifetime, after which reads
        no longer return it; without it the attribute has none (a later set
        without ``ex`` clears it, as Redis SET does)."""
        return self._run(c.attrset(key, name, value, raw, ex))

    def attrdel(self, key: c.Key, name: str) -> bool:
        """MEM.ATTRDEL: True when the member was set."""
        return self._run(c.attrdel(key, name))

    def import_json(
        self, key: c.Key, doc: Doc, replace: bool = False, model: Optional[str] = None, ttl: Optional[int] = None,
    ) -> AppendResult:
        """MEM.IMPORT from a dict or a JSON text (``{"conversation_history":
        [...], ...}``)."""
        return self._run(c.import_json(key, doc, replace, model, ttl))

    def delete(self, key: c.Key) -> int:
        """DEL: removes the session; 1 when it existed."""
        return int(self.redis.delete(key))

    # -- reads -------------------------------------------------------------

    def get(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> List[Message]:
        """MEM.GET: the summary (role "summary", if any) then messages, oldest
        first. Empty list for a missing key."""
        entries = self._run(c.get(key, last, after, budget))
        if Message.summary_ambiguous(entries):
            info = self._run(c.info(key))
            entries = Message.resolve_summary(entries, info.summary_upto if info else 0)
        return entries

    def get_json(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> JsonObject:
        """MEM.GET ... FORMAT JSON, parsed: ``{"conversation_history": [...],
        "summary": {...}|None, "total_tokens": n, "model": ..., <attributes>}``.
        Python floats: a META's ``1.0000000000000001`` reads ``1.0``;
        :meth:`get_json_text` gives the document exactly."""
        return self._run(c.get_json(key, last, after, budget))

    def get_json_text(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> str:
        """MEM.GET ... FORMAT JSON as the server wrote it: what
        :meth:`import_json` takes back whole, every number as written."""
        return self._run(c.get_json_text(key, last, after, budget))

    def summarize_check(
        self, key: c.Key, model: Optional[str] = None, context: Optional[int] = None, keep: Optional[int] = None,
    ) -> SummarizeCheck:
        """MEM.SUMMARIZE_CHECK (``model`` or ``context``, not both)."""
        return self._run(c.summarize_check(key, model, context, keep))

    def attrget(self, key: c.Key, name: Optional[str] = None, raw: bool = False) -> Any:
        """MEM.ATTRGET. With ``name``: the member's value parsed (its JSON text
        with ``raw=True``), None when absent. Without: a dict of every member."""
        return self._run(c.attrget(key, name, raw))

    def extget(self, key: c.Key, system: str) -> Optional[str]:
        """MEM.EXTGET: the stored id, or None when unknown or expired."""
        return self._run(c.extget(key, system))

    def info(self, key: c.Key) -> Optional[SessionInfo]:
        """MEM.INFO, or None for a missing key."""
        return self._run(c.info(key))

    def count(self, model: str, text: str, role: Optional[str] = None, meta: Meta = None) -> int:
        """MEM.COUNT: the tokens of ``text`` under ``model``'s encoding, as the
        module counts them (a prompt, a tool schema, a candidate summary);
        with ``role``, those of a message as MEM.APPEND counts it (3 + role
        + text); with ``meta``, plus the tool calls its ``tool_calls`` carry."""
        return self._run(c.count(model, text, role, meta))

    def models(self, model: str) -> ModelInfo:
        """MEM.MODELS model: the encoding ``model`` counts with, whether that
        is exact (the vendor's tokenizer), and its context window."""
        return self._run(c.models(model))


class AsyncRedisMemClient:
    """:class:`RedisMemClient` for asyncio, over a ``redis.asyncio.Redis``:
    the same methods, coroutines."""

    def __init__(self, client: "redis.asyncio.Redis", auto_msgid: bool = True):
        self.redis = client
        self.auto_msgid = auto_msgid

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "AsyncRedisMemClient":
        """A client on a new connection to ``url`` (``redis://...``)."""
        return cls(redis.asyncio.Redis.from_url(url, **kwargs))

    async def _run(self, cmd: "c.Command[c.T]") -> "c.T":
        args, parse = cmd
        return parse(await self.redis.execute_command(*args))

    def _msgid(self, msgid: Optional[str]) -> Optional[str]:
        return c.new_msgid() if msgid is None and self.auto_msgid else msgid

    async def append(
        self, key: c.Key, role: str, content: str, ts: Optional[int] = None, meta: Meta = None,
        model: Optional[str] = None, ttl: Optional[int] = None, maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None, maxage: Optional[int] = None, msgid: Optional[str] = None,
        tokens: Optional[int] = None,
    ) -> AppendResult:
        """MEM.APPEND (see :meth:`RedisMemClient.append`)."""
        return await self._run(c.append(key, role, content, ts, meta, model, ttl, maxtokens, maxmsgs, maxage,
                                        self._msgid(msgid), tokens))

    async def append_batch(
        self, key: c.Key, messages: Iterable[Mapping[str, Any]], model: Optional[str] = None,
        ttl: Optional[int] = None, maxtokens: Optional[int] = None, maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
    ) -> List[AppendResult]:
        """MEM.APPENDBATCH (see :meth:`RedisMemClient.append_batch`)."""
        items = c.batch_items(messages, self.auto_msgid)
        return await self._run(c.append_batch(key, items, model, ttl, maxtokens, maxmsgs, maxage))

    async def summarize(self, key: c.Key, upto: int, text: str, lease: Optional[int] = None) -> AppendResult:
        """MEM.SUMMARIZE: replace the summary and every message with
        ``id <= upto`` by ``text``. ``lease``: the token MEM.SUMMARIZE_BEGIN
        granted (a summary without it is refused, ``LEASED``, while another
        worker's lease is live)."""
        return await self._run(c.summarize(key, upto, text, lease))

    async def summarize_begin(
        self, key: c.Key, lease_ms: int, model: Optional[str] = None, context: Optional[int] = None,
        keep: Optional[int] = None,
    ) -> SummarizeBegin:
        """MEM.SUMMARIZE_BEGIN: the check, and a lease of ``lease_ms`` when
        the session is due and no other worker holds it (``lease`` > 0)."""
        return await self._run(c.summarize_begin(key, lease_ms, model, context, keep))

    async def extset(self, key: c.Key, system: str, conversation_id: str, ex: Optional[int] = None) -> bool:
        """MEM.EXTSET (an orchestrator's conversation id); True on OK."""
        return await self._run(c.extset(key, system, conversation_id, ex))

    async def attrset(self, key: c.Key, name: str, value: Any, raw: bool = False, ex: Optional[int] = None) -> bool:
        """MEM.ATTRSET: store ``value`` (any JSON-serializable value; with
        ``raw=True`` a JSON text sent as is) as the session's ``name`` member
        (``user_profile``, ``context``, ...), returned at the top level of
        :meth:`get_json`. Creates the session, refreshes its TTL. ``ex``
        (seconds, SPEC v3): the attribute's own lifetime, after which reads
        no longer return it; without it the attribute has none (a later set
        without ``ex`` clears it, as Redis SET does)."""
        return await self._run(c.attrset(key, name, value, raw, ex))

    async def attrdel(self, key: c.Key, name: str) -> bool:
        """MEM.ATTRDEL: True when the member was set."""
        return await self._run(c.attrdel(key, name))

    async def import_json(
        self, key: c.Key, doc: Doc, replace: bool = False, model: Optional[str] = None, ttl: Optional[int] = None,
    ) -> AppendResult:
        """MEM.IMPORT from a dict or a JSON text (``{"conversation_history":
        [...], ...}``)."""
        return await self._run(c.import_json(key, doc, replace, model, ttl))

    async def delete(self, key: c.Key) -> int:
        """DEL: removes the session; 1 when it existed."""
        return int(await self.redis.delete(key))

    async def get(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> List[Message]:
        """MEM.GET: the summary (role "summary", if any) then messages, oldest
        first. Empty list for a missing key."""
        entries = await self._run(c.get(key, last, after, budget))
        if Message.summary_ambiguous(entries):
            info = await self._run(c.info(key))
            entries = Message.resolve_summary(entries, info.summary_upto if info else 0)
        return entries

    async def get_json(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> JsonObject:
        """MEM.GET ... FORMAT JSON, parsed: ``{"conversation_history": [...],
        "summary": {...}|None, "total_tokens": n, "model": ..., <attributes>}``.
        Python floats: a META's ``1.0000000000000001`` reads ``1.0``;
        :meth:`get_json_text` gives the document exactly."""
        return await self._run(c.get_json(key, last, after, budget))

    async def get_json_text(
        self, key: c.Key, last: Optional[int] = None, after: Optional[int] = None, budget: Optional[int] = None,
    ) -> str:
        """MEM.GET ... FORMAT JSON as the server wrote it: what
        :meth:`import_json` takes back whole, every number as written."""
        return await self._run(c.get_json_text(key, last, after, budget))

    async def summarize_check(
        self, key: c.Key, model: Optional[str] = None, context: Optional[int] = None, keep: Optional[int] = None,
    ) -> SummarizeCheck:
        """MEM.SUMMARIZE_CHECK (``model`` or ``context``, not both)."""
        return await self._run(c.summarize_check(key, model, context, keep))

    async def attrget(self, key: c.Key, name: Optional[str] = None, raw: bool = False) -> Any:
        """MEM.ATTRGET. With ``name``: the member's value parsed (its JSON text
        with ``raw=True``), None when absent. Without: a dict of every member."""
        return await self._run(c.attrget(key, name, raw))

    async def extget(self, key: c.Key, system: str) -> Optional[str]:
        """MEM.EXTGET: the stored id, or None when unknown or expired."""
        return await self._run(c.extget(key, system))

    async def info(self, key: c.Key) -> Optional[SessionInfo]:
        """MEM.INFO, or None for a missing key."""
        return await self._run(c.info(key))

    async def count(self, model: str, text: str, role: Optional[str] = None,
                    meta: Meta = None) -> int:
        """MEM.COUNT (see :meth:`RedisMemClient.count`)."""
        return await self._run(c.count(model, text, role, meta))

    async def models(self, model: str) -> ModelInfo:
        """MEM.MODELS model (see :meth:`RedisMemClient.models`)."""
        return await self._run(c.models(model))
