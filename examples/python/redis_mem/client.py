"""A small typed client for the redis-mem module, on top of redis-py.

Every MEM.* command of the module has a method here. Replies are turned into
dataclasses whatever the connection looks like: RESP2 (maps arrive as flat
field/value arrays) or RESP3 (real maps), with ``decode_responses`` on or off.

    import redis
    from redis_mem import RedisMemClient

    mem = RedisMemClient(redis.Redis(decode_responses=True))
    r = mem.append("mem:{alice}", "user", "Hello!", meta={"lang": "en"})
    if r.summarize:
        ...  # time to summarize (see summarizer_worker.py)

Every append carries a MSGID (the caller's, or a fresh one), so a command
that redis-py resends after a timeout (``retry_on_timeout``) or that the
application sends again is stored once: the reply says ``duplicate``.
    for m in mem.get("mem:{alice}", budget=4000):
        print(m.role, m.content)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import redis

__all__ = [
    "AppendResult",
    "Message",
    "SummarizeCheck",
    "SummarizeBegin",
    "SessionInfo",
    "RedisMemClient",
    "SUMMARY_ROLE",
]

#: The role MEM.GET gives the summary entry (always the first entry).
SUMMARY_ROLE = "summary"

JsonObject = Dict[str, Any]


# --------------------------------------------------------------------------
# Reply normalisation
# --------------------------------------------------------------------------

def _text(v: Any) -> Any:
    """bytes -> str (UTF-8); anything else unchanged."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8")
    return v


def _to_map(reply: Any) -> Dict[str, Any]:
    """A module map reply as a dict with str keys: RESP3 gives a dict, RESP2
    a flat [field, value, field, value, ...] list."""
    if isinstance(reply, dict):
        items: Iterable = reply.items()
    elif isinstance(reply, (list, tuple)):
        if len(reply) % 2:
            raise ValueError(f"not a field/value array: {reply!r}")
        items = zip(reply[0::2], reply[1::2])
    else:
        raise ValueError(f"not a map reply: {reply!r}")
    return {_text(k): v for k, v in items}


def _from_map(cls, m: Mapping[str, Any], **override):
    """Builds dataclass ``cls`` from a map, ignoring fields it does not know
    (a newer module may add some)."""
    kw = {}
    for f in fields(cls):
        if f.name in override:
            kw[f.name] = override[f.name]
        elif f.name in m:
            kw[f.name] = m[f.name]
    return cls(**kw)


