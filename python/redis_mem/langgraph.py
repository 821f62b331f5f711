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

``load_context`` appends the state's messages not stored yet (one
MEM.APPENDBATCH, MSGID = message id), then replaces the state's messages by
MEM.GET BUDGET (the summary first, never a tool result without its call).
``append`` stores what is left. Both have async twins (``aload_context``,
``aappend``) for ``graph.ainvoke``. Everything else (summaries, memory
"none", Redis unreachable) is as :class:`redis_mem.middleware.RedisMemMiddleware`,
whose options SessionMemory takes.
"""

from __future__ import annotations

from typing import Any, Dict, List

from langgraph.graph import MessagesState
from typing_extensions import NotRequired

from .middleware import RedisMemMiddleware

__all__ = ["MemoryState", "SessionMemory"]


class MemoryState(MessagesState):
    """``MessagesState`` plus the ids of the messages already in the session
    (add ``redis_mem_synced: NotRequired[list[str]]`` to a state of your own)."""

    redis_mem_synced: NotRequired[List[str]]


class SessionMemory:
    """The nodes; takes the options of :class:`RedisMemMiddleware`."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.middleware = RedisMemMiddleware(*args, **kwargs)

    @property
    def stats(self) -> Dict[str, int]:
        return self.middleware.stats

    def load_context(self, state: Dict[str, Any]) -> Dict[str, Any]:
        return self.middleware.before_model(state, None) or {}

    def append(self, state: Dict[str, Any]) -> Dict[str, Any]:
        return self.middleware.after_agent(state, None) or {}

    async def aload_context(self, state: Dict[str, Any]) -> Dict[str, Any]:
        return await self.middleware.abefore_model(state, None) or {}

    async def aappend(self, state: Dict[str, Any]) -> Dict[str, Any]:
        return await self.middleware.aafter_agent(state, None) or {}
