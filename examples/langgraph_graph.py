"""A plain LangGraph StateGraph with its memory in a redis-mem session:
a `load` node (store the new input, then summary + newest messages within a
budget) and an `append` node, keyed by the thread_id.

    REDIS_URL=redis://localhost:6379/0 python examples/langgraph_graph.py
"""

import os

import redis
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph

from redis_mem.langgraph import MemoryState, SessionMemory


def reply(state: MemoryState):
    # Stands in for `model.invoke(state["messages"])`: it sees the whole context.
    humans = [m.content for m in state["messages"] if isinstance(m, HumanMessage)]
    return {"messages": [AIMessage(f"I have heard {len(humans)} message(s) from you: {humans}")]}


def build(memory: SessionMemory):
    g = StateGraph(MemoryState)
    g.add_node("load", memory.load_context)
    g.add_node("reply", reply)
    g.add_node("append", memory.append)
    g.add_edge(START, "load")
    g.add_edge("load", "reply")
    g.add_edge("reply", "append")
    g.add_edge("append", END)
    return g.compile()  # no checkpointer: the session is the memory


def main():
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    graph = build(SessionMemory(r, budget=4000))
    config = {"configurable": {"thread_id": "graph-demo"}}
    for text in ("Hello!", "Remember me?"):
        out = graph.invoke({"messages": [HumanMessage(text)]}, config)
        print(out["messages"][-1].content)


if __name__ == "__main__":
    main()
