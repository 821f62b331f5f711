"""The redis-mem session inside a plain LangGraph ``StateGraph``: a node that
loads the context, a node that appends, keyed by the ``thread_id``.

    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from redis_mem.langgraph import MemoryState, SessionMemory

    memory = SessionMemory(redis.Redis(), budget=8000)

    def agent(state: MemoryState):
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MemoryState)
    g.add_node("load", memory.load_context)      # store new input, then summary + newest messages
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_node("append", memory.append)          # store what the graph added
    g.add_edge(START, "load")
    g.add_edge("load", "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "append"})
    g.add_edge("tools", "load")                  # a call and its results go in one batch
    g.add_edge("append", END)
    graph = g.compile()                          # no checkpointer needed
    graph.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "alice"}})

The load node replaces the state's messages by the context, so
``stream_mode="messages"`` shows that context as the load node's output. To
stream only what is new, give the model the context in its own node
instead (no load node, the state left as it is):

    def agent(state: MemoryState):
        return {"messages": [model.invoke(memory.model_input(state))]}

    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "append"})
    g.add_edge("tools", "agent")

``load_context`` appends the state's messages not stored yet (MEM.APPENDBATCH,
MSGID = message id), then replaces the state's messages by MEM.GET BUDGET
(the summary first, never a tool result without its call). ``append``
stores what is left. Both have async twins (``aload_context``,
``aappend``) for ``graph.ainvoke``. Everything else (content the module
refuses, memory types, Redis unreachable) is as
:class:`redis_mem.middleware.RedisMemMiddleware`, whose options SessionMemory
takes. The nodes see no model call, so the summary needs ``summary_model``
(or the summarizer service, ``summary_service=True``), and ``budget="auto"``
knows neither the graph's system prompt nor its tools: it is the window
less the reply reserve (lower ``context_window=`` to leave them room).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

try:
    import redis
    import redis.asyncio
    from langchain_core.messages import BaseMessage
    from langgraph.graph import MessagesState
    from typing_extensions import NotRequired
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("redis_mem.langgraph needs LangGraph: pip install 'redis-mem[langchain]'") from e

from .middleware import (
    DEFAULT_BUDGET,
    Budget,
    MemoryType,
    OnUnavailable,
    RedisMemMiddleware,
    default_attributes_message,
)
from .summarizing import SUMMARY_PROMPT

__all__ = ["MemoryState", "SessionMemory"]


class MemoryState(MessagesState):
    """``MessagesState`` (``redis_mem_synced`` is no longer used: the
    middleware tracks what is stored itself; kept so states naming it load)."""

    redis_mem_synced: NotRequired[List[str]]


class SessionMemory:
    """The nodes; takes the options of :class:`RedisMemMiddleware`."""

    def __init__(
        self,
        client: Optional["redis.Redis"] = None,
        *,
        redis_client: Optional["redis.Redis"] = None,
        async_client: Optional["redis.asyncio.Redis"] = None,
        url: Optional[str] = None,
        redis_url: Optional[str] = None,
        session_id: Optional[str] = None,
        memory: MemoryType = "summarize",
        budget: Budget = DEFAULT_BUDGET,
        context_window: Optional[int] = None,
        reply_reserve: Optional[int] = None,
        tokens_from_usage: Optional[bool] = None,
        key_template: str = "mem:{%s}",
        session_key: Optional[Callable[[str], str]] = None,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
        summary_model: Any = None,
        summary_service: bool = False,
        summary_prompt: str = SUMMARY_PROMPT,
        keep: Optional[int] = None,
        lease_ms: int = 15_000,
        attributes: Optional[Sequence[str]] = None,
        attributes_message: Callable[[Mapping[str, Any]], str] = default_attributes_message,
        on_unavailable: OnUnavailable = "local",
        retry_interval: float = 5.0,
        local_sessions: int = 1000,
        max_message_bytes: Optional[int] = None,
        max_message_tokens: Optional[int] = None,
    ) -> None:
        self.middleware = RedisMemMiddleware(
            client, redis_client=redis_client, async_client=async_client, url=url, redis_url=redis_url,
            session_id=session_id, memory=memory, budget=budget, context_window=context_window,
            reply_reserve=reply_reserve, tokens_from_usage=tokens_from_usage, key_template=key_template,
            session_key=session_key, model=model, ttl=ttl, maxtokens=maxtokens, maxmsgs=maxmsgs,
            maxage=maxage, summary_model=summary_model, summary_service=summary_service,
            summary_prompt=summary_prompt, keep=keep, lease_ms=lease_ms, attributes=attributes,
            attributes_message=attributes_message, on_unavailable=on_unavailable,
            retry_interval=retry_interval, local_sessions=local_sessions, max_message_bytes=max_message_bytes,
            max_message_tokens=max_message_tokens,
        )

    @property
    def stats(self) -> Dict[str, int]:
        """The middleware's counters (batches, duplicates, summaries, ...)."""
        return self.middleware.stats

    def load_context(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Node: store the new messages, replace the state's by the context."""
        return self.middleware.load_state(state)

    def append(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Node: store what the graph added."""
        return self.middleware.store_state(state)

    def model_input(self, state: Dict[str, Any]) -> List[BaseMessage]:
        """In a model node: store the new messages, return the context to
        call the model with (the state is not rewritten)."""
        return self.middleware.model_input(state)

    async def amodel_input(self, state: Dict[str, Any]) -> List[BaseMessage]:
        """Async :meth:`model_input`."""
        return await self.middleware.amodel_input(state)

    async def aload_context(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Async :meth:`load_context`."""
        return await self.middleware.aload_state(state)

    async def aappend(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Async :meth:`append`."""
        return await self.middleware.astore_state(state)
