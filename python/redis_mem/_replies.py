"""Replies of the redis-mem module as typed values.

Every reply is normalised whatever the connection looks like: RESP2 (maps
arrive as flat field/value arrays) or RESP3 (real maps), with
``decode_responses`` on or off. Shared by the sync and asyncio clients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any, Dict, Iterable, List, Mapping, Optional, Type, TypeVar, Union

__all__ = [
    "AppendResult",
    "Message",
    "SummarizeCheck",
    "SummarizeBegin",
    "SessionInfo",
    "ModelInfo",
    "SUMMARY_ROLE",
    "JsonObject",
]

#: The role MEM.GET gives the summary entry (always the first entry).
SUMMARY_ROLE = "summary"

JsonObject = Dict[str, Any]
D = TypeVar("D")


# --------------------------------------------------------------------------
# Reply normalisation
# --------------------------------------------------------------------------

def _server_ms(r: Any) -> int:
    """The server's clock (TIME), in Unix ms: expiries are on it."""
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _text(v: Any) -> Any:
    """bytes -> str (UTF-8); anything else unchanged."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8")
    return v


def _to_map(reply: Any) -> Dict[str, Any]:
    """A module map reply as a dict with str keys: RESP3 gives a dict, RESP2
    a flat [field, value, field, value, ...] list."""
    if isinstance(reply, dict):
        items: Iterable[Any] = reply.items()
    elif isinstance(reply, (list, tuple)):
        if len(reply) % 2:
            raise ValueError(f"not a field/value array: {reply!r}")
        items = zip(reply[0::2], reply[1::2])
    else:
        raise ValueError(f"not a map reply: {reply!r}")
    return {_text(k): v for k, v in items}


def _from_map(cls: Type[D], m: Mapping[str, Any], **override: Any) -> D:
    """Builds dataclass ``cls`` from a map, ignoring fields it does not know
    (a newer module may add some)."""
    kw: Dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
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
        """Parses a MEM.APPEND / MEM.SUMMARIZE / MEM.IMPORT map (RESP2 or RESP3)."""
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
    """One entry of MEM.GET. The summary, when there is one, is the first
    entry, with role ``"summary"``, whose ``id`` is the last message id it
    covers, and (SPEC v3) a field ``summary`` = 1 that no message entry has:
    :attr:`is_summary` uses it, so a message whose role is "summary" is not
    taken for the summary."""

    id: int
    role: str
    content: str
    ts: int
    tokens: int
    meta: Optional[JsonObject] = None
    #: The client's id of the message (MSGID), when it was given one.
    msgid: Optional[str] = None
    #: The reply's ``summary`` marker (True/False), None when the module
    #: sends none (an older module): see :attr:`is_summary`.
    summary_marker: Optional[bool] = None

    @property
    def is_summary(self) -> bool:
        """Whether this entry is the session summary: the reply's ``summary``
        marker; with an older module, which sends none, role "summary"."""
        if self.summary_marker is not None:
            return self.summary_marker
        return self.role == SUMMARY_ROLE

    @property
    def timestamp(self) -> datetime:
        """``ts`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.ts / 1000, tz=timezone.utc)

    @classmethod
    def from_reply(cls, reply: Any) -> "Message":
        """Parses one MEM.GET entry (RESP2 or RESP3)."""
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
            summary_marker=bool(int(m["summary"])) if m.get("summary") is not None else None,
        )

    @classmethod
    def list_from_reply(cls, reply: Any) -> List["Message"]:
        """Every entry of a MEM.GET reply. When any entry carries the
        ``summary`` marker, entries without it are messages; when none does,
        only a first entry with role "summary" may be the summary (see
        :meth:`summary_ambiguous`)."""
        out = [cls.from_reply(e) for e in reply or []]
        marked = any(e.summary_marker is not None for e in out)
        return [
            e if e.summary_marker is not None
            else replace(e, summary_marker=False) if marked or i > 0
            else e
            for i, e in enumerate(out)
        ]

    @staticmethod
    def summary_ambiguous(entries: List["Message"]) -> bool:
        """Whether the reply leaves open if its first entry is the summary: no
        marker on it and role "summary". A SPEC v3 module marks its summary,
        so this is a message with that role, or an older module's summary;
        :meth:`resolve_summary` tells them apart with MEM.INFO."""
        return bool(entries) and entries[0].summary_marker is None and entries[0].role == SUMMARY_ROLE

    @staticmethod
    def resolve_summary(entries: List["Message"], summary_upto: int) -> List["Message"]:
        """Settles :meth:`summary_ambiguous` with the session's
        ``summary_upto`` (MEM.INFO): the first entry is the summary only if
        the session has one ending at its id (a summary entry's id is the last
        message it covers; a message with that id is covered, so gone)."""
        if not Message.summary_ambiguous(entries):
            return entries
        first = entries[0]
        is_summary = summary_upto > 0 and first.id == summary_upto
        return [replace(first, summary_marker=is_summary)] + entries[1:]


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
        """Parses a MEM.SUMMARIZE_CHECK map."""
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
        """Parses a MEM.SUMMARIZE_BEGIN map."""
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
    #: SPEC v3; None when the module sends none (an older module).
    #: Messages the caps or MAXAGE removed without a summary covering them,
    #: since the session was created.
    evicted: Optional[int] = None
    #: Summaries the caps evicted (the messages they covered are gone);
    #: None from a module whose MEM.INFO has no such field.
    summaries_dropped: Optional[int] = None
    #: Messages covered by summaries.
    summarized: Optional[int] = None
    #: Unix ms of the last summary; 0 when none.
    summary_ts: Optional[int] = None
    #: External system -> milliseconds its id has left (as PTTL).
    external_ttl: Optional[Dict[str, int]] = None
    #: Milliseconds a summarizer's lease has left (0: none; None: the module
    #: does not say).
    lease_ttl: Optional[int] = None

    @classmethod
    def from_reply(cls, reply: Any) -> "SessionInfo":
        """Parses a MEM.INFO map."""
        m = _to_map(reply)
        ext_ttl = m.get("external_ttl")
        return _from_map(
            cls,
            m,
            model=_text(m.get("model")),
            encoding=_text(m.get("encoding")),
            external=[_text(x) for x in (m.get("external") or [])],
            **{k: int(m[k]) for k in ("evicted", "summaries_dropped", "summarized", "summary_ts", "lease_ttl")
               if m.get(k) is not None},
            external_ttl=None if ext_ttl is None else {k: int(v) for k, v in _to_map(ext_ttl).items()},
        )


@dataclass(frozen=True)
class ModelInfo:
    """Reply of MEM.MODELS model: what the module's model table resolves the
    name to. ``exact``: counted with the vendor's own tokenizer (False: no
    public tokenizer, e.g. Claude or Gemini, or an unknown model, counted
    with mem.default-encoding). ``context_window``: the model's window in
    tokens, 0 when the table does not know it. ``entry``: the table pattern
    that matched (None: none did); ``source``: "builtin", "config" or "none"."""

    model: str
    encoding: str
    exact: bool
    context_window: int
    entry: Optional[str] = None
    source: str = "none"

    @classmethod
    def from_reply(cls, reply: Any) -> "ModelInfo":
        """Parses a MEM.MODELS <model> map (RESP2 or RESP3)."""
        m = _to_map(reply)
        return cls(
            model=_text(m["model"]),
            encoding=_text(m["encoding"]),
            exact=bool(int(m.get("exact", 0))),
            context_window=int(m.get("context_window", 0)),
            entry=_text(m.get("entry")),
            source=_text(m.get("source", "none")),
        )
