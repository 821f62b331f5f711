"""LangChain messages <-> redis-mem session entries, shared by the agent
middleware, the LangGraph nodes, the legacy chat history and the migration.

The role column gets the OpenAI-style role (human -> user, ai -> assistant,
tool -> tool, system -> system, function -> function, ChatMessage -> its own
role), the content column the text, and META everything else the message
carries (tool_calls, tool_call_id, name, additional_kwargs, id, ...) plus its
LangChain type, so the message comes back equal to what was added. Messages
written by other clients (no LangChain type in META) are mapped back from
their role.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, Optional, Tuple

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        messages_from_dict,
    )
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("redis_mem.messages needs langchain-core: pip install 'redis-mem[langchain]'") from e

try:  # deprecated upstream, still part of langchain-core 1.x
    from langchain_core.messages import FunctionMessage
except ImportError:  # pragma: no cover - removed in a future langchain-core
    FunctionMessage = None  # type: ignore[assignment,misc]

from ._commands import MAX_MSGID_BYTES, is_name_breaker
from ._replies import Message

__all__ = [
    "DEFAULT_SUMMARY_PREFIX",
    "MAX_MSGID_BYTES",
    "SUMMARY_SOURCE",
    "message_from_mem",
    "message_to_mem",
    "msgid_of",
    "summary_message",
]

#: Text put before the stored summary when it is given to the model
#: (LangChain's SummarizationMiddleware wording).
DEFAULT_SUMMARY_PREFIX = "Here is a summary of the conversation to date:\n\n"

#: additional_kwargs ``lc_source`` of the summary message (LangChain's own
#: SummarizationMiddleware marks its summary the same way).
SUMMARY_SOURCE = "summarization"

# META members this module owns.
_TYPE = "lc_type"
_CONTENT = "lc_content"

_ROLE_OF_TYPE = {
    "human": "user",
    "ai": "assistant",
    "tool": "tool",
    "system": "system",
    "function": "function",
}
_TYPE_OF_ROLE = {v: k for k, v in _ROLE_OF_TYPE.items()}

_CLASSES: Dict[str, type] = {
    "human": HumanMessage,
    "ai": AIMessage,
    "tool": ToolMessage,
    "system": SystemMessage,
    "chat": ChatMessage,
}
if FunctionMessage is not None:
    _CLASSES["function"] = FunctionMessage


def _empty(v: Any) -> bool:
    return v is None or v == {} or v == []


MAX_ROLE_BYTES = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(s: str) -> str:
    """Lone surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s


def lone_surrogates(s: str) -> int:
    """How many lone surrogates :func:`clean_text` replaces in ``s``."""
    return len(_SURROGATE.findall(s))


def clean_json(v: Any) -> Any:
    """``v`` with every string (keys included) through :func:`clean_text`."""
    if isinstance(v, str):
        return clean_text(v)
    if isinstance(v, dict):
        return {clean_text(str(k)): clean_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean_json(x) for x in v]
    return v


def _is_name(text: str, max_bytes: int) -> bool:
    """What the module takes as a role or msgid: 1 to ``max_bytes`` bytes
    of UTF-8, no control character (C0, DEL, C1) nor line or paragraph
    separator (U+2028, U+2029)."""
    raw = text.encode("utf-8", "surrogatepass")
    return 0 < len(raw) <= max_bytes and not any(is_name_breaker(ch) for ch in text)



def _role_of(msg: BaseMessage) -> str:
    if isinstance(msg, ChatMessage):
        # A role the module refuses (empty, long, a newline) goes to META,
        # the role column says "chat"; read back as it was.
        return msg.role if _is_name(msg.role, MAX_ROLE_BYTES) else "chat"
    t = msg.type
    if t.endswith("MessageChunk"):  # e.g. AIMessageChunk
        t = t[: -len("MessageChunk")].lower()
    return _ROLE_OF_TYPE.get(t, t)