def _meta_arg(meta: Union[None, str, bytes, Mapping[str, Any]]) -> Optional[Union[str, bytes]]:
    if meta is None or isinstance(meta, (str, bytes)):
        return meta
    return json.dumps(meta, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------
# Typed results
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class AppendResult:
    """Reply of MEM.APPEND, MEM.SUMMARIZE and MEM.IMPORT. ``duplicate``: the
    write was a retry of one already applied (same MSGID, or the same summary):
    nothing changed and ``id``/``tokens`` are the original message's.
    ``msgid``: the MSGID this client sent (None for other commands)."""

    id: int
    tokens: int
    total_tokens: int
    messages: int
    trimmed: int
    summarize: bool
    duplicate: bool = False
    msgid: Optional[str] = None

    @classmethod
    def from_reply(cls, reply: Any, msgid: Optional[str] = None) -> "AppendResult":
        m = _to_map(reply)
        return _from_map(
            cls,
            m,
            summarize=bool(int(m.get("summarize", 0))),
            duplicate=bool(int(m.get("duplicate", 0))),
            msgid=msgid,
        )


@dataclass(frozen=True)
class Message:
    """One entry of MEM.GET. The summary, when there is one, is an entry with
    role ``"summary"`` whose ``id`` is the last message id it covers."""

    id: int
    role: str
    content: str
    ts: int
    tokens: int
    meta: Optional[JsonObject] = None
    #: The client's id of the message (MSGID), when it was given one.
    msgid: Optional[str] = None

    @property
    def is_summary(self) -> bool:
        return self.role == SUMMARY_ROLE

    @property
    def timestamp(self) -> datetime:
        """``ts`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.ts / 1000, tz=timezone.utc)

    @classmethod
    def from_reply(cls, reply: Any) -> "Message":
        m = _to_map(reply)
        meta = _text(m.get("meta"))
        return cls(
            id=int(m["id"]),
            role=_text(m["role"]),
            content=_text(m["content"]),
            ts=int(m["ts"]),
            tokens=int(m["tokens"]),
            meta=json.loads(meta) if meta is not None else None,
            msgid=_text(m.get("msgid")),
        )


@dataclass(frozen=True)
class SummarizeCheck:
    """Reply of MEM.SUMMARIZE_CHECK."""

    summarize: bool
    total_tokens: int
    messages: int
    threshold_tokens: int
    threshold_messages: int
    keep: int
    upto: int
    upto_tokens: int

    @classmethod
    def from_reply(cls, reply: Any) -> "SummarizeCheck":
        m = _to_map(reply)
        return _from_map(cls, m, summarize=bool(int(m.get("summarize", 0))))


@dataclass(frozen=True)
class SummarizeBegin(SummarizeCheck):
    """Reply of MEM.SUMMARIZE_BEGIN: the check, plus ``lease`` (the token to
    give MEM.SUMMARIZE, 0 when not granted: nothing to do, or another worker
    holds the session) and ``lease_expires`` (Unix ms of the live lease's
    end, this one's or the other worker's; 0 when none)."""

    lease: int = 0
    lease_expires: int = 0

    @classmethod
    def from_reply(cls, reply: Any) -> "SummarizeBegin":
        m = _to_map(reply)
        return _from_map(cls, m, summarize=bool(int(m.get("summarize", 0))))


@dataclass(frozen=True)
class SessionInfo:
    """Reply of MEM.INFO."""

    messages: int
    total_tokens: int
    model: str
    encoding: str
    context_window: int
    maxtokens: int
    maxmsgs: int
    ttl: int
    first_id: int
    last_id: int
    created: int
    updated: int
    summary_upto: int
    external: List[str] = field(default_factory=list)

    @classmethod
    def from_reply(cls, reply: Any) -> "SessionInfo":
        m = _to_map(reply)
        return _from_map(
            cls,
            m,
            model=_text(m.get("model")),
            encoding=_text(m.get("encoding")),
            external=[_text(x) for x in (m.get("external") or [])],
        )


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------

class RedisMemClient:
    """Thin wrapper over a ``redis.Redis`` connection (any protocol, decoded
    or not). Errors of the module surface as ``redis.ResponseError``."""

    def __init__(self, client: "redis.Redis", auto_msgid: bool = True):
        self.redis = client
        #: Give every append without a ``msgid`` a fresh one, so that the
        #: same command sent twice (a retry) is stored once.
        self.auto_msgid = auto_msgid

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "RedisMemClient":
        return cls(redis.Redis.from_url(url, **kwargs))

    # -- helpers -----------------------------------------------------------

    def _cmd(self, *args: Any) -> Any:
        return self.redis.execute_command(*args)

    @staticmethod
    def _opt(name: str, value: Any) -> List[Any]:
        return [] if value is None else [name, value]

    def _msgid(self, msgid: Optional[str]) -> Optional[str]:
        if msgid is None and self.auto_msgid:
            return uuid.uuid4().hex
        return msgid

    # -- writes ------------------------------------------------------------

    def append(
        self,
        key: str,
        role: str,
        content: str,
        ts: Optional[int] = None,
        meta: Union[None, str, Mapping[str, Any]] = None,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
        msgid: Optional[str] = None,
    ) -> AppendResult:
        """MEM.APPEND. ``ts`` in Unix ms; ``meta`` a dict (sent as JSON) or a
        JSON object text; ``maxage`` in seconds: messages older than that
        leave the session (0 = no limit; a session setting); ``msgid``
        (1-128 bytes) the message's own id, so a retry of this append is
        recognised (one is made up when None and ``auto_msgid``; the result's
        ``msgid`` says which)."""
        msgid = self._msgid(msgid)
        args = ["MEM.APPEND", key, role, content]
        args += self._opt("TS", ts)
        args += self._opt("META", _meta_arg(meta))
        args += self._opt("MODEL", model)
        args += self._opt("TTL", ttl)
        args += self._opt("MAXTOKENS", maxtokens)
        args += self._opt("MAXMSGS", maxmsgs)
        args += self._opt("MAXAGE", maxage)
        args += self._opt("MSGID", msgid)
        return AppendResult.from_reply(self._cmd(*args), msgid)

    def append_batch(
        self,
        key: str,
        messages: Iterable[Mapping[str, Any]],
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
    ) -> List[AppendResult]:
        """MEM.APPENDBATCH: several messages (dicts with ``role``, ``content``
        and optional ``ts``, ``meta``, ``msgid``) appended in one atomic
        command, as consecutive MEM.APPENDs; one result per message (a
        message whose msgid the session already has: ``duplicate``)."""
        items = []
        for m in messages:
            item = {"role": m["role"], "content": m["content"]}
            if m.get("ts") is not None:
                item["ts"] = m["ts"]
            meta = m.get("meta")
            if meta is not None:
                item["meta"] = json.loads(meta) if isinstance(meta, (str, bytes)) else meta
            msgid = self._msgid(m.get("msgid"))
            if msgid is not None:
                item["msgid"] = msgid
            items.append(item)
        args = ["MEM.APPENDBATCH", key, json.dumps(items, ensure_ascii=False, separators=(",", ":"))]
        args += self._opt("MODEL", model)
        args += self._opt("TTL", ttl)
        args += self._opt("MAXTOKENS", maxtokens)
        args += self._opt("MAXMSGS", maxmsgs)
        args += self._opt("MAXAGE", maxage)
        return [AppendResult.from_reply(r, item.get("msgid")) for r, item in zip(self._cmd(*args), items)]

    def summarize(self, key: str, upto: int, text: str, lease: Optional[int] = None) -> AppendResult:
        """MEM.SUMMARIZE: replace the summary and every message with
        ``id <= upto`` by ``text``. ``lease``: the token MEM.SUMMARIZE_BEGIN
        granted (a summary without it is refused, ``LEASED``, while another
        worker's lease is live)."""
        args = ["MEM.SUMMARIZE", key, upto, text] + self._opt("LEASE", lease or None)
        return AppendResult.from_reply(self._cmd(*args))

    def summarize_begin(
        self,
        key: str,
        lease_ms: int,
        model: Optional[str] = None,
        context: Optional[int] = None,
        keep: Optional[int] = None,
    ) -> "SummarizeBegin":
        """MEM.SUMMARIZE_BEGIN: the check, and a lease of ``lease_ms`` when
        the session is due and no other worker holds it (``lease`` > 0)."""
        args = ["MEM.SUMMARIZE_BEGIN", key, lease_ms]
        args += self._opt("MODEL", model)
        args += self._opt("CONTEXT", context)
        args += self._opt("KEEP", keep)
        return SummarizeBegin.from_reply(self._cmd(*args))

    def extset(self, key: str, system: str, conversation_id: str, ex: Optional[int] = None) -> bool:
        """MEM.EXTSET; True on OK."""
        reply = self._cmd("MEM.EXTSET", key, system, conversation_id, *self._opt("EX", ex))
        return _text(reply) == "OK" or reply is True

    def attrset(self, key: str, name: str, value: Any, raw: bool = False) -> bool:
        """MEM.ATTRSET: store ``value`` (any JSON-serializable value, sent as
        JSON; with ``raw=True`` a JSON text sent as is) as the session's
        ``name`` member (``user_profile``, ``context``, ...), returned at the
        top level of :meth:`get_json`. Creates the session, refreshes its TTL."""
        text = value if raw else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        reply = self._cmd("MEM.ATTRSET", key, name, text)
        return _text(reply) == "OK" or reply is True

    def attrdel(self, key: str, name: str) -> bool:
        """MEM.ATTRDEL: True when the member was set."""
        return int(self._cmd("MEM.ATTRDEL", key, name)) == 1

    def import_json(
        self,
        key: str,
        doc: Union[str, bytes, Mapping[str, Any]],
        replace: bool = False,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
    ) -> AppendResult:
        """MEM.IMPORT from a dict or a JSON text (``{"conversation_history":
        [...], ...}``)."""
        if not isinstance(doc, (str, bytes)):
            doc = json.dumps(doc, ensure_ascii=False)
        args = ["MEM.IMPORT", key, doc]
        if replace:
            args.append("REPLACE")
        args += self._opt("MODEL", model)
        args += self._opt("TTL", ttl)
        return AppendResult.from_reply(self._cmd(*args))

    def delete(self, key: str) -> int:
        return int(self.redis.delete(key))

    # -- reads -------------------------------------------------------------

    def _get_args(self, key: str, last, after, budget) -> List[Any]:
        return (
            ["MEM.GET", key]
            + self._opt("LAST", last)
            + self._opt("AFTER", after)
            + self._opt("BUDGET", budget)
        )

    def get(
        self,
        key: str,
        last: Optional[int] = None,
        after: Optional[int] = None,
        budget: Optional[int] = None,
    ) -> List[Message]:
        """MEM.GET: the summary (role "summary", if any) then messages, oldest
        first. Empty list for a missing key."""
        reply = self._cmd(*self._get_args(key, last, after, budget))
        return [Message.from_reply(e) for e in reply or []]

    def get_json(
        self,
        key: str,
        last: Optional[int] = None,
        after: Optional[int] = None,
        budget: Optional[int] = None,
    ) -> JsonObject:
        """MEM.GET ... FORMAT JSON, parsed: ``{"conversation_history": [...],
        "summary": {...}|None, "total_tokens": n, "model": ..., <imported extras>}``."""
        reply = self._cmd(*self._get_args(key, last, after, budget), "FORMAT", "JSON")
        return json.loads(_text(reply))

    def summarize_check(
        self,
        key: str,
        model: Optional[str] = None,
        context: Optional[int] = None,
        keep: Optional[int] = None,
    ) -> SummarizeCheck:
        """MEM.SUMMARIZE_CHECK (``model`` or ``context``, not both)."""
        args = ["MEM.SUMMARIZE_CHECK", key]
        args += self._opt("MODEL", model)
        args += self._opt("CONTEXT", context)
        args += self._opt("KEEP", keep)
        return SummarizeCheck.from_reply(self._cmd(*args))

    def attrget(self, key: str, name: Optional[str] = None, raw: bool = False) -> Any:
        """MEM.ATTRGET. With ``name``: the member's value parsed (its JSON text
        with ``raw=True``), None when absent. Without: a dict of every member."""
        decode = _text if raw else (lambda v: json.loads(_text(v)))
        if name is not None:
            reply = self._cmd("MEM.ATTRGET", key, name)
            return None if reply is None else decode(reply)
        return {k: decode(v) for k, v in _to_map(self._cmd("MEM.ATTRGET", key)).items()}

    def extget(self, key: str, system: str) -> Optional[str]:
        """MEM.EXTGET: the stored id, or None when unknown or expired."""
        return _text(self._cmd("MEM.EXTGET", key, system))

    def info(self, key: str) -> Optional[SessionInfo]:
        """MEM.INFO, or None for a missing key."""
        reply = self._cmd("MEM.INFO", key)
        return None if reply is None else SessionInfo.from_reply(reply)
