"""Readers of the LangChain stores redis-mem replaces, for redis-mem-migrate.

* langchain-community ``RedisChatMessageHistory``: one list per session,
  ``message_store:<session_id>``, each item ``json.dumps(message_to_dict(m))``
  = ``{"type": "human", "data": {<the message's fields>}}``, pushed with
  LPUSH (newest first). No timestamps.
* langchain-redis ``RedisChatMessageHistory``: one JSON document per message
  (RedisJSON; a RedisVL index ``idx:chat_history`` over them), key
  ``<key_prefix><session_id>:<ULID>`` (prefix ``chat:``), value
  ``{"type", "message_id": <ULID>, "data": {"content", "additional_kwargs",
  "type", ["tool_call_id", "status"]}, "session_id", "timestamp": <Unix
  seconds, float>}``. Read with JSON.GET where the key is RedisJSON's type,
  GET where the same document was stored as a string.

Both become MEM.IMPORT documents whose messages carry what the middleware
and :mod:`redis_mem.messages` store (role, content, META with the LangChain
type and fields, MSGID = the message id), so LangChain code reads them back
as the same messages. Needs no LangChain install.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Dict, List, Optional, Tuple

import redis

DEFAULT_LIST_PREFIX = "message_store:"
DEFAULT_LIST_PATTERN = DEFAULT_LIST_PREFIX + "*"
DEFAULT_DOC_PREFIX = "chat:"

_ROLE_OF_TYPE = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system", "function": "function"}
_MAX_MSGID = 128


@dataclass
class Unit:
    """One session to migrate: its id, its source keys, and (documents) the
    values read while grouping."""

    session: str
    keys: List[bytes]
    values: Dict[bytes, bytes] = field(default_factory=dict)
    error: str = ""
    #: The session id as the key holds it (``session`` is its text, shown;
    #: a key that is not UTF-8 keeps its own bytes in the target's name).
    sid: bytes = b""


def _msgid(mid: Any) -> Optional[str]:
    if not mid:
        return None
    text = str(mid)
    if len(text.encode("utf-8")) > _MAX_MSGID:
        return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text


def _msgids_once(items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A history that repeats a message id (the same message added twice)
    imports whole: a MSGID names one message of a session, so only the
    first keeps it (it failed the whole session). A LangChain message's own
    ``id`` is in its META as well, where LangChain reads it back from."""
    seen = set()
    for item in items:
        mid = item.get("msgid")
        if mid in seen:
            del item["msgid"]
        elif mid is not None:
            seen.add(mid)
    return items


def _empty(v: Any) -> bool:
    return v is None or v == {} or v == []


def message_item(lc_type: str, data: Dict[str, Any], ts: Optional[int] = None,
                 msgid: Any = None) -> Dict[str, Any]:
    """A LangChain message dict (``message_to_dict``'s ``type`` and ``data``)
    as a MEM.IMPORT message, mapped as redis_mem.messages maps a message."""
    if not isinstance(data, dict):
        raise ValueError("the message's data is not an object")
    content = data.get("content", "")
    meta: Dict[str, Any] = {"lc_type": lc_type}
    for k, v in data.items():
        if k in ("content", "type") or _empty(v) or (k == "role" and lc_type == "chat"):
            continue
        meta[k] = v
    if not isinstance(content, str):
        if not isinstance(content, list):
            raise ValueError("the message's content is neither text nor content blocks")
        meta["lc_content"] = content
        content = "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content
                          if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text"))
    if lc_type == "chat":
        role = data.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError("a chat message without a role")
    else:
        role = _ROLE_OF_TYPE.get(lc_type, lc_type)
    item: Dict[str, Any] = {"role": role, "content": content, "meta": meta}
    if ts is not None:
        item["ts"] = ts
    mid = _msgid(msgid if msgid is not None else data.get("id"))
    if mid:
        item["msgid"] = mid
    return item


def show(v: bytes) -> str:
    """A key's bytes as text, one to one (the report, the --state journal):
    invalid UTF-8 as ``\\xNN``, a backslash doubled, so ``b"\\xff"`` and a
    name holding a backslash, x, f, f never read the same."""
    return v.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8")