def message_to_mem(msg: BaseMessage) -> Tuple[str, str, Dict[str, Any]]:
    """(role, content, meta dict) for MEM.APPEND."""
    try:
        data = msg.model_dump(mode="json")
    except Exception:  # an artifact pydantic cannot serialise: best effort
        data = json.loads(json.dumps(msg.model_dump(), default=str))
    meta: Dict[str, Any] = {_TYPE: msg.type}
    for k, v in data.items():
        if k in ("content", "type") or _empty(v):
            continue
        if k == "role" and isinstance(msg, ChatMessage) and _is_name(msg.role, MAX_ROLE_BYTES):
            continue  # stored in the role column
        meta[k] = v
    content = msg.content
    if not isinstance(content, str):
        # Content blocks (multimodal, Anthropic-style...): the text goes to
        # the content column (so tokens are counted on it), the blocks to META.
        meta[_CONTENT] = data.get("content")
        content = msg.text if isinstance(getattr(msg, "text", None), str) else msg.text()
    # Lone surrogates cannot be sent as UTF-8: replaced, not raised.
    return _role_of(msg), clean_text(content), clean_json(meta)


def msgid_of(msg: BaseMessage) -> Optional[str]:
    """The MSGID of a LangChain message: its ``id`` (a provider's message
    id, or one the application set), hashed when the module would refuse it
    (too long, a control character, a lone surrogate); None when it has
    none (the client then makes one up)."""
    mid = getattr(msg, "id", None)
    if not mid:
        return None
    mid = str(mid)
    try:
        mid.encode("utf-8")
    except UnicodeEncodeError:
        return "sha256:" + hashlib.sha256(mid.encode("utf-8", "surrogatepass")).hexdigest()
    if not _is_name(mid, MAX_MSGID_BYTES):
        return "sha256:" + hashlib.sha256(mid.encode("utf-8")).hexdigest()
    return mid


def summary_message(entry: Message, prefix: str = DEFAULT_SUMMARY_PREFIX) -> HumanMessage:
    """The session summary as the model is given it, the same everywhere
    (the middleware, the LangGraph nodes, the legacy chat history): a
    HumanMessage as LangChain's SummarizationMiddleware makes it (so the
    context opens with a user turn), marked ``lc_source="summarization"``."""
    return HumanMessage(
        content=f"{prefix}{entry.content}",
        id=f"redis-mem-summary-{entry.id}",
        additional_kwargs={"lc_source": SUMMARY_SOURCE, "redis_mem": {"summary_upto": entry.id,
                                                                     "tokens": entry.tokens}},
    )


def message_from_mem(m: Message) -> BaseMessage:
    """A stored MEM.GET entry back as a LangChain message."""
    meta = dict(m.meta or {})
    lc_type = meta.pop(_TYPE, None)
    content = meta.pop(_CONTENT, m.content)
    if lc_type is None:
        lc_type = _TYPE_OF_ROLE.get(m.role, "chat")
    cls = _CLASSES.get(lc_type)
    if cls is None:  # chunks and other types langchain knows by name
        try:
            return messages_from_dict([{"type": lc_type, "data": {"content": content, **meta}}])[0]
        except Exception:
            cls = ChatMessage
            lc_type = "chat"
    known = set(getattr(cls, "model_fields", {}))
    data: Dict[str, Any] = {"content": content}
    extra: Dict[str, Any] = {}
    for k, v in meta.items():
        (data if k in known else extra)[k] = v
    if extra:  # META members of another client: keep them visible
        data["additional_kwargs"] = {**extra, **data.get("additional_kwargs", {})}
    if cls is ChatMessage:
        data["role"] = meta.get("role", m.role)
    try:
        out: BaseMessage = cls(**data)
        return out
    except Exception:
        # e.g. a "tool" message written without tool_call_id by another client
        return ChatMessage(role=m.role, content=m.content, additional_kwargs=m.meta or {})
