"""Resumable reply streams: the seed's stream buffer
(``orchestrator:stream:{session_id}``), the SSE chunks of a reply held in Redis
for a front end to pull, on Redis Streams.

A producer (the process running the model) writes the reply's chunks as they
come; any number of readers, on any process of the app, read them from the
last event id they saw. A front end that loses its connection mid-reply (a
phone changing networks, a load balancer moving it to another node) sends
that id back (SSE ``Last-Event-ID``) and gets the rest, not a restart:

    stream = ReplyStream(redis.Redis(), "mem:{alice}")     # a fresh reply id
    for token in model_tokens:
        stream.write(token)                                 # -> event id
    stream.finish()          # one MEM.APPEND ... assistant <text> MSGID <reply id>

    # an SSE endpoint, anywhere (a reconnect sends Last-Event-ID):
    for event in ReplyStream(r, "mem:{alice}", reply_id).events(after=last_event_id or "0"):
        send(f"id: {event.id}\\ndata: {event.text}\\n\\n")

The layout (docs/STREAMS.md; the TypeScript package shares it):

- key: ``<session key>:reply:<reply id>`` when the session key has a hash tag
  (``mem:{alice}`` -> ``mem:{alice}:reply:<id>``), else
  ``{<session key>}:reply:<id>``: the session's hash slot either way, so on a
  cluster the stream and the session live on one node;
- one entry per event, its stream id the event id (SSE ``id:``), fields
  ``type`` (``chunk``, ``end`` or ``error``) and: a chunk's ``text`` and
  ``n`` (its sequence number: 0, 1, ...); an end's ``msgid`` (the reply id:
  the stored message's MSGID), ``chunks`` (how many chunks were written),
  ``message_id`` (its id in the session) and ``meta`` (JSON object, when
  given); an error's ``text`` (what went wrong);
- ``XADD ... MAXLEN ~ <maxlen>`` and ``EXPIRE <ttl>`` on every write: the
  stream outlives the reply's last event by ``ttl`` seconds (default 300),
  then is gone; the reply itself stays in the session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import redis
import redis.asyncio

from ._commands import MAX_MSGID_BYTES, is_name_breaker, new_msgid
from ._drive import Core, Op
from ._drive import adrive as _adrive
from ._drive import drive as _drive
from ._replies import AppendResult, _text
from .client import AsyncRedisMemClient, RedisMemClient

__all__ = [
    "AsyncReplyStream",
    "DEFAULT_MAXLEN",
    "DEFAULT_TTL",
    "ReplyEvent",
    "ReplyStream",
    "ReplyStreamError",
    "ReplyStreamGap",
    "ReplyStreamTimeout",
    "check_reply_id",
    "reply_stream_key",
    "valid_event_id",
]

log = logging.getLogger("redis_mem.reply_stream")

#: Seconds the stream lives after its last write.
DEFAULT_TTL = 300
#: Events a stream keeps (``XADD MAXLEN ~``): far more than a reply's chunks.
DEFAULT_MAXLEN = 10_000

CHUNK = "chunk"
END = "end"
ERROR = "error"
_KNOWN = (CHUNK, END, ERROR)
#: mem.max-message-bytes when CONFIG GET is not allowed (the module's default).
DEFAULT_MAX_MESSAGE_BYTES = 4194304
#: Marker appended to a reply stored truncated ({kept} and {size} in bytes),
#: as the middleware's.
TRUNCATED_MARKER = "\n[redis-mem: truncated to {kept} of {size} bytes (over mem.max-message-bytes)]"
_MAX_U64 = (1 << 64) - 1


class ReplyStreamError(RuntimeError):
    """The producer ended the reply with :meth:`ReplyStream.error`: raised by
    :meth:`ReplyStream.chunks` with the producer's message."""


