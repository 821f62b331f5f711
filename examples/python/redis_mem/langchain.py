"""LangChain chat history stored in a redis-mem session.

    import redis
    from redis_mem.langchain import RedisMemChatMessageHistory

    history = RedisMemChatMessageHistory("mem:{alice}", redis.Redis(), model="gpt-4o")
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    history.messages                      # every message (summary first)
    history.context_for_budget(8000)      # what fits an 8k-token prompt

Each message is sent with a MSGID: its LangChain ``id`` when it has one
(hashed when longer than the module's 128 bytes), else a fresh one per
call, so a retried add_messages (redis-py's ``retry_on_timeout``, or the
application sending the same messages again) stores each message once.

Each LangChain message becomes one MEM.APPEND. The role column gets the
OpenAI-style role (human -> user, ai -> assistant, tool -> tool, system ->
system, function -> function, ChatMessage -> its own role), the content column
the text, and META everything else the message carries (tool_calls,
tool_call_id, name, additional_kwargs, id, ...) plus its LangChain type, so the
message comes back equal to what was added. Messages written by other clients
(no LangChain type in META) are mapped back from their role.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Sequence, Union

import redis
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
)

try:  # deprecated upstream, still part of langchain-core 1.x
    from langchain_core.messages import FunctionMessage
except ImportError:  # pragma: no cover - removed in a future langchain-core
    FunctionMessage = None  # type: ignore[assignment,misc]

from .client import SUMMARY_ROLE, AppendResult, Message, RedisMemClient, _meta_arg

__all__ = [
    "RedisMemChatMessageHistory",
    "message_to_mem",
    "message_from_mem",
    "msgid_of",
    "DEFAULT_SUMMARY_PREFIX",
]

#: Text put before the stored summary when it is turned into a SystemMessage.
DEFAULT_SUMMARY_PREFIX = "Summary of the earlier conversation:\n"

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


def _role_of(msg: BaseMessage) -> str:
    if isinstance(msg, ChatMessage):
        return msg.role
    t = msg.type
    if t.endswith("MessageChunk"):  # e.g. AIMessageChunk
        t = t[: -len("MessageChunk")].lower()
    return _ROLE_OF_TYPE.get(t, t)


def message_to_mem(msg: BaseMessage) -> tuple:
    """(role, content, meta dict) for MEM.APPEND."""
    try:
        data = msg.model_dump(mode="json")
    except Exception:  # an artifact pydantic cannot serialise: best effort
        data = json.loads(json.dumps(msg.model_dump(), default=str))
    meta: Dict[str, Any] = {_TYPE: msg.type}
    for k, v in data.items():
        if k in ("content", "type") or _empty(v):
            continue
        if k == "role" and isinstance(msg, ChatMessage):
            continue  # stored in the role column
        meta[k] = v
    content = msg.content
    if not isinstance(content, str):
        # Content blocks (multimodal, Anthropic-style...): the text goes to
        # the content column (so tokens are counted on it), the blocks to META.
        meta[_CONTENT] = data.get("content")
        content = msg.text if isinstance(getattr(msg, "text", None), str) else msg.text()
    return _role_of(msg), content, meta


#: The module's longest MSGID, in bytes.
MAX_MSGID_BYTES = 128


def msgid_of(msg: BaseMessage) -> Optional[str]:
    """The MSGID of a LangChain message: its ``id`` (a provider's message
    id, or one the application set), hashed when too long; None when it
    has none (the client then makes one up)."""
    mid = getattr(msg, "id", None)
    if not mid:
        return None
    mid = str(mid)
    if len(mid.encode("utf-8")) > MAX_MSGID_BYTES:
        return "sha256:" + hashlib.sha256(mid.encode("utf-8")).hexdigest()
    return mid


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
    known = set(cls.model_fields)
    data: Dict[str, Any] = {"content": content}
    extra: Dict[str, Any] = {}
    for k, v in meta.items():
        (data if k in known else extra)[k] = v
    if extra:  # META members of another client: keep them visible
        data["additional_kwargs"] = {**extra, **data.get("additional_kwargs", {})}
    if cls is ChatMessage:
        data["role"] = m.role
    try:
        return cls(**data)
    except Exception:
        # e.g. a "tool" message written without tool_call_id by another client
        return ChatMessage(role=m.role, content=m.content, additional_kwargs=m.meta or {})


class RedisMemChatMessageHistory(BaseChatMessageHistory):
    """Chat history in one redis-mem session key.

    ``client``: a ``redis.Redis`` (RESP2 or RESP3, decoded or not) or a
    :class:`RedisMemClient`. ``model``, ``ttl``, ``maxtokens``, ``maxmsgs`` are
    sent with every append (session settings, see MEM.APPEND); None leaves the
    session's own. ``include_summary``: whether :attr:`messages` starts with
    the session summary as a SystemMessage.
    """

    def __init__(
        self,
        key: str,
        client: Union["redis.Redis", RedisMemClient],
        *,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        include_summary: bool = True,
        summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
    ):
        self.key = key
        self.mem = client if isinstance(client, RedisMemClient) else RedisMemClient(client)
        self.model = model
        self.ttl = ttl
        self.maxtokens = maxtokens
        self.maxmsgs = maxmsgs
        self.include_summary = include_summary
        self.summary_prefix = summary_prefix
        #: Replies of the last add_messages call (``summarize`` tells when the
        #: session met its summarization threshold).
        self.last_results: List[AppendResult] = []

    @classmethod
    def for_session(
        cls, session_id: str, client: Union["redis.Redis", RedisMemClient], **kwargs: Any
    ) -> "RedisMemChatMessageHistory":
        """History at the recommended key ``mem:{<session_id>}``."""
        return cls("mem:{%s}" % session_id, client, **kwargs)

    # -- reading -----------------------------------------------------------

    def summary_message(self, entry: Message) -> SystemMessage:
        return SystemMessage(
            content=self.summary_prefix + entry.content,
            response_metadata={"redis_mem": {"summary_upto": entry.id, "tokens": entry.tokens}},
        )

    def _convert(self, entries: List[Message], with_summary: bool) -> List[BaseMessage]:
        out: List[BaseMessage] = []
        for e in entries:
            if e.role == SUMMARY_ROLE and e is entries[0]:
                if with_summary:
                    out.append(self.summary_message(e))
                continue
            out.append(message_from_mem(e))
        return out

    @property
    def messages(self) -> List[BaseMessage]:  # type: ignore[override]
        return self._convert(self.mem.get(self.key), self.include_summary)

    def context_for_budget(self, tokens: int) -> List[BaseMessage]:
        """The messages to send a model with a prompt budget of ``tokens``:
        the summary (as a SystemMessage, first) and the newest messages that
        fit with it (MEM.GET BUDGET). The module already leaves out a tool
        result whose call did not fit (an LLM API refuses one)."""
        entries = self.mem.get(self.key, budget=tokens)
        return self._convert(entries, True)

    # -- writing -----------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Appends the messages in one MEM.APPENDBATCH: atomic and contiguous,
        so a tool call and its results are never interleaved with another
        writer's messages (and, unlike MULTI/EXEC, large ones are counted off
        the server's main thread). Each carries a MSGID (:func:`msgid_of`, or
        a fresh one), so a retried call stores nothing twice."""
        items = []
        for m in messages:
            role, content, meta = message_to_mem(m)
            items.append({"role": role, "content": content, "meta": meta, "msgid": msgid_of(m)})
        if not items:
            self.last_results = []
            return
        self.last_results = self.mem.append_batch(
            self.key, items, model=self.model, ttl=self.ttl, maxtokens=self.maxtokens, maxmsgs=self.maxmsgs
        )

    def clear(self) -> None:
        self.mem.redis.delete(self.key)