def unique_members(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """A JSON object whose member names are unique (json.loads kept the
    last of a repeated name: the document re-encoded for MEM.IMPORT lost the
    others, and the source was deleted)."""
    out: Dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"member {name!r} is given twice: which to keep is the application's call")
        out[name] = value
    return out


def load_exact(text: str) -> Any:
    """JSON as written: numbers with a fraction or exponent as Decimal (a
    float rounded them: 0.1000000000000000055511 became 0.1 in the session,
    and the source was deleted), member names unique."""
    return json.loads(text, object_pairs_hook=unique_members, parse_float=Decimal,
                      parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def dump_exact(v: Any) -> str:
    """JSON text of what :func:`load_exact` reads (and of the plain values
    the migration adds), every number as it was read: ``true`` and ``1``
    stay apart, a Decimal keeps its digits."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise ValueError(f"{v} is not JSON")
        return str(v)
    if isinstance(v, (float, str)):
        return json.dumps(v, ensure_ascii=False, allow_nan=False)
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + dump_exact(x) for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dump_exact(x) for x in v) + "]"
    raise ValueError(f"a {type(v).__name__} is not JSON")


def _decode(raw: bytes, what: str) -> Any:
    try:
        return load_exact(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
    except ValueError as e:  # a member given twice
        raise ValueError(f"{what}: {e}") from None


# -- langchain-community: message_store:<session> lists --------------------------

def find_lists(r: "redis.Redis", pattern: str = DEFAULT_LIST_PATTERN, count: int = 500,
               prefix: str = DEFAULT_LIST_PREFIX) -> List[Unit]:
    """Every list ``pattern`` matches, one session each: its id is the key
    after ``prefix`` (a key without the prefix, or with nothing after it, is
    a unit with an ``error``: never given a made-up id)."""
    p = _b(prefix)
    units, seen = [], set()
    for key in r.scan_iter(match=pattern, count=count):
        key = _b(key)
        if key in seen:
            continue
        seen.add(key)
        # Every key asked for is reported: one of another type is a
        # failure, not skipped in silence; a session of the module (moved
        # already) or a key gone since the scan is not a source.
        kind = _b(r.type(key)).decode("utf-8", "backslashreplace")
        if kind in ("redis-mem", "none"):
            continue
        if kind != "list":
            units.append(Unit("", [key], error=f"a {kind} key, not a LangChain message list: not migrated"))
            continue
        if not key.startswith(p) or len(key) == len(p):
            units.append(Unit("", [key], error=f"the key does not start with the source prefix {prefix!r} "
                                                "followed by a session id (see --source-prefix)"))
            continue
        units.append(Unit(show(key[len(p):]), [key], sid=key[len(p):]))
    return sorted(units, key=lambda u: u.keys)


#: What message_to_dict writes, and langchain-redis's documents: a member
#: beside them has no place in the session (it was dropped in silence).
_ITEM_MEMBERS = frozenset({"type", "data"})
_DOCUMENT_MEMBERS = frozenset({"type", "data", "message_id", "session_id", "timestamp"})


def _only(d: Dict[str, Any], members: "frozenset[str]", what: str) -> None:
    other = sorted(k for k in d if k not in members)
    if other:
        raise ValueError(f"{what} has {other[0]!r} beside its message: the session would not keep it")


def read_list(r: "redis.Redis", unit: Unit) -> Tuple[Dict[str, Any], Dict[bytes, Any]]:
    """(MEM.IMPORT document, snapshot of the source for an unchanged check)."""
    key = unit.keys[0]
    raw = [_b(x) for x in r.lrange(key, 0, -1)]
    items = []
    for i, value in enumerate(reversed(raw)):  # LPUSH: newest first
        d = _decode(value, f"item {len(raw) - 1 - i}")
        if not isinstance(d, dict) or not isinstance(d.get("type"), str) or not isinstance(d.get("data"), dict):
            raise ValueError(f"item {len(raw) - 1 - i} is not a message_to_dict object")
        _only(d, _ITEM_MEMBERS, f"item {len(raw) - 1 - i}")
        items.append(message_item(d["type"], d["data"]))
    return {"conversation_history": _msgids_once(items)}, {key: raw}


# -- langchain-redis: <prefix><session>:<ulid> JSON documents ----------------------

def _read_doc(r: "redis.Redis", key: bytes) -> bytes:
    kind = r.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "ReJSON-RL":
        return _b(r.execute_command("JSON.GET", key))
    if kind == "string":
        return _b(r.get(key))
    raise ValueError(f"{key!r} is a {kind}, not a langchain-redis document")


def find_documents(r: "redis.Redis", prefix: str = DEFAULT_DOC_PREFIX, count: int = 500,
                   pattern: Optional[str] = None) -> List[Unit]:
    """Every message document under ``prefix``, grouped by session (the key
    minus its prefix and ``:<ULID>``, checked against the document)."""
    groups: Dict[str, Unit] = {}
    seen = set()
    p = _b(prefix)
    match = pattern or prefix.replace("*", r"\*") + "*"
    for key in r.scan_iter(match=match, count=count):
        key = _b(key)
        if key in seen:
            continue
        seen.add(key)
        if not key.startswith(p):
            continue
        rest = key[len(p):]
        if b":" not in rest:
            continue  # not a message document (e.g. the prefix's own keys)
        session = show(rest.rsplit(b":", 1)[0])
        unit = groups.setdefault(session, Unit(session, [], sid=rest.rsplit(b":", 1)[0]))
        unit.keys.append(key)
        try:
            unit.values[key] = _read_doc(r, key)
        except (ValueError, redis.ResponseError) as e:
            unit.error = unit.error or str(e)
    return [groups[s] for s in sorted(groups)]


def read_documents(r: "redis.Redis", unit: Unit) -> Tuple[Dict[str, Any], Dict[bytes, Any]]:
    """(MEM.IMPORT document, snapshot of the source) of one langchain-redis
    session, its messages ordered by timestamp then ULID."""
    if unit.error:
        raise ValueError(unit.error)
    rows = []
    for key in unit.keys:
        d = _decode(unit.values[key], show(key))
        if isinstance(d, list) and len(d) == 1:  # JSON.GET with a $ path
            d = d[0]
        if not isinstance(d, dict) or not isinstance(d.get("type"), str) or not isinstance(d.get("data"), dict):
            raise ValueError(f"{key!r} is not a langchain-redis message document")
        _only(d, _DOCUMENT_MEMBERS, show(key))
        if d.get("session_id") != unit.session:
            raise ValueError(f"{key!r} belongs to session {d.get('session_id')!r}, not {unit.session!r}")
        ts = d.get("timestamp")
        if isinstance(ts, Decimal):  # as written (load_exact)
            ts = float(ts)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise ValueError(f"{key!r} has no numeric timestamp")
        rows.append((float(ts), str(d.get("message_id") or key), d))
    rows.sort(key=lambda x: (x[0], x[1]))  # timestamp, then ULID (time-ordered)
    # Unix seconds (langchain-redis writes time.time()), or ms when >= 10^11.
    items = [message_item(d["type"], d["data"], ts=int(round(ts * 1000 if ts < 1e11 else ts)), msgid=mid)
             for ts, mid, d in rows]
    return {"conversation_history": _msgids_once(items)}, dict(unit.values)


def new_documents(r: "redis.Redis", unit: Unit) -> List[bytes]:
    """The message documents of a langchain-redis session its unit lacks
    (written after the scan): deleting the unit's documents would leave them
    alone, and a rerun's --replace would put them in their place."""
    if not unit.keys:
        return []
    head = unit.keys[0].rsplit(b":", 1)[0] + b":"
    match = re.sub(rb"([*?\[\]\\])", rb"\\\1", head) + b"*"
    known = set(unit.keys)
    keys = (_b(k) for k in r.scan_iter(match=match, count=500))
    return [k for k in keys if k not in known and b":" not in k[len(head):]]


def unchanged(r: "redis.Redis", snapshot: Dict[bytes, Any]) -> bool:
    """Whether every source key still holds its snapshot (inside WATCH)."""
    for key, value in snapshot.items():
        if isinstance(value, list):
            if [_b(x) for x in r.lrange(key, 0, -1)] != value:
                return False
        else:
            try:
                if _read_doc(r, key) != value:
                    return False
            except (ValueError, redis.ResponseError):
                return False
    return True