class ReplyStreamGap(ReplyStreamError):
    """Events after the reader's ``after`` were lost before it read them:
    trimmed (``MAXLEN``), or the stream was recreated (Redis restarted
    without persistence mid-reply, or the stream expired before the end
    event): the reply cannot be resumed from there without a hole.
    ``after``: the reader's id; ``first_kept``: the oldest event the
    stream still holds ("" when it holds none). Once the reply ended, its
    whole text is the session's message (MSGID = the reply id)."""

    def __init__(self, reply_id: str, after: str, first_kept: str, reason: Optional[str] = None) -> None:
        super().__init__(f"reply {reply_id}: " + (reason or f"events before {first_kept} were trimmed (MAXLEN)")
                         + f"; a reader after {after} would miss some")
        self.after = after
        self.first_kept = first_kept


class ReplyStreamTimeout(TimeoutError):
    """No event came for ``idle_timeout`` seconds (the producer died, or
    the reply id is unknown)."""


@dataclass(frozen=True)
class ReplyEvent:
    """One event of a reply: ``id`` is its stream id (for SSE ``id:`` and
    ``Last-Event-ID``), ``type`` ``"chunk"``, ``"end"`` or ``"error"``.
    ``text``: a chunk's text, an error's message ("" for an end).
    An end carries ``msgid`` (the reply id), ``message_id`` (the stored
    message's id in the session, None when it was not stored), ``meta`` and
    ``chunks`` (how many chunks the producer wrote); a chunk its sequence
    number ``n`` (0, 1, ...). Both None from a producer that predates them."""

    id: str
    type: str
    text: str = ""
    msgid: Optional[str] = None
    message_id: Optional[int] = None
    meta: Optional[Dict[str, Any]] = None
    n: Optional[int] = None
    chunks: Optional[int] = None

    @property
    def last(self) -> bool:
        """True for the event that ends the reply (end or error)."""
        return self.type in (END, ERROR)


