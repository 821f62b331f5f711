"""The MEM.* commands as (arguments, reply parser) pairs.

One definition per command, shared by :class:`redis_mem.RedisMemClient`
(redis-py) and :class:`redis_mem.AsyncRedisMemClient` (redis.asyncio), so
the two send byte-for-byte the same commands.
"""

from __future__ import annotations

import json
import unicodedata
import uuid
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, TypeVar, Union

from ._replies import (
    AppendResult,
    Message,
    ModelInfo,
    SessionInfo,
    SummarizeBegin,
    SummarizeCheck,
    _meta_arg,
    _text,
    _to_map,
)

T = TypeVar("T")
#: A command: its arguments and the parser of its reply.
Command = Tuple[List[Any], Callable[[Any], T]]
Key = Union[str, bytes]
Opt = Optional[int]
Meta = Union[None, str, bytes, Mapping[str, Any]]

#: The module's longest MSGID, in bytes.
MAX_MSGID_BYTES = 128


def is_name_breaker(ch: str) -> bool:
    """A character the module refuses in a name (role, msgid, model, ...):
    a control character (C0, DEL, C1) or a line / paragraph separator."""
    return unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029"


def _opt(name: str, value: Any) -> List[Any]:
    return [] if value is None else [name, value]


def _ok(reply: Any) -> bool:
    return reply is True or _text(reply) == "OK"


def new_msgid() -> str:
    """A fresh MSGID (32 hex digits)."""
    return uuid.uuid4().hex


def _settings(model: Optional[str], ttl: Opt, maxtokens: Opt, maxmsgs: Opt, maxage: Opt) -> List[Any]:
    return (
        _opt("MODEL", model)
        + _opt("TTL", ttl)
        + _opt("MAXTOKENS", maxtokens)
        + _opt("MAXMSGS", maxmsgs)
        + _opt("MAXAGE", maxage)
    )


def append(key: Key, role: str, content: str, ts: Opt, meta: Meta, model: Optional[str], ttl: Opt,
           maxtokens: Opt, maxmsgs: Opt, maxage: Opt, msgid: Optional[str], tokens: Opt) -> Command[AppendResult]:
    args = ["MEM.APPEND", key, role, content]
    args += _opt("TS", ts) + _opt("META", _meta_arg(meta))
    args += _settings(model, ttl, maxtokens, maxmsgs, maxage)
    args += _opt("MSGID", msgid) + _opt("TOKENS", tokens)
    return args, lambda r: AppendResult.from_reply(r, msgid)


def batch_items(messages: Iterable[Mapping[str, Any]], auto_msgid: bool) -> List[Dict[str, Any]]:
    items = []
    for m in messages:
        item: Dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if m.get("ts") is not None:
            item["ts"] = m["ts"]
        meta = m.get("meta")
        if meta is not None:
            if isinstance(meta, (str, bytes)):
                # Goes in as written, as append's META does (parsed and
                # written again, 1.0000000000000001 became 1.0 and 1E2 100.0).
                text = meta.decode() if isinstance(meta, bytes) else meta
                json.loads(text, parse_constant=_no_constant)  # a ValueError here, not a refused batch
                item["meta"] = RawJson(text)
            else:
                item["meta"] = meta
        if m.get("tokens") is not None:  # the provider's count (TOKENS): stored instead of counting
            item["tokens"] = int(m["tokens"])
        msgid = m.get("msgid") or (new_msgid() if auto_msgid else None)
        if msgid is not None:
            item["msgid"] = msgid
        items.append(item)
    return items


def _no_constant(name: str) -> Any:
    """NaN and Infinity, which Python's json reads and JSON has not."""
    raise ValueError(f"META is not JSON: {name}")


class RawJson(str):
    """A JSON text a batch item carries as written (a META given as text)."""


def _item_json(item: Mapping[str, Any]) -> str:
    meta = item.get("meta")
    if not isinstance(meta, RawJson):
        return json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    body = json.dumps({k: v for k, v in item.items() if k != "meta"}, ensure_ascii=False, separators=(",", ":"))
    return body[:-1] + ',"meta":' + meta + "}"


