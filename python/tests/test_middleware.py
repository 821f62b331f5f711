"""RedisMemMiddleware in a real `create_agent` loop: a scripted chat model that
emits tool calls, a real tool, a real redis-server with the module. No
checkpointer: the session is the agent's memory."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from fakes import ScriptedModel, calculator_script
from redis_mem import RedisMemClient
from redis_mem.middleware import RedisMemMiddleware, RedisMemUnavailable


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def cfg(thread="alice"):
    return {"configurable": {"thread_id": thread}}


def agent_with(mw, script=calculator_script):
    model = ScriptedModel(respond=script, prompts=[])
    return create_agent(model, [add], middleware=[mw], system_prompt="You are terse."), model


def stored(r, key="mem:{alice}"):
    return RedisMemClient(r).get(key)


def calls(r, command):
    stats = r.info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


def test_the_session_is_the_memory_across_invocations(r):
    agent, model = agent_with(RedisMemMiddleware(r, budget=4000))
    agent.invoke({"messages": [HumanMessage("My name is Alice.")]}, cfg())
    out = agent.invoke({"messages": [HumanMessage("What is my name?")]}, cfg())
    # The second model call saw the first exchange, read back from Redis.
    prompt = [m.content for m in model.prompts[-1]]
    assert prompt == ["You are terse.", "My name is Alice.", "You said: My name is Alice.", "What is my name?"]
    assert out["messages"][-1].content == "You said: What is my name?"
    entries = stored(r)
    assert [(e.role, e.content) for e in entries] == [
        ("user", "My name is Alice."), ("assistant", "You said: My name is Alice."),
        ("user", "What is my name?"), ("assistant", "You said: What is my name?"),
    ]
    # Each message's id is its MSGID.
    assert all(e.msgid and e.msgid == e.meta["id"] for e in entries)
    # Another thread is another session.
    agent.invoke({"messages": [HumanMessage("hi")]}, cfg("bob"))
    assert [e.content for e in stored(r, "mem:{bob}")] == ["hi", "You said: hi"]


def test_a_tool_call_and_its_result_go_in_one_batch_and_no_multi(r):
    agent, model = agent_with(RedisMemMiddleware(r))
    r.config_resetstat()
    out = agent.invoke({"messages": [HumanMessage("add 2 3")]}, cfg())
    assert out["messages"][-1].content == "The sum is 5."
    entries = stored(r)
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert entries[1].meta["tool_calls"][0]["id"] == entries[2].meta["tool_call_id"]
    # Step by step: the input, then the call with its result, then the answer:
    # three atomic batches, no single appends, no MULTI.
    assert calls(r, "mem.appendbatch") == 3
    assert calls(r, "mem.append") == 0 and calls(r, "multi") == 0


def test_the_budget_never_gives_a_tool_result_without_its_call(r):
    mw = RedisMemMiddleware(r, budget=4000)
    agent, model = agent_with(mw)
    for a in range(4):
        agent.invoke({"messages": [HumanMessage(f"add {a} 10")]}, cfg())
    full = stored(r)
    # A budget that fits the newest answer and the tool result before it, not
    # the call: the tool result must not be sent alone.
    tail = full[-2:]
    mw.budget = sum(e.tokens for e in tail) + 1
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    for prompt in model.prompts:
        body = prompt[1:]  # after the system prompt
        assert body and not isinstance(body[0], ToolMessage), body
        for i, m in enumerate(body):
            if isinstance(m, ToolMessage):
                assert any(isinstance(p, AIMessage) and any(c["id"] == m.tool_call_id for c in p.tool_calls)
                           for p in body[:i]), f"tool result without its call: {body}"


def test_a_retried_step_stores_nothing_twice(r):
    mw = RedisMemMiddleware(r)
    agent, model = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("add 1 1", id="turn-1")]}, cfg())
    before = [(e.id, e.msgid) for e in stored(r)]
    assert len(before) == 4
    # The same steps run again with the same state (a graph retry after a
    # crash that lost the checkpoint): the same message ids, so MSGID makes
    # the module keep one copy of each.
    state = {"messages": model.prompts[-1][1:] + [AIMessage("The sum is 2.", id=before[-1][1])]}
    for retry in (mw, RedisMemMiddleware(r)):  # the same process, a new one
        RunnableLambda(lambda s: retry.load_state(s)).invoke(state, cfg())
        RunnableLambda(lambda s: retry.after_agent(s, None)).invoke(state, cfg())
        assert [(e.id, e.msgid) for e in stored(r)] == before
    # Sent again without the knowledge of what is stored: MSGID dedupes.
    blind = RedisMemMiddleware(r)
    blind._mark("mem:{alice}", [])
    RunnableLambda(lambda s: blind.after_agent(s, None)).invoke(state, cfg())
    assert [(e.id, e.msgid) for e in stored(r)] == before
    assert blind.stats["duplicates"] == 4
    # A client resending the turn: its message is not stored twice either.
    agent.invoke({"messages": [HumanMessage("add 1 1", id="turn-1")]}, cfg())
    assert [e.msgid for e in stored(r)].count("turn-1") == 1


def test_summarize_at_limit_inline_under_a_lease(r):
    summaries = []

    def summarizer(messages):
        summaries.append(messages)
        return AIMessage("SUMMARY: Alice asked several questions.")

    mw = RedisMemMiddleware(r, maxmsgs=10, keep=2, summary_model=ScriptedModel(respond=summarizer, prompts=[]))
    agent, model = agent_with(mw)
    for i in range(6):
        agent.invoke({"messages": [HumanMessage(f"question {i}")]}, cfg())
    entries = stored(r)
    assert entries[0].is_summary and entries[0].content == "SUMMARY: Alice asked several questions."
    assert mw.stats["summaries"] >= 1 and summaries
    # The summarizer was given the messages it folds in; the lease ended.
    assert "question 0" in summaries[0][-1].content
    # The model sees the summary first (LangChain's wording), then the newest messages.
    agent.invoke({"messages": [HumanMessage("and now?")]}, cfg())
    first = model.prompts[-1][1]
    assert isinstance(first, HumanMessage) and first.content.startswith("Here is a summary of the conversation")
    assert first.additional_kwargs["lc_source"] == "summarization"
    # The summary message itself is never appended to the session.
    assert sum(e.is_summary for e in stored(r)) == 1
    assert not any("Here is a summary" in e.content for e in stored(r))


def test_with_summary_service_the_summary_is_left_to_the_service(r):
    mw = RedisMemMiddleware(r, maxmsgs=10, keep=2, summary_service=True)
    agent, _ = agent_with(mw)
    for i in range(6):
        agent.invoke({"messages": [HumanMessage(f"question {i}")]}, cfg())
    assert not stored(r)[0].is_summary
    assert RedisMemClient(r).summarize_check("mem:{alice}", keep=2).summarize


def test_memory_none_keeps_nothing(r):
    agent, model = agent_with(RedisMemMiddleware(r, memory="none"))
    agent.invoke({"messages": [HumanMessage("My name is Alice.")]}, cfg())
    agent.invoke({"messages": [HumanMessage("What is my name?")]}, cfg())
    assert [m.content for m in model.prompts[-1]] == ["You are terse.", "What is my name?"]
    assert r.exists("mem:{alice}") == 0


def test_two_agents_on_one_thread_share_the_session(r):
    a, model_a = agent_with(RedisMemMiddleware(r, maxmsgs=100))
    b, model_b = agent_with(RedisMemMiddleware(redis.Redis(port=r.connection_pool.connection_kwargs["port"]), maxmsgs=100))
    a.invoke({"messages": [HumanMessage("add 2 2")]}, cfg())
    b.invoke({"messages": [HumanMessage("What did I ask?")]}, cfg())
    assert [m.content for m in model_b.prompts[-1][1:4]] == ["add 2 2", "", "4"]
    # Both at once, many turns: every message either agent produced lands
    # exactly once, each tool call right before its result (batches are
    # atomic), ids in order. (Each model sees the shared session, so it may
    # answer the other agent's question: that is what one thread means.)
    errors, seen = [], set()

    def talk(agent, n):
        try:
            for i in range(n):
                out = agent.invoke({"messages": [HumanMessage(f"add {i} {n}")]}, cfg())
                seen.update(m.id for m in out["messages"])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(x, n)) for x, n in ((a, 5), (b, 6))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    entries = stored(r)
    msgids = [e.msgid for e in entries]
    assert len(set(msgids)) == len(msgids) and set(msgids) == seen | set(msgids[:6])
    assert sorted(e.content for e in entries if e.role == "user") == sorted(
        ["add 2 2", "What did I ask?"] + [f"add {i} {n}" for n in (5, 6) for i in range(n)])
    for i, e in enumerate(entries):
        if e.role == "tool":
            call = entries[i - 1]
            assert call.role == "assistant" and call.meta["tool_calls"][0]["id"] == e.meta["tool_call_id"]


def test_redis_stopped_and_started_mid_conversation(own_server):
    srv = own_server()
    # No client-side retries: each step finds out at once that Redis is down.
    r = srv.client(socket_timeout=2, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    mw = RedisMemMiddleware(r, budget=4000, retry_interval=0)
    agent, model = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("My name is Alice.")]}, cfg())
    srv.stop()
    with pytest.warns(RuntimeWarning, match="REDIS UNREACHABLE"):
        out = agent.invoke({"messages": [HumanMessage("add 1 2")]}, cfg())
    # The agent kept working on process-local memory, context included.
    assert out["messages"][-1].content == "The sum is 3."
    assert "My name is Alice." in [m.content for m in model.prompts[-1]]
    assert mw.degraded == {"mem:{alice}"}
    srv.start_again()  # an empty server: --save ''
    agent.invoke({"messages": [HumanMessage("Still there?")]}, cfg())
    assert not mw.degraded
    # Every turn the local memory held is written first, in order: those said
    # while Redis was down and those before it, which the restarted server
    # (no persistence) lost (issue 19 finding 6).
    contents = [e.content for e in stored(r)]
    assert contents[:6] == ["My name is Alice.", "You said: My name is Alice.",
                            "add 1 2", "", "3", "The sum is 3."], contents
    assert mw.stats["resent"] == 6
    assert contents[-2:] == ["Still there?", "You said: Still there?"]


def test_while_redis_is_down_it_is_tried_again_only_every_retry_interval(own_server):
    srv = own_server()
    r = srv.client(socket_timeout=2, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    mw = RedisMemMiddleware(r, retry_interval=3600)
    agent, _ = agent_with(mw)
    srv.stop()
    with pytest.warns(RuntimeWarning):
        agent.invoke({"messages": [HumanMessage("one")]}, cfg())
    failures = mw.stats["local"]
    srv.start_again()
    for text in ("two", "three"):
        agent.invoke({"messages": [HumanMessage(text)]}, cfg())
    # Redis was not asked again within the interval: still local, nothing written.
    assert mw.stats["local"] == failures and mw.degraded
    assert r.exists("mem:{alice}") == 0


def test_local_memory_is_bounded(own_server):
    srv = own_server()
    r = srv.client(socket_timeout=2, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    mw = RedisMemMiddleware(r, retry_interval=3600, local_sessions=2)
    agent, _ = agent_with(mw)
    srv.stop()
    with pytest.warns(RuntimeWarning):
        for thread in ("t1", "t2", "t3"):
            agent.invoke({"messages": [HumanMessage("hi")]}, cfg(thread))
    assert list(mw.local.context) == ["mem:{t2}", "mem:{t3}"]
    assert set(mw.local.pending) == {"mem:{t2}", "mem:{t3}"}


def test_redis_down_fails_when_so_configured(own_server):
    srv = own_server()
    r = srv.client(socket_timeout=2, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    agent, _ = agent_with(RedisMemMiddleware(r, on_unavailable="fail"))
    srv.stop()
    with pytest.raises(RedisMemUnavailable):
        agent.invoke({"messages": [HumanMessage("hi")]}, cfg())


def test_a_thread_id_is_required(r):
    agent, _ = agent_with(RedisMemMiddleware(r))
    with pytest.raises(ValueError, match="thread_id"):
        agent.invoke({"messages": [HumanMessage("hi")]})


def test_async_hooks_with_redis_asyncio(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            agent, model = agent_with(RedisMemMiddleware(async_client=ar, budget=4000))
            await agent.ainvoke({"messages": [HumanMessage("add 4 5")]}, cfg())
            out = await agent.ainvoke({"messages": [HumanMessage("thanks")]}, cfg())
            return out, model
        finally:
            await ar.aclose()

    out, model = asyncio.run(main())
    assert out["messages"][-1].content == "You said: thanks"
    assert [m.content for m in model.prompts[-1][1:]] == ["add 4 5", "", "9", "The sum is 9.", "thanks"]
    assert [e.role for e in stored(clean.client())] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_async_inline_summary_under_a_lease(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            summarizer = ScriptedModel(respond=lambda m: AIMessage("ASYNC SUMMARY"), prompts=[])
            mw = RedisMemMiddleware(async_client=ar, maxmsgs=10, keep=2, summary_model=summarizer)
            agent, _ = agent_with(mw)
            for i in range(6):
                await agent.ainvoke({"messages": [HumanMessage(f"question {i}")]}, cfg())
            return mw
        finally:
            await ar.aclose()

    mw = asyncio.run(main())
    entries = stored(clean.client())
    assert entries[0].is_summary and entries[0].content == "ASYNC SUMMARY"
    assert mw.stats["summaries"] >= 1


def test_async_hooks_with_a_sync_client_run_in_a_thread(r):
    agent, model = agent_with(RedisMemMiddleware(r))
    asyncio.run(agent.ainvoke({"messages": [HumanMessage("add 1 1")]}, cfg()))
    assert [e.content for e in stored(r)] == ["add 1 1", "", "2", "The sum is 2."]