def _hash_tag(key: str) -> Optional[str]:
    """The hash tag Redis Cluster hashes ``key`` by, or None when it hashes
    the whole key: the text between the first ``{`` and the first ``}``
    after it, when not empty."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end < 0 or end == start + 1:
        return None
    return key[start + 1:end]


def reply_stream_key(session_key: Union[str, bytes], reply_id: str) -> str:
    """The stream key of reply ``reply_id`` of the session ``session_key``,
    in the session's hash slot: ``<session key>:reply:<reply id>`` when the
    session key has a hash tag, else ``{<session key>}:reply:<reply id>``.
    A session key without a hash tag that holds a ``}`` has no such key (a
    wrapped one would hash differently): ValueError."""
    key = _text(session_key)
    if not isinstance(key, str) or not key:
        raise ValueError("the session key must be a non-empty str")
    if not reply_id:
        raise ValueError("the reply id must not be empty")
    if _hash_tag(key) is not None:
        return f"{key}:reply:{reply_id}"
    if "}" in key:
        raise ValueError(f"session key {key!r} has no hash tag and holds '}}': give it one, e.g. 'mem:{{id}}'")
    return f"{{{key}}}:reply:{reply_id}"


_ID = re.compile(r"[0-9]+-[0-9]+")


def _is_id(v: Any) -> bool:
    return isinstance(v, (str, bytes)) and _ID.fullmatch(_text(v)) is not None


def _fields(v: Any) -> Dict[str, str]:
    if isinstance(v, dict):
        return {_text(k): _text(x) for k, x in v.items()}
    items = list(v)
    return {_text(k): _text(x) for k, x in zip(items[0::2], items[1::2])}


def _entries(reply: Any) -> List[Tuple[str, Dict[str, str]]]:
    """The stream entries ``(id, fields)`` of an XREAD or XREVRANGE reply,
    whatever shape redis-py 5-8 parses it into (RESP2 ``[[key, entries]]``,
    RESP3 ``{key: [entries]}`` or ``{key: entries}``, fields a dict or a
    flat list; bytes or str), in order."""
    out: List[Tuple[str, Dict[str, str]]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            if len(x) == 2 and _is_id(x[0]) and (x[1] is None or isinstance(x[1], (dict, list, tuple))):
                if x[1] is not None:  # None: an entry deleted meanwhile
                    out.append((_text(x[0]), _fields(x[1])))
            else:
                for item in x:
                    walk(item)

    walk(reply)
    return out


_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")


def valid_event_id(after: Any) -> str:
    """``after`` as an event id to read after ("0", "<ms>" or "<ms>-<seq>",
    each part decimal and at most 2^64-1; None or "" -> "0"); ValueError
    for anything else, a trailing newline too (a client's
    ``Last-Event-ID`` is input: check it before answering)."""
    eid = "0" if after is None or after == "" else _text(after)
    m = _EVENT_ID.fullmatch(eid) if isinstance(eid, str) else None
    if m is None or any(part is not None and int(part) > _MAX_U64 for part in m.groups()):
        raise ValueError(f"not an event id: {after!r}")
    return eid


def check_reply_id(reply_id: Any) -> str:
    """``reply_id`` when the module takes it as a MSGID (1 to 128 UTF-8
    bytes, no control character nor U+2028 / U+2029); ValueError (TypeError
    when not a str) otherwise."""
    if not isinstance(reply_id, str):
        raise TypeError(f"a reply id is a str, not {type(reply_id).__name__}")
    if not 1 <= len(reply_id.encode("utf-8", "surrogatepass")) <= MAX_MSGID_BYTES:
        raise ValueError(f"a reply id is 1 to {MAX_MSGID_BYTES} bytes (it is the message's MSGID)")
    bad = next((ch for ch in reply_id if is_name_breaker(ch)), None)
    if bad is not None:
        raise ValueError(f"a reply id must not contain control characters (U+{ord(bad):04X}): "
                         "it is the message's MSGID")
    try:
        reply_id.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"a reply id must be valid UTF-8: {err}") from None
    return reply_id


def _truncate(text: str, limit: int) -> Tuple[str, int]:
    """(text cut to at most ``limit`` UTF-8 bytes with the marker, original
    size) or (text, 0) when it fits (the middleware's rule)."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text, 0
    marker_room = len(TRUNCATED_MARKER.format(kept=len(raw), size=len(raw)).encode("utf-8"))
    cut = raw[:max(0, limit - marker_room)].decode("utf-8", "ignore")
    return cut + TRUNCATED_MARKER.format(kept=len(cut.encode("utf-8")), size=len(raw)), len(raw)


def _successor(eid: str) -> str:
    """The smallest stream id above ``eid``."""
    ms, seq = _id_key(eid)
    return f"{ms}-{seq + 1}" if seq < _MAX_U64 else f"{ms + 1}-0"


def _id_key(eid: str) -> Tuple[int, int]:
    """A stream id as a comparable pair ("0" and "0-0": the start)."""
    ms, _, seq = str(eid).partition("-")
    return int(ms or 0), int(seq or 0)


def _event(eid: str, fields: Mapping[str, str]) -> ReplyEvent:
    kind = fields.get("type", "")
    meta = json.loads(fields["meta"]) if fields.get("meta") else None
    mid = fields.get("message_id")
    return ReplyEvent(id=eid, type=kind, text=fields.get("text", ""), msgid=fields.get("msgid"),
                      message_id=int(mid) if mid else None, meta=meta,
                      n=_opt_int(fields.get("n")), chunks=_opt_int(fields.get("chunks")))


def _opt_int(v: Optional[str]) -> Optional[int]:
    try:
        return int(v) if v is not None and v != "" else None
    except ValueError:
        return None


def _taken(res: Any) -> Any:
    """An XADD with an explicit id's reply: its id, or None when a racing
    writer took the id first (ERR ... equal or smaller than the target stream
    top item); other errors raised."""
    if isinstance(res, Exception):
        if "equal or smaller" in str(res):
            return None
        raise res
    return res


class _Core:
    """What :class:`ReplyStream` and :class:`AsyncReplyStream` share: the
    layout, and each operation as a generator of I/O requests that a sync or
    an async driver answers."""

    def __init__(
        self,
        key: Union[str, bytes],
        reply_id: Optional[str],
        ttl: int,
        maxlen: int,
        approximate: bool,
        store: bool,
        append_options: Optional[Mapping[str, Any]],
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be a positive number of seconds")
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        self.session_key = _text(key)
        self.reply_id = check_reply_id(reply_id or new_msgid())
        self.stream_key = reply_stream_key(self.session_key, self.reply_id)
        self.ttl = ttl
        self.maxlen = maxlen
        self.approximate = approximate
        self.store = store
        self.append_options: Dict[str, Any] = dict(append_options or {})
        self._parts: List[str] = []
        self.last_id: Optional[str] = None
        self.finished: Optional[ReplyEvent] = None
        self.max_message_bytes: Optional[int] = None

    @property
    def text(self) -> str:
        """What this object wrote so far."""
        return "".join(self._parts)

    def _check_open(self) -> None:
        if self.finished is not None:
            raise RuntimeError(f"reply {self.reply_id} already ended ({self.finished.type})")

    def _xadd(self, fields: Dict[str, str]) -> Core[str]:
        eid = _text((yield ("xadd", self.stream_key, fields, self.maxlen, self.approximate, self.ttl)))
        self.last_id = eid
        return str(eid)

    def _write_core(self, chunk: str) -> Core[str]:
        self._check_open()
        if not isinstance(chunk, str):
            raise TypeError(f"a chunk is a str, not {type(chunk).__name__}")
        eid = yield from self._xadd({"type": CHUNK, "text": chunk, "n": str(len(self._parts))})
        self._parts.append(chunk)
        return eid

    def _last_event_core(self) -> Core[Optional[ReplyEvent]]:
        got = _entries((yield ("last", self.stream_key)))
        return _event(*got[-1]) if got else None

    def _finish_core(self, meta: Optional[Mapping[str, Any]], text: Optional[str]) -> Core[ReplyEvent]:
        if self.finished is not None and self.finished.type == END:
            return self.finished
        self._check_open()
        full = self.text if text is None else text
        message_id: Optional[int] = None
        meta = dict(meta) if meta else None
        if self.store:
            limit = yield from self._limit_core()
            stored, size = _truncate(full, limit)
            if size:
                # Refused whole on every retry otherwise: stored cut, with a
                # marker (as the middleware does); the full text stays in the
                # stream's chunks until its TTL.
                meta = dict(meta or {})
                meta["redis_mem_truncated"] = size
                log.warning("redis-mem: reply %s of %d bytes is over mem.max-message-bytes (%d): stored "
                            "truncated with a marker (the stream keeps it whole for %d s)",
                            self.reply_id, size, limit, self.ttl)
            result: AppendResult = yield ("append", self.session_key, stored, self.reply_id,
                                          meta, self.append_options)
            message_id = result.id if result.id else None
        fields = {"type": END, "msgid": self.reply_id, "chunks": str(len(self._parts))}
        if message_id is not None:
            fields["message_id"] = str(message_id)
        if meta:
            fields["meta"] = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
        event = yield from self._end_core(fields)
        self.finished = event
        return event

    def _limit_core(self) -> Core[int]:
        if self.max_message_bytes is None:
            got = yield ("config", "mem.max-message-bytes")
            try:
                self.max_message_bytes = int(got) if got is not None else DEFAULT_MAX_MESSAGE_BYTES
            except (TypeError, ValueError):
                self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        return self.max_message_bytes

    def _end_core(self, fields: Dict[str, str]) -> Core[ReplyEvent]:
        """The end event, written once however many finish at once: each
        writer XADDs it with the id right after the stream's last event, so
        of two racing writers the second's XADD is refused (an id not above
        the stream's top) and it finds the first's end event."""
        for attempt in range(16):
            last = yield from self._last_event_core()
            if last is not None and last.type == END and last.msgid == self.reply_id:
                return last  # a finish retried (or racing) after the end event was written
            # An empty stream whose last id is above 0-1 (every entry gone):
            # a second try takes an automatic id.
            nid = _successor(last.id) if last is not None else ("0-1" if attempt == 0 else "*")
            got = yield ("xadd_at", self.stream_key, fields, nid, self.maxlen, self.approximate, self.ttl)
            if got is not None:
                self.last_id = _text(got)
                return _event(self.last_id, fields)
        raise RuntimeError(f"reply {self.reply_id}: could not write its end event (the stream kept changing)")

    def _error_core(self, message: str) -> Core[ReplyEvent]:
        self._check_open()
        fields = {"type": ERROR, "text": str(message)}
        eid = yield from self._xadd(fields)
        self.finished = _event(eid, fields)
        return self.finished

    def _read_core(self, after: str, block: Optional[int], count: Optional[int]) -> Core[List[ReplyEvent]]:
        if block is not None and block < 0:
            raise ValueError("block is a number of milliseconds >= 0")
        reply = yield ("read", self.stream_key, valid_event_id(after), block, count)
        return [_event(eid, fields) for eid, fields in _entries(reply)]

    def _gap_core(self, after: str) -> Core[None]:
        """Raises :class:`ReplyStreamGap` when the stream lost events (MAXLEN
        trimmed some: XINFO STREAM's ``entries-added`` over its ``length``)
        and ``after`` is older than its first entry. Conservative: a reader
        that stopped exactly at the last trimmed event is told too."""
        info = yield ("info", self.stream_key)
        if not info:
            return None
        info = {_text(k): v for k, v in (info.items() if isinstance(info, dict) else zip(info[0::2], info[1::2]))}
        added, length = info.get("entries-added"), info.get("length")
        first = _entries([info.get("first-entry")])
        if added is None or length is None or not first or int(added) <= int(length):
            return None
        if _id_key(first[0][0]) > _id_key(after):
            raise ReplyStreamGap(self.reply_id, after, first[0][0])
        return None

    def _resume_core(self, after: str) -> Core[Optional[int]]:
        """The sequence number of the chunk a reader after ``after`` is to
        get next (None: unknown, a producer without them). A reader after
        an id the stream does not hold (trimmed, or the stream was recreated
        or expired since) raises :class:`ReplyStreamGap`."""
        eid = valid_event_id(after)
        if _id_key(eid) == (0, 0):
            return 0
        full = eid if "-" in eid else f"{eid}-0"
        got = _entries((yield ("before", self.stream_key, full, 16)))
        if not got or _id_key(got[0][0]) != _id_key(full):
            first = yield from self._first_core()
            raise ReplyStreamGap(self.reply_id, after, first,
                                 f"the stream no longer holds event {eid} (trimmed, or the stream was "
                                 "recreated: Redis restarted without persistence, or it expired)")
        for _eid, fields in got:
            if fields.get("type") == CHUNK:
                n = _opt_int(fields.get("n"))
                return None if n is None else n + 1
        return 0 if len(got) < 16 else None  # no chunk before it: the reply's first is next

    def _first_core(self) -> Core[str]:
        info = yield ("info", self.stream_key)
        if not info:
            return ""
        info = {_text(k): v for k, v in (info.items() if isinstance(info, dict) else zip(info[0::2], info[1::2]))}
        first = _entries([info.get("first-entry")])
        return first[0][0] if first else ""

    def _track(self, event: ReplyEvent, expected: Optional[int], after: str) -> Optional[int]:
        """``expected`` after ``event`` (see :meth:`_resume_core`);
        :class:`ReplyStreamGap` when a chunk comes out of sequence or the
        end counts more chunks than the reader could have got."""
        if expected is None:
            return None
        if event.type == CHUNK:
            if event.n is None:
                return None  # a producer without sequence numbers: nothing to check
            if event.n != expected:
                raise ReplyStreamGap(self.reply_id, after, event.id,
                                     f"chunk {event.n} came where chunk {expected} was due (the stream "
                                     "lost events: recreated after a restart without persistence?)")
            return expected + 1
        if event.type == END and event.chunks is not None and event.chunks > expected:
            raise ReplyStreamGap(self.reply_id, after, event.id,
                                 f"the reply has {event.chunks} chunks and chunks {expected} to "
                                 f"{event.chunks - 1} are not in the stream (it expired or was recreated "
                                 "before the end)")
        return expected

    def _idle(self, idle_timeout: Optional[float]) -> float:
        return float(self.ttl if idle_timeout is None else idle_timeout)




class ReplyStream(_Core):
    """One reply of the session ``key``, as a Redis Stream (module
    docstring; docs/STREAMS.md).

    ``reply_id``: the reply's id (default: a fresh 32-hex id), which names
    the stream and is the stored message's MSGID; a reader on another
    process builds its ReplyStream with the same ``key`` and ``reply_id``.
    ``ttl``: seconds the stream lives after its last write (EXPIRE on each
    write). ``maxlen``: events kept (``XADD MAXLEN ~``; ``approximate=False``
    for an exact ``=``). ``store``: whether :meth:`finish` stores the text
    in the session (False when a middleware stores the agent's messages
    itself). ``append_options``: :meth:`RedisMemClient.append` settings for
    that message (``model``, ``ttl``, ``maxtokens``, ``maxmsgs``,
    ``maxage``, ``tokens``)."""

    def __init__(
        self,
        client: Union["redis.Redis", RedisMemClient],
        key: Union[str, bytes],
        reply_id: Optional[str] = None,
        *,
        ttl: int = DEFAULT_TTL,
        maxlen: int = DEFAULT_MAXLEN,
        approximate: bool = True,
        store: bool = True,
        append_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(key, reply_id, ttl, maxlen, approximate, store, append_options)
        self.mem = client if isinstance(client, RedisMemClient) else RedisMemClient(client)
        self.redis = self.mem.redis

    def _do(self, op: Op) -> Any:
        kind = op[0]
        if kind == "xadd":
            _, key, fields, maxlen, approx, ttl = op
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(key, fields, maxlen=maxlen, approximate=approx)
            pipe.expire(key, ttl)
            return pipe.execute()[0]
        if kind == "last":
            return self.redis.xrevrange(op[1], count=1)
        if kind == "before":
            return self.redis.xrevrange(op[1], max=op[2], count=op[3])
        if kind == "config":
            try:
                got = self.redis.config_get(op[1])
            except redis.ResponseError:
                return None
            return next(iter(got.values()), None) if got else None
        if kind == "xadd_at":
            _, key, fields, nid, maxlen, approx, ttl = op
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(key, fields, id=nid, maxlen=maxlen, approximate=approx)
            pipe.expire(key, ttl)
            res = pipe.execute(raise_on_error=False)
            return _taken(res[0])
        if kind == "append":
            _, key, text, msgid, meta, options = op
            return self.mem.append(key, "assistant", text, meta=meta, msgid=msgid, **options)
        if kind == "read":
            _, key, after, block, count = op
            return self.redis.xread({key: after}, count=count, block=block)
        if kind == "info":
            try:
                return self.redis.xinfo_stream(op[1])
            except redis.ResponseError as err:
                if "no such key" in str(err).lower():  # expired meanwhile
                    return None
                raise
        raise AssertionError(kind)

    def write(self, chunk: str) -> str:
        """Appends a chunk of the reply; returns its event id."""
        return _drive(self._write_core(chunk), self._do)

    def finish(self, meta: Optional[Mapping[str, Any]] = None, text: Optional[str] = None) -> ReplyEvent:
        """Ends the reply: stores its text (what was written, or ``text``)
        as the session's assistant message with one ``MEM.APPEND key
        assistant <text> MSGID <reply id>`` (``meta`` as its META), then
        appends the end event. Retried (this object again, or another one
        with the same reply id after an error), or run by two processes at
        once, the message is stored once (the module knows the MSGID) and the
        end event written once (an XADD at the id after the stream's last
        event: the second is refused). A text over ``mem.max-message-bytes``
        is stored truncated with a marker (META ``redis_mem_truncated``: its
        size; a warning logged), the stream keeping it whole until its
        TTL."""
        return _drive(self._finish_core(meta, text), self._do)

    def error(self, message: str) -> ReplyEvent:
        """Ends the reply with an error event (nothing is stored): readers
        stop there (:meth:`chunks` raises :class:`ReplyStreamError`)."""
        return _drive(self._error_core(message), self._do)

    abort = error

    def read(self, after: str = "0", block: Optional[int] = None, count: Optional[int] = None) -> List[ReplyEvent]:
        """The events after event id ``after`` ("0": from the start), with
        XREAD; ``block`` ms: wait that long for one when there is none yet
        (0: forever); [] when none came."""
        return _drive(self._read_core(after, block, count), self._do)

    def events(self, after: str = "0", block: int = 1000, idle_timeout: Optional[float] = None) -> Iterator[ReplyEvent]:
        """Every event after ``after`` as it comes, the end (or error) event
        last (a type this version does not know is skipped): what an SSE
        endpoint sends, ``after`` being the client's ``Last-Event-ID``.
        Raises :class:`ReplyStreamGap` when events after ``after`` were
        lost: trimmed (``maxlen``) before it came (checked once, with its
        first events), ``after`` no longer in the stream (``XREVRANGE``;
        recreated or expired), a chunk out of sequence (``n``), or an end
        counting more chunks than the reader got (docs/STREAMS.md); and :class:`ReplyStreamTimeout` when nothing
        came for ``idle_timeout`` seconds (default: ``ttl``, after which a
        stream without writes is gone)."""
        idle = self._idle(idle_timeout)
        deadline = time.monotonic() + idle
        checked = False
        start = valid_event_id(after)
        expected = _drive(self._resume_core(start), self._do)
        while True:
            got = self.read(after, block=max(1, min(block, int(idle * 1000))))
            if got and not checked:
                _drive(self._gap_core(after), self._do)
                checked = True
            if not got:
                if time.monotonic() >= deadline:
                    raise ReplyStreamTimeout(f"no event of reply {self.reply_id} for {idle:g} s")
                continue
            deadline = time.monotonic() + idle
            for event in got:
                if event.type not in _KNOWN:
                    continue  # a later version's event: skipped (docs/STREAMS.md)
                expected = self._track(event, expected, start)
                yield event
                if event.last:
                    return
            after = got[-1].id

    def chunks(self, after: str = "0", block: int = 1000, idle_timeout: Optional[float] = None) -> Iterator[str]:
        """The chunks' texts after ``after`` until the end event;
        :class:`ReplyStreamError` on an error event."""
        for event in self.events(after, block, idle_timeout):
            if event.type == ERROR:
                raise ReplyStreamError(event.text)
            if event.type == CHUNK:
                yield event.text

    def ttl_left(self) -> int:
        """TTL of the stream key in seconds (-2: gone)."""
        return int(self.redis.ttl(self.stream_key))


class AsyncReplyStream(_Core):
    """:class:`ReplyStream` for asyncio, over a ``redis.asyncio.Redis``:
    the same methods, coroutines; :meth:`events` and :meth:`chunks` are
    async iterators."""

    def __init__(
        self,
        client: Union["redis.asyncio.Redis", AsyncRedisMemClient],
        key: Union[str, bytes],
        reply_id: Optional[str] = None,
        *,
        ttl: int = DEFAULT_TTL,
        maxlen: int = DEFAULT_MAXLEN,
        approximate: bool = True,
        store: bool = True,
        append_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(key, reply_id, ttl, maxlen, approximate, store, append_options)
        self.mem = client if isinstance(client, AsyncRedisMemClient) else AsyncRedisMemClient(client)
        self.redis = self.mem.redis

    async def _do(self, op: Op) -> Any:
        kind = op[0]
        if kind == "xadd":
            _, key, fields, maxlen, approx, ttl = op
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(key, fields, maxlen=maxlen, approximate=approx)
            pipe.expire(key, ttl)
            return (await pipe.execute())[0]
        if kind == "last":
            return await self.redis.xrevrange(op[1], count=1)
        if kind == "before":
            return await self.redis.xrevrange(op[1], max=op[2], count=op[3])
        if kind == "config":
            try:
                got = await self.redis.config_get(op[1])
            except redis.ResponseError:
                return None
            return next(iter(got.values()), None) if got else None
        if kind == "xadd_at":
            _, key, fields, nid, maxlen, approx, ttl = op
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(key, fields, id=nid, maxlen=maxlen, approximate=approx)
            pipe.expire(key, ttl)
            res = await pipe.execute(raise_on_error=False)
            return _taken(res[0])
        if kind == "append":
            _, key, text, msgid, meta, options = op
            return await self.mem.append(key, "assistant", text, meta=meta, msgid=msgid, **options)
        if kind == "read":
            _, key, after, block, count = op
            return await self.redis.xread({key: after}, count=count, block=block)
        if kind == "info":
            try:
                return await self.redis.xinfo_stream(op[1])
            except redis.ResponseError as err:
                if "no such key" in str(err).lower():  # expired meanwhile
                    return None
                raise
        raise AssertionError(kind)

    async def write(self, chunk: str) -> str:
        """Appends a chunk (see :meth:`ReplyStream.write`)."""
        return await _adrive(self._write_core(chunk), self._do)

    async def finish(self, meta: Optional[Mapping[str, Any]] = None, text: Optional[str] = None) -> ReplyEvent:
        """Ends the reply and stores it once (see :meth:`ReplyStream.finish`)."""
        return await _adrive(self._finish_core(meta, text), self._do)

    async def error(self, message: str) -> ReplyEvent:
        """Ends the reply with an error event (see :meth:`ReplyStream.error`)."""
        return await _adrive(self._error_core(message), self._do)

    abort = error

    async def read(self, after: str = "0", block: Optional[int] = None,
                   count: Optional[int] = None) -> List[ReplyEvent]:
        """The events after ``after`` (see :meth:`ReplyStream.read`)."""
        return await _adrive(self._read_core(after, block, count), self._do)

    async def events(self, after: str = "0", block: int = 1000,
                     idle_timeout: Optional[float] = None) -> AsyncIterator[ReplyEvent]:
        """Every event after ``after`` as it comes (see :meth:`ReplyStream.events`)."""
        idle = self._idle(idle_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + idle
        checked = False
        start = valid_event_id(after)
        expected = await _adrive(self._resume_core(start), self._do)
        while True:
            got = await self.read(after, block=max(1, min(block, int(idle * 1000))))
            if got and not checked:
                await _adrive(self._gap_core(after), self._do)
                checked = True
            if not got:
                if loop.time() >= deadline:
                    raise ReplyStreamTimeout(f"no event of reply {self.reply_id} for {idle:g} s")
                continue
            deadline = loop.time() + idle
            for event in got:
                if event.type not in _KNOWN:
                    continue
                expected = self._track(event, expected, start)
                yield event
                if event.last:
                    return
            after = got[-1].id

    async def chunks(self, after: str = "0", block: int = 1000,
                     idle_timeout: Optional[float] = None) -> AsyncIterator[str]:
        """The chunks' texts until the end event (see :meth:`ReplyStream.chunks`)."""
        async for event in self.events(after, block, idle_timeout):
            if event.type == ERROR:
                raise ReplyStreamError(event.text)
            if event.type == CHUNK:
                yield event.text

    async def ttl_left(self) -> int:
        """TTL of the stream key in seconds (-2: gone)."""
        return int(await self.redis.ttl(self.stream_key))