def append_batch(key: Key, items: List[Dict[str, Any]], model: Optional[str], ttl: Opt, maxtokens: Opt,
                 maxmsgs: Opt, maxage: Opt) -> Command[List[AppendResult]]:
    args = ["MEM.APPENDBATCH", key, "[" + ",".join(_item_json(i) for i in items) + "]"]
    args += _settings(model, ttl, maxtokens, maxmsgs, maxage)
    return args, lambda r: [AppendResult.from_reply(x, i.get("msgid")) for x, i in zip(r, items)]


def get(key: Key, last: Opt, after: Opt, budget: Opt) -> Command[List[Message]]:
    args = ["MEM.GET", key] + _opt("LAST", last) + _opt("AFTER", after) + _opt("BUDGET", budget)
    return args, Message.list_from_reply


def get_json(key: Key, last: Opt, after: Opt, budget: Opt) -> Command[Dict[str, Any]]:
    args = get(key, last, after, budget)[0] + ["FORMAT", "JSON"]
    return args, lambda r: json.loads(_text(r))


def get_json_text(key: Key, last: Opt, after: Opt, budget: Opt) -> Command[str]:
    args = get(key, last, after, budget)[0] + ["FORMAT", "JSON"]
    return args, lambda r: str(_text(r))


def _check_args(name: str, key: Key, extra: List[Any], model: Optional[str], context: Opt, keep: Opt) -> List[Any]:
    return [name, key, *extra] + _opt("MODEL", model) + _opt("CONTEXT", context) + _opt("KEEP", keep)


def summarize_check(key: Key, model: Optional[str], context: Opt, keep: Opt) -> Command[SummarizeCheck]:
    return _check_args("MEM.SUMMARIZE_CHECK", key, [], model, context, keep), SummarizeCheck.from_reply


def summarize_begin(key: Key, lease_ms: int, model: Optional[str], context: Opt,
                    keep: Opt) -> Command[SummarizeBegin]:
    return _check_args("MEM.SUMMARIZE_BEGIN", key, [lease_ms], model, context, keep), SummarizeBegin.from_reply


def summarize(key: Key, upto: int, text: str, lease: Opt) -> Command[AppendResult]:
    return ["MEM.SUMMARIZE", key, upto, text] + _opt("LEASE", lease or None), AppendResult.from_reply


def extset(key: Key, system: str, conversation_id: str, ex: Opt) -> Command[bool]:
    return ["MEM.EXTSET", key, system, conversation_id] + _opt("EX", ex), _ok


def extget(key: Key, system: str) -> Command[Optional[str]]:
    return ["MEM.EXTGET", key, system], _text


def import_json(key: Key, doc: Union[str, bytes, Mapping[str, Any]], replace: bool, model: Optional[str],
                ttl: Opt) -> Command[AppendResult]:
    if not isinstance(doc, (str, bytes)):
        doc = json.dumps(doc, ensure_ascii=False)
    args = ["MEM.IMPORT", key, doc] + (["REPLACE"] if replace else []) + _opt("MODEL", model) + _opt("TTL", ttl)
    return args, AppendResult.from_reply


def attrset(key: Key, name: str, value: Any, raw: bool, ex: Opt = None) -> Command[bool]:
    text = value if raw else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return ["MEM.ATTRSET", key, name, text] + _opt("EX", ex), _ok


def attrget(key: Key, name: Optional[str], raw: bool) -> Command[Any]:
    decode = _text if raw else (lambda v: json.loads(_text(v)))
    if name is not None:
        return ["MEM.ATTRGET", key, name], lambda r: None if r is None else decode(r)
    return ["MEM.ATTRGET", key], lambda r: {k: decode(v) for k, v in _to_map(r).items()}


def attrdel(key: Key, name: str) -> Command[bool]:
    return ["MEM.ATTRDEL", key, name], lambda r: int(r) == 1


def info(key: Key) -> Command[Optional[SessionInfo]]:
    return ["MEM.INFO", key], lambda r: None if r is None else SessionInfo.from_reply(r)


def count(model: str, text: str, role: Optional[str] = None, meta: Meta = None) -> Command[int]:
    return ["MEM.COUNT", model, text] + _opt("ROLE", role) + _opt("META", _meta_arg(meta)), int


def models(model: str) -> Command[ModelInfo]:
    return ["MEM.MODELS", model], ModelInfo.from_reply
