"""redis_mem.langgraph in a plain StateGraph (load node, agent, ToolNode,
append node) against a real server, sync and async, no checkpointer."""

from __future__ import annotations

import asyncio

import redis.asyncio
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from fakes import ScriptedModel, calculator_script
from redis_mem import RedisMemClient
from redis_mem.langgraph import MemoryState, SessionMemory


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def build(memory, model, asynchronous=False):
    def agent(state):
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MemoryState)
    g.add_node("load", memory.aload_context if asynchronous else memory.load_context)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([add]))
    g.add_node("append", memory.aappend if asynchronous else memory.append)
    g.add_edge(START, "load")
    g.add_edge("load", "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "append"})
    g.add_edge("tools", "load")
    g.add_edge("append", END)
    return g.compile()


CFG = {"configurable": {"thread_id": "graph"}}


def test_state_graph_load_and_append_nodes(r):
    model = ScriptedModel(respond=calculator_script, prompts=[])
    memory = SessionMemory(r, budget=4000)
    graph = build(memory, model)
    out = graph.invoke({"messages": [HumanMessage("add 20 22")]}, CFG)
    assert out["messages"][-1].content == "The sum is 42."
    graph.invoke({"messages": [HumanMessage("thanks")]}, CFG)
    # Second run: the model saw the first one, read from the session.
    assert [m.content for m in model.prompts[-1]] == ["add 20 22", "", "42", "The sum is 42.", "thanks"]
    entries = RedisMemClient(r).get("mem:{graph}")
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert entries[1].meta["tool_calls"][0]["id"] == entries[2].meta["tool_call_id"]
    # Input, call + result, answer; input, answer: five batches.
    assert memory.stats["batches"] == 5 and memory.stats["duplicates"] == 0


def test_state_graph_budget_never_starts_with_a_tool_result(r):
    model = ScriptedModel(respond=calculator_script, prompts=[])
    memory = SessionMemory(r, budget=4000)
    graph = build(memory, model)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(f"add {i} 1")]}, CFG)
    entries = RedisMemClient(r).get("mem:{graph}")
    memory.middleware.budget = entries[-1].tokens + entries[-2].tokens + 1
    graph.invoke({"messages": [HumanMessage("again")]}, CFG)
    assert all(not isinstance(p[0], ToolMessage) for p in model.prompts)


def test_state_graph_async(clean):
    model = ScriptedModel(respond=calculator_script, prompts=[])

    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            graph = build(SessionMemory(async_client=ar), model, asynchronous=True)
            await graph.ainvoke({"messages": [HumanMessage("add 1 2")]}, CFG)
            return await graph.ainvoke({"messages": [HumanMessage("ok")]}, CFG)
        finally:
            await ar.aclose()

    out = asyncio.run(main())
    assert out["messages"][-1].content == "You said: ok"
    assert len(RedisMemClient(clean.client()).get("mem:{graph}")) == 6


def test_model_input_streams_nothing_but_what_is_new(r):
    """Class 13: the graph recipe with the context given in the model node."""
    from langgraph.graph import END, START, StateGraph

    model = ScriptedModel(respond=calculator_script, prompts=[])
    memory = SessionMemory(r, budget=4000)

    def agent(state):
        return {"messages": [model.invoke(memory.model_input(state))]}

    g = StateGraph(MemoryState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([add]))
    g.add_node("append", memory.append)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "append"})
    g.add_edge("tools", "agent")
    g.add_edge("append", END)
    graph = g.compile()
    graph.invoke({"messages": [HumanMessage("My name is Alice.")]}, CFG)
    events = list(graph.stream({"messages": [HumanMessage("add 1 2")]}, CFG, stream_mode="messages"))
    assert [m.content for m, _ in events] == ["", "3", "The sum is 3."]
    assert [m.content for m in model.prompts[-1]] == ["My name is Alice.", "You said: My name is Alice.",
                                                     "add 1 2", "", "3"]
    assert [e.content for e in RedisMemClient(r).get("mem:{graph}")] == [
        "My name is Alice.", "You said: My name is Alice.", "add 1 2", "", "3", "The sum is 3."]
