"""LEGACY: a LangChain ``BaseChatMessageHistory`` stored in a redis-mem session.

LangChain deprecated ``BaseChatMessageHistory`` (langchain-core 1.6.4, removal
in 2.0) in favour of agent middleware and LangGraph short-term memory: new
code should use :class:`redis_mem.middleware.RedisMemMiddleware` (agents made
with ``langchain.agents.create_agent``) or :mod:`redis_mem.langgraph` (a
``StateGraph``). This class stays for ``RunnableWithMessageHistory`` users.

    import redis
    from redis_mem.langchain import RedisMemChatMessageHistory

    history = RedisMemChatMessageHistory("mem:{alice}", redis.Redis(), model="gpt-4o")
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    history.messages                      # every message (summary first)
    history.context_for_budget(8000)      # what fits an 8k-token prompt

Each message is sent with a MSGID: its LangChain ``id`` when it has one
(hashed when longer than the module's 128 bytes), else a fresh one per
call, so a retried add_messages stores each message once. Messages are
mapped as :mod:`redis_mem.messages` describes.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import redis

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage, FunctionMessage
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("redis_mem.langchain needs langchain-core: pip install 'redis-mem[langchain]'") from e

from .client import AppendResult, Message, RedisMemClient
from .messages import (  # noqa: F401
    DEFAULT_SUMMARY_PREFIX,
    message_from_mem,
    message_to_mem,
    msgid_of,
    summary_message,
)

__all__ = [
    "FunctionMessage",
    "RedisMemChatMessageHistory",
    "message_to_mem",
    "message_from_mem",
    "msgid_of",
    "DEFAULT_SUMMARY_PREFIX",
]


class RedisMemChatMessageHistory(BaseChatMessageHistory):
    """Chat history in one redis-mem session key (legacy: see the module doc).

    ``client``: a ``redis.Redis`` (RESP2 or RESP3, decoded or not) or a
    :class:`RedisMemClient`. ``model``, ``ttl``, ``maxtokens``, ``maxmsgs`` are
    sent with every append (session settings, see MEM.APPEND); None leaves the
    session's own. ``include_summary``: whether :attr:`messages` starts with
    the session summary (a HumanMessage marked ``lc_source="summarization"``,
    as the middleware gives it). ``session_id`` / ``redis_client`` /
    ``redis_url``: the names langchain-redis users know (the key is then
    ``key_template % session_id``).
    """

    def __init__(
        self,
        key: Optional[str] = None,
        client: Union["redis.Redis", RedisMemClient, None] = None,
        *,
        session_id: Optional[str] = None,
        redis_client: Optional["redis.Redis"] = None,
        redis_url: Optional[str] = None,
        key_template: str = "mem:{%s}",
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        include_summary: bool = True,
        summary_prefix: str = DEFAULT_SUMMARY_PREFIX,
    ) -> None:
        if key is None:
            if session_id is None:
                raise ValueError("give the session key, or session_id=... (key mem:{<session_id>})")
            key = key_template % session_id
        if client is None:
            client = redis_client
        if client is None:
            if redis_url is None:
                raise ValueError("give client=redis.Redis(...), redis_client=... or redis_url=...")
            client = redis.Redis.from_url(redis_url)
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

    def summary_message(self, entry: Message) -> BaseMessage:
        """The session summary as a message: the same HumanMessage the agent
        middleware gives the model (:func:`redis_mem.messages.summary_message`)."""
        return summary_message(entry, self.summary_prefix)

    def _convert(self, entries: List[Message], with_summary: bool) -> List[BaseMessage]:
        out: List[BaseMessage] = []
        for e in entries:
            if e.is_summary:
                if with_summary:
                    out.append(self.summary_message(e))
                continue
            out.append(message_from_mem(e))
        return out

    @property
    def messages(self) -> List[BaseMessage]:  # type: ignore[override]
        """Every message of the session, oldest first (the summary first when ``include_summary``)."""
        return self._convert(self.mem.get(self.key), self.include_summary)

    def context_for_budget(self, tokens: int) -> List[BaseMessage]:
        """The messages to send a model with a prompt budget of ``tokens``:
        the summary (first) and the newest messages that
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
        """Deletes the session key."""
        self.mem.redis.delete(self.key)
