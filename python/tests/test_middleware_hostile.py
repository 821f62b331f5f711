"""Issue 19, findings 4-8 and 12: the middleware never drops memory silently,
never replays history into streams, never raises on content the module
refuses, and re-sends what a restarted server lost. Real create_agent loops,
scripted chat models, a real server with the module."""

from __future__ import annotations

import logging
import time
from typing import Any, List, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from fakes import ScriptedModel, calculator_script
from redis_mem import RedisMemClient
from redis_mem.langgraph import MemoryState, SessionMemory
from redis_mem.middleware import TRUNCATED_MARKER, RedisMemMiddleware
from redis_mem.summarizing import SUMMARY_PROMPT

BIG = 4 * 1024 * 1024 + 1000  # over the default mem.max-message-bytes


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def fetch_page(url: str) -> str:
    """Fetches a page (a huge one)."""
    return "<html>" + "x" * BIG + "</html>"


@tool
def read_file(path: str) -> str:
    """Reads a file with a lone surrogate in it."""
    return "bytes: \ud800 end"


def cfg(thread="alice"):
    return {"configurable": {"thread_id": thread}}


def summarizing_script(messages: List[BaseMessage]) -> AIMessage:
    """The calculator, and a summary when given the summary prompt."""
    first = messages[0]
    if isinstance(first, SystemMessage) and str(first.content).startswith(SUMMARY_PROMPT[:40]):
        return AIMessage("SUMMARY: the user is Alice. " + str(messages[-1].content)[-200:])
    return calculator_script(messages)


def calls_tool(name, args):
    def script(messages):
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return AIMessage(f"got {len(str(last.content))} chars")
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{len(messages)}"}])
    return script


def stored(r, key="mem:{alice}"):
    return RedisMemClient(r).get(key)


# -- finding 4: memory is summarized by default, or a warning says it is lost ---

def test_default_memory_summarizes_with_the_agents_own_model(r):
    model = ScriptedModel(respond=summarizing_script, prompts=[])
    mw = RedisMemMiddleware(r, maxmsgs=12, keep=2)  # no summary_model, no service
    agent = create_agent(model, [add], middleware=[mw])
    agent.invoke({"messages": [HumanMessage("Hi, I'm Alice")]}, cfg())
    for i in range(6):
        agent.invoke({"messages": [HumanMessage(f"add {i} 1")]}, cfg())
    entries = stored(r)
    assert entries[0].is_summary and entries[0].content.startswith("SUMMARY: the user is Alice")
    assert mw.stats["summaries"] >= 1
    assert RedisMemClient(r).info("mem:{alice}").messages <= 12
    # The summary call used the agent's own model, and is never streamed.
    assert any(str(p[0].content).startswith(SUMMARY_PROMPT[:40]) for p in model.prompts)
    before = mw.stats["summaries"]
    events = []
    for i in range(8):
        events += list(agent.stream({"messages": [HumanMessage(f"add {i} 2")]}, cfg(), stream_mode="messages"))
    assert mw.stats["summaries"] > before
    assert not [m for m, _ in events if "SUMMARY" in str(m.content)]


def test_nothing_to_summarize_with_warns_once_per_session(r, caplog):
    memory = SessionMemory(r, maxmsgs=10, keep=2)  # plain graph nodes: no model, no service

    def agent(state):
        return {"messages": [AIMessage(f"echo {state['messages'][-1].content}")]}

    g = StateGraph(MemoryState)
    g.add_node("load", memory.load_context)
    g.add_node("agent", agent)
    g.add_node("append", memory.append)
    g.add_edge(START, "load")
    g.add_edge("load", "agent")
    g.add_edge("agent", "append")
    g.add_edge("append", END)
    graph = g.compile()
    with caplog.at_level(logging.WARNING, logger="redis_mem.middleware"):
        for i in range(12):
            graph.invoke({"messages": [HumanMessage(f"turn {i}")]}, cfg())
            graph.invoke({"messages": [HumanMessage(f"turn {i}")]}, cfg("bob"))
    lost = [rec.getMessage() for rec in caplog.records if "LOST" in rec.getMessage()]
    assert len(lost) == 2, lost  # one per session
    assert "summary_model" in lost[0] and "redis-mem-summarizer" in lost[0]
    # memory="window" is the app saying so: no warning.
    caplog.clear()
    quiet = SessionMemory(r, maxmsgs=10, memory="window", session_id="quiet")
    for i in range(12):
        quiet.append({"messages": [HumanMessage(f"w{i}", id=f"w{i}")]})
    assert RedisMemClient(r).info("mem:{quiet}").messages == 10
    assert not [rec for rec in caplog.records if "LOST" in rec.getMessage()]


def test_one_invoke_beyond_the_caps_warns_that_its_oldest_messages_are_lost_though_a_summary_follows(r, caplog):
    """Hostile pass 25, F2: 1,200 messages at once with a summarizer: the caps
    evict most before any summary covers them, and that is said."""
    mw = RedisMemMiddleware(r, model="gpt-4o", budget=8000)
    agent = create_agent(ScriptedModel(respond=summarizing_script, prompts=[]), [add], middleware=[mw])
    with caplog.at_level(logging.WARNING, logger="redis_mem.middleware"):
        agent.invoke({"messages": [HumanMessage(f"m{i}") for i in range(1200)]}, cfg("many"))
    info = RedisMemClient(r).info("mem:{many}")
    assert info is not None and info.evicted > 1000
    lost = [rec.getMessage() for rec in caplog.records if "evicted before a summary covered" in rec.getMessage()]
    assert len(lost) == 1 and f"{info.evicted} messages" in lost[0], lost


def test_a_failed_inline_summary_is_retried_by_a_later_step(r):
    attempts = []

    def flaky(messages):
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RuntimeError("provider 500")
        return AIMessage("SUMMARY after a retry")

    mw = RedisMemMiddleware(r, maxmsgs=10, keep=2, lease_ms=300,
                            summary_model=ScriptedModel(respond=flaky, prompts=[]))
    agent = create_agent(ScriptedModel(respond=calculator_script, prompts=[]), [add], middleware=[mw])
    i = 0
    while mw.stats["summary_failures"] == 0:
        agent.invoke({"messages": [HumanMessage(f"question {i}")]}, cfg())
        i += 1
    time.sleep(0.4)  # the short lease ran out
    agent.invoke({"messages": [HumanMessage("one more")]}, cfg())
    assert stored(r)[0].is_summary and stored(r)[0].content == "SUMMARY after a retry"
    assert len(attempts) == 2


# -- finding 5: streams show no stored history, no internal keys ------------------

@pytest.mark.parametrize("checkpointer", [False, True], ids=["no-checkpointer", "checkpointer"])
def test_streams_never_replay_the_stored_history(r, checkpointer):
    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], middleware=[RedisMemMiddleware(r)],
                         checkpointer=InMemorySaver() if checkpointer else None)
    agent.invoke({"messages": [HumanMessage("My name is Alice.")]}, cfg())
    events = list(agent.stream({"messages": [HumanMessage("add 2 3")]}, cfg(), stream_mode="messages"))
    contents = [m.content for m, _meta in events]
    assert not any(isinstance(m, RemoveMessage) for m, _ in events)
    assert "My name is Alice." not in contents and "You said: My name is Alice." not in contents
    assert contents[-1] == "The sum is 5."
    # The model was still given the history.
    assert "My name is Alice." in [m.content for m in model.prompts[-1]]
    for chunk in agent.stream({"messages": [HumanMessage("thanks")]}, cfg(), stream_mode="values"):
        assert set(chunk) <= {"messages", "jump_to"}, chunk.keys()
        assert not any(k.startswith("redis_mem") for k in chunk)
    updates = list(agent.stream({"messages": [HumanMessage("again")]}, cfg(), stream_mode="updates"))
    for u in updates:
        for node, upd in u.items():
            for m in (upd or {}).get("messages", []) if isinstance(upd, dict) else []:
                assert not isinstance(m, RemoveMessage) and m.content != "My name is Alice.", node


# -- finding 7: content the module refuses never raises ----------------------------

def test_a_tool_result_over_max_message_bytes_is_stored_truncated(r):
    model = ScriptedModel(respond=calls_tool("fetch_page", {"url": "http://x"}), prompts=[])
    mw = RedisMemMiddleware(r, maxtokens=10_000_000)
    agent = create_agent(model, [fetch_page], middleware=[mw])
    out = agent.invoke({"messages": [HumanMessage("fetch it")]}, cfg())
    assert out["messages"][-1].content == f"got {BIG + 13} chars"  # the model saw all of it
    tool_entry = [e for e in stored(r) if e.role == "tool"][0]
    assert len(tool_entry.content.encode()) <= 4194304
    assert tool_entry.content.endswith("over mem.max-message-bytes)]")
    assert tool_entry.meta["redis_mem_truncated"] == BIG + 13
    assert TRUNCATED_MARKER.split("{")[0] in tool_entry.content
    assert mw.stats["truncated"] == 1
    assert [e.role for e in stored(r)] == ["user", "assistant", "tool", "assistant"]


def test_a_lone_surrogate_is_escaped_not_raised_and_said(r, caplog):
    model = ScriptedModel(respond=calls_tool("read_file", {"path": "/tmp/x"}), prompts=[])
    agent = create_agent(model, [read_file], middleware=[RedisMemMiddleware(r)])
    with caplog.at_level(logging.WARNING, logger="redis_mem.middleware"):
        agent.invoke({"messages": [HumanMessage("read \udcff it")]}, cfg())
    entries = stored(r)
    assert entries[0].content == "read \ufffd it"
    assert [e.content for e in entries if e.role == "tool"] == ["bytes: \ufffd end"]
    # Hostile pass 25, F6: marked and logged, as a truncation is.
    assert [(e.meta or {}).get("redis_mem_replaced_surrogates") for e in entries] == [1, None, 1, None]
    said = [rec.getMessage() for rec in caplog.records if "lone surrogate" in rec.getMessage()]
    assert len(said) == 2, said


def test_a_first_sync_of_1201_checkpointed_messages_is_split_into_batches(r):
    history: List[BaseMessage] = []
    for i in range(600):
        history += [HumanMessage(f"q{i}", id=f"q{i}"), AIMessage(f"a{i}", id=f"a{i}")]
    history.append(HumanMessage("the 1201st", id="last"))
    model = ScriptedModel(respond=calculator_script, prompts=[])
    mw = RedisMemMiddleware(r, maxmsgs=5000, maxtokens=1_000_000)
    agent = create_agent(model, [add], middleware=[mw], checkpointer=InMemorySaver())
    out = agent.invoke({"messages": history}, cfg())
    assert out["messages"][-1].content == "You said: the 1201st"
    entries = stored(r)
    assert len(entries) == 1202 and [e.msgid for e in entries[:3]] == ["q0", "a0", "q1"]
    assert mw.stats["batches"] >= 2 and mw.stats["duplicates"] == 0


# -- finding 8: stable msgids where the framework gives none -------------------------

class PlainState(TypedDict):
    messages: list  # no add_messages reducer: messages keep id None


def test_a_retried_step_with_id_less_messages_stores_once(r):
    memory = SessionMemory(r)
    failures = []

    def store_then_crash(state):
        memory.append(state)
        if not failures:
            failures.append(1)
            raise RuntimeError("crash after the write")
        return {}

    g = StateGraph(PlainState)
    g.add_node("store", store_then_crash, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01,
                                                                     retry_on=RuntimeError))
    g.add_edge(START, "store")
    g.add_edge("store", END)
    graph = g.compile()
    graph.invoke({"messages": [HumanMessage("no id here"), AIMessage("nor here")]}, cfg())
    assert failures == [1]
    entries = stored(r)
    assert [e.content for e in entries] == ["no id here", "nor here"]
    assert all(e.msgid.startswith("lg:") for e in entries)
    # Another run, the same id-less texts: new messages (the task id differs).
    graph.invoke({"messages": [HumanMessage("no id here"), AIMessage("nor here")]}, cfg())
    assert [e.content for e in stored(r)] == ["no id here", "nor here"] * 2


def test_instructions_sent_with_every_turn_are_stored_once(r):
    # Hostile pass 25, F4: without a checkpointer an application sends its
    # system message with each turn; every id-less copy got a fresh id and
    # was stored again (30 turns: 30 copies in the model's context).
    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], middleware=[RedisMemMiddleware(r)])
    for q in ["add 2 3", "add 4 5", "add 6 7"]:
        agent.invoke({"messages": [SystemMessage("You add numbers."), HumanMessage(q)]}, cfg())
    entries = stored(r)
    assert [e.content for e in entries if e.role == "system"] == ["You add numbers."]
    assert [e.content for e in entries if e.role == "user"] == ["add 2 3", "add 4 5", "add 6 7"]
    assert sum(m.content == "You add numbers." for m in model.prompts[-1]) == 1
    # Changed instructions are a new message.
    agent.invoke({"messages": [SystemMessage("You add numbers twice."), HumanMessage("add 1 1")]}, cfg())
    assert [e.content for e in stored(r) if e.role == "system"] == ["You add numbers.", "You add numbers twice."]
    # Evicted by the caps, the instructions still lead every prompt that
    # gives them (hostile pass 27: re-sent, they are a departed msgid's
    # duplicate and not stored again).
    mw = RedisMemMiddleware(r, maxmsgs=4)
    agent = create_agent(model, [add], middleware=[mw])
    for q in ["add 1 2", "add 3 4", "add 5 6"]:
        agent.invoke({"messages": [SystemMessage("Be brief."), HumanMessage(q)]}, cfg("bob"))
    assert "Be brief." not in [e.content for e in stored(r, "mem:{bob}")]
    assert [m.content for m in model.prompts[-1]].count("Be brief.") == 1
    assert isinstance(model.prompts[-1][0], SystemMessage)


# -- finding 12: attributes reach the model --------------------------------------------

def test_attributes_are_given_to_the_model_through_the_hook(r):
    mem = RedisMemClient(r)
    mem.attrset("mem:{alice}", "user_profile", {"name": "Alice", "diet": "vegan"})
    mem.attrset("mem:{alice}", "context", {"channel": "web"})
    model = ScriptedModel(respond=calculator_script, prompts=[])
    mw = RedisMemMiddleware(r, attributes=["user_profile", "context", "missing"])
    agent = create_agent(model, [add], middleware=[mw], system_prompt="You are terse.")
    agent.invoke({"messages": [HumanMessage("hi")]}, cfg())
    system = model.prompts[-1][0]
    assert isinstance(system, SystemMessage)
    assert system.content.startswith("You are terse.")
    assert '"diet": "vegan"' in system.content and '"channel": "web"' in system.content
    custom = RedisMemMiddleware(r, attributes=["user_profile"],
                                attributes_message=lambda a: f"The user is {a['user_profile']['name']}.")
    agent = create_agent(model, [add], middleware=[custom])
    agent.invoke({"messages": [HumanMessage("hi again")]}, cfg())
    assert model.prompts[-1][0].content == "The user is Alice."


def test_the_context_does_not_open_with_an_assistant_turn(r):
    mem = RedisMemClient(r)
    mem.append("mem:{alice}", "user", "long question " * 200)
    mem.append("mem:{alice}", "assistant", "short answer")
    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], middleware=[RedisMemMiddleware(r, budget=60)])
    agent.invoke({"messages": [HumanMessage("next")]}, cfg())
    assert [m.content for m in model.prompts[-1]] == ["next"]


# -- class 13: the same memory with and without a checkpointer, HITL, async ------

def run_turns(r, thread, checkpointer=None, mw=None):
    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], middleware=[mw or RedisMemMiddleware(r)], checkpointer=checkpointer)
    for text in ("My name is Alice.", "add 2 3", "What is my name?"):
        agent.invoke({"messages": [HumanMessage(text)]}, cfg(thread))
    return model, agent


def test_the_model_sees_the_same_with_and_without_a_checkpointer(r):
    plain, _ = run_turns(r, "plain")
    saved, _ = run_turns(r, "saved", checkpointer=InMemorySaver())
    assert [[m.content for m in p] for p in plain.prompts] == [[m.content for m in p] for p in saved.prompts]
    a, b = stored(r, "mem:{plain}"), stored(r, "mem:{saved}")
    assert [(e.role, e.content) for e in a] == [(e.role, e.content) for e in b] and len(a) == 8


def test_a_new_process_on_a_checkpointed_thread_stores_nothing_twice(r):
    saver = InMemorySaver()
    run_turns(r, "alice", checkpointer=saver)
    before = [(e.id, e.msgid) for e in stored(r)]
    # A new process: a new middleware (it knows nothing), the same checkpointer.
    fresh = RedisMemMiddleware(r)
    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], middleware=[fresh], checkpointer=saver)
    agent.invoke({"messages": [HumanMessage("again")]}, cfg())
    after = stored(r)
    assert [(e.id, e.msgid) for e in after[:len(before)]] == before
    assert [e.content for e in after[len(before):]] == ["again", "You said: again"]


def _echo(messages: List[BaseMessage]) -> AIMessage:
    return AIMessage("ok " + str(messages[-1].content)[:20])


def test_a_new_process_does_not_bring_back_what_maxage_let_go(r):
    """Hostile pass 58 F1: MAXAGE emptied the session; a new process (a new
    middleware, the same checkpointer) knew only the msgids the session held
    (none), sent the whole thread again, and every message older than the 128
    departed msgids the module remembers came back, stamped now."""
    saver = InMemorySaver()
    history: List[BaseMessage] = []
    for i in range(100):
        history += [HumanMessage(f"q{i}", id=f"q{i}"), AIMessage(f"a{i}", id=f"a{i}")]
    first = RedisMemMiddleware(r, maxage=1, maxmsgs=5000, maxtokens=1_000_000)
    create_agent(ScriptedModel(respond=_echo, prompts=[]), [], middleware=[first],
                 checkpointer=saver).invoke({"messages": history}, cfg("aged"))
    assert len(stored(r, "mem:{aged}")) == 201
    for visit in (1, 2):
        time.sleep(1.2)  # everything stored is past MAXAGE
        fresh = RedisMemMiddleware(r, maxage=1, maxmsgs=5000, maxtokens=1_000_000)
        create_agent(ScriptedModel(respond=_echo, prompts=[]), [], middleware=[fresh],
                     checkpointer=saver).invoke({"messages": [HumanMessage(f"back {visit}", id=f"b{visit}")]},
                                                cfg("aged"))
        assert [e.content for e in stored(r, "mem:{aged}")] == [f"back {visit}", f"ok back {visit}"]


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointer"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_new_question_under_a_reused_id_is_stored_and_answered(clean, caplog, mode, checkpointed):
    """Hostile pass 58 F2: an app that reuses a user message's id (a constant,
    a per-page counter) lost the new question silently: this process had sent
    that id, so the message was taken as stored and the model answered the
    previous question."""
    import asyncio

    import redis.asyncio

    def answer(messages: List[BaseMessage]) -> AIMessage:
        return AIMessage("answering: " + str(messages[-1].content))

    inputs = [HumanMessage("what is 2+2", id="msg-1"), HumanMessage("capital of France?", id="msg-1")]
    saver = InMemorySaver() if checkpointed else None
    if mode == "sync":
        mw = RedisMemMiddleware(clean.client())
        agent = create_agent(ScriptedModel(respond=answer, prompts=[]), [], middleware=[mw], checkpointer=saver)
        out = [agent.invoke({"messages": [m]}, cfg("reuse")) for m in inputs][-1]
    else:
        async def main():
            ar = redis.asyncio.Redis(port=clean.port)
            try:
                mw = RedisMemMiddleware(async_client=ar)
                agent = create_agent(ScriptedModel(respond=answer, prompts=[]), [], middleware=[mw],
                                     checkpointer=saver)
                return mw, [await agent.ainvoke({"messages": [m]}, cfg("reuse")) for m in inputs][-1]
            finally:
                await ar.aclose()
        mw, out = asyncio.run(main())
    assert out["messages"][-1].content == "answering: capital of France?"
    assert [(e.role, e.content) for e in stored(clean.client(), "mem:{reuse}")] == [
        ("user", "what is 2+2"), ("assistant", "answering: what is 2+2"),
        ("user", "capital of France?"), ("assistant", "answering: capital of France?")]
    assert mw.stats["reused_ids"] == 1
    assert any("is stored with another text" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("same_process", [True, False], ids=["same-process", "new-process"])
def test_an_edited_turn_is_stored_by_a_new_process_too(r, same_process):
    """Hostile pass 59 F1: LangGraph's edit (update_state replaces a message
    under its id) was stored by the process that sent the old text, but a new
    process's first sight found the id held and took the edit as stored."""
    saver = InMemorySaver()

    def echo(messages: List[BaseMessage]) -> AIMessage:
        return AIMessage(f"You said: {messages[-1].content}")

    first = RedisMemMiddleware(r, memory="window")
    agent = create_agent(ScriptedModel(respond=echo, prompts=[]), [], middleware=[first], checkpointer=saver)
    agent.invoke({"messages": [HumanMessage("Book a flight to Paris", id="q1")]}, cfg("edit"))
    agent.invoke({"messages": [HumanMessage("for 2 people", id="q2")]}, cfg("edit"))
    second = first if same_process else RedisMemMiddleware(r, memory="window")
    model = ScriptedModel(respond=echo, prompts=[])
    again = create_agent(model, [], middleware=[second], checkpointer=saver)
    before = next(s for s in again.get_state_history(cfg("edit")) if s.values["messages"][-1].id == "q2")
    forked = again.update_state(before.config, {"messages": [HumanMessage("for 3 people", id="q2")]})
    again.invoke(None, forked)
    assert [m.content for m in model.prompts[-1]][-1] == "for 3 people"
    assert [e.content for e in stored(r, "mem:{edit}")][-2:] == ["for 3 people", "You said: for 3 people"]
    assert second.stats["reused_ids"] == 1


def test_threads_sharing_a_session_are_each_seen_first(r):
    """Hostile pass 59 F3: with a fixed session_id two threads share one
    session; a new process that served another thread first never saw the
    resumed thread's state, and stored its 200 messages again."""
    saver = InMemorySaver()

    def echo(messages: List[BaseMessage]) -> AIMessage:
        return AIMessage(f"re: {messages[-1].content}")

    def agent(mw: RedisMemMiddleware) -> Any:
        return create_agent(ScriptedModel(respond=echo, prompts=[]), [], middleware=[mw], checkpointer=saver)

    first = agent(RedisMemMiddleware(r, session_id="user42", memory="window", maxmsgs=10))
    for i in range(100):
        first.invoke({"messages": [HumanMessage(f"t2 q{i}", id=f"t2q{i}")]}, cfg("t2"))
    fresh = RedisMemMiddleware(r, session_id="user42", memory="window", maxmsgs=10)
    agent(fresh).invoke({"messages": [HumanMessage("t1 hello", id="t1q0")]}, cfg("t1"))
    agent(fresh).invoke({"messages": [HumanMessage("t2 next", id="t2q100")]}, cfg("t2"))
    info = RedisMemClient(r).info("mem:{user42}")
    assert info is not None and info.last_id == 204


def _turns(r: Any, thread: str, inputs: List[BaseMessage], new_process: bool, checkpointed: bool = True,
           **kw: Any) -> int:
    """One agent turn an input, with a checkpointer or not; the reused ids said."""
    saver, mw, reused = InMemorySaver() if checkpointed else None, None, 0

    def echo(messages: List[BaseMessage]) -> AIMessage:
        return AIMessage("You said: " + str(messages[-1].content)[:40])

    for m in inputs:
        if mw is None or new_process:
            reused += mw.stats["reused_ids"] if mw else 0
            mw = RedisMemMiddleware(r, **kw)
        create_agent(ScriptedModel(respond=echo, prompts=[]), [], middleware=[mw],
                     checkpointer=saver).invoke({"messages": [m]}, cfg(thread))
    return reused + (mw.stats["reused_ids"] if mw else 0)


@pytest.mark.parametrize("new_process", [False, True], ids=["same-process", "new-process"])
def test_messages_stored_other_than_the_state_holds_them_are_not_taken_as_edits(r, new_process):
    """Hostile pass 60 F1, F2: a first sight compared the text the session
    holds with the state's, and took a message stored truncated with its
    META reduced (it lost redis_mem_truncated), or one whose lone surrogate
    the checkpointer gave back as "?" (stored as U+FFFD), for an edit: each
    turn stored the older ones again."""
    long = [HumanMessage("q%d " % i * 400, id=f"u{i}", additional_kwargs={"blob": "b" * 800}) for i in range(4)]
    assert _turns(r, "long", long, new_process, max_message_bytes=500) == 0
    assert len(stored(r, "mem:{long}")) == 8
    odd = [HumanMessage(f"bad \ud800 x {i}", id=f"s{i}") for i in range(4)]
    assert _turns(r, "odd", odd, new_process) == 0
    assert len(stored(r, "mem:{odd}")) == 8


def test_a_constant_id_stores_a_text_again_after_another_one(r):
    """Hostile pass 60 F3: under one id (no checkpointer), A, B, then A
    again stored only A and B (a retry is of the latest text sent under it)."""
    asked = ["Shall I book Paris?", "yes", "And a hotel?", "yes", "yes"]
    assert _turns(r, "const", [HumanMessage(t, id="msg-1") for t in asked], False, checkpointed=False) == 3
    users = [e.content for e in stored(r, "mem:{const}") if e.role == "user"]
    assert users == ["Shall I book Paris?", "yes", "And a hotel?", "yes"]  # the last "yes" is a retry


def test_human_in_the_loop_resume_stores_the_call_once_with_its_result(r):
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.types import Command

    model = ScriptedModel(respond=calculator_script, prompts=[])
    agent = create_agent(model, [add], checkpointer=InMemorySaver(),
                         middleware=[RedisMemMiddleware(r), HumanInTheLoopMiddleware(interrupt_on={"add": True})])
    first = agent.invoke({"messages": [HumanMessage("add 4 4")]}, cfg())
    assert "__interrupt__" in first
    assert [e.role for e in stored(r)] == ["user"]  # the call waits for its result
    out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg())
    assert out["messages"][-1].content == "The sum is 8."
    entries = stored(r)
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert len({e.msgid for e in entries}) == 4


def test_async_agent_gets_the_same_handling(clean):
    import asyncio

    import redis.asyncio

    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            model = ScriptedModel(respond=summarizing_script, prompts=[])
            mw = RedisMemMiddleware(async_client=ar, maxmsgs=10, keep=2)
            agent = create_agent(model, [add, read_file], middleware=[mw])
            await agent.ainvoke({"messages": [HumanMessage("Hi, I'm Alice \ud800")]}, cfg())
            for i in range(5):
                await agent.ainvoke({"messages": [HumanMessage(f"add {i} 1")]}, cfg())
            events = [m async for m, _ in agent.astream({"messages": [HumanMessage("more")]}, cfg(),
                                                           stream_mode="messages")]
            return mw, events
        finally:
            await ar.aclose()

    mw, events = asyncio.run(main())
    entries = stored(clean.client())
    assert entries[0].is_summary and "Alice" in entries[0].content and mw.stats["summaries"] >= 1
    assert [m.content for m in events] == ["You said: more"]


@tool
def echo_len(text: str) -> int:
    """Length of a text."""
    return len(text)


def test_tool_call_arguments_over_the_limit_keep_the_call_with_its_result(r):
    huge = "y" * BIG
    model = ScriptedModel(respond=calls_tool("echo_len", {"text": huge}), prompts=[])
    mw = RedisMemMiddleware(r, maxtokens=10_000_000)
    agent = create_agent(model, [echo_len], middleware=[mw])
    out = agent.invoke({"messages": [HumanMessage("measure")]}, cfg())
    assert out["messages"][-1].content == f"got {len(str(BIG))} chars"
    entries = stored(r)
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    call = entries[1].meta["tool_calls"][0]
    assert call["name"] == "echo_len" and call["args"]["redis_mem_truncated"] > BIG
    assert entries[2].meta["tool_call_id"] == call["id"]
    # Read back, the call and its result still pair (a provider accepts it).
    agent.invoke({"messages": [HumanMessage("again")]}, cfg())
    prompt = model.prompts[-1]
    calls = [m for m in prompt if isinstance(m, AIMessage) and m.tool_calls]
    assert any(c.tool_calls[0]["id"] == t.tool_call_id for c in calls for t in prompt if isinstance(t, ToolMessage))


def test_evictions_with_summary_service_but_no_service_running_are_warned_once(r, caplog):
    mw = RedisMemMiddleware(r, maxmsgs=6, summary_service=True)
    agent = create_agent(ScriptedModel(respond=calculator_script, prompts=[]), [add], middleware=[mw])
    with caplog.at_level(logging.WARNING, logger="redis_mem.middleware"):
        for i in range(6):
            agent.invoke({"messages": [HumanMessage(f"turn {i}")]}, cfg())
    lines = [rec.getMessage() for rec in caplog.records if "evicted before a summary" in rec.getMessage()]
    assert len(lines) == 1 and "is redis-mem-summarizer running?" in lines[0]


def test_recovery_after_an_outage_that_lost_nothing_stores_nothing_twice(clean):
    """Redis paused (timeouts), not restarted: the re-send after it skips what
    the session still holds, so nothing is stored twice."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    r = clean.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    mw = RedisMemMiddleware(r, retry_interval=0)
    agent = create_agent(ScriptedModel(respond=calculator_script, prompts=[]), [add], middleware=[mw])
    agent.invoke({"messages": [HumanMessage("before", id="b1")]}, cfg())
    admin = clean.client()
    admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")
    try:
        with pytest.warns(RuntimeWarning, match="REDIS UNREACHABLE"):
            agent.invoke({"messages": [HumanMessage("during", id="d1")]}, cfg())
    finally:
        time.sleep(1.6)  # the pause ends
    agent.invoke({"messages": [HumanMessage("after", id="a1")]}, cfg())
    contents = [e.content for e in stored(admin)]
    assert contents == ["before", "You said: before", "during", "You said: during", "after", "You said: after"]
    assert mw.stats["resent"] == 2 and not mw.degraded


# -- a message over the session's token cap ------------------------------------

def test_a_tool_result_over_a_quarter_of_maxtokens_does_not_evict_the_conversation(r):
    """Found by the outside tester: a 5 MB tool result (truncated to 4 MB,
    ~600,000 tokens, far over maxtokens 80,000) made the module evict every
    older message, the user's first included, and the next message then
    evicted the tool result too: the session held one assistant message."""
    huge = "word " * (1024 * 1024)  # 5 MB, ~1M tokens

    @tool
    def dump(q: str) -> str:
        """Dumps a lot."""
        return huge

    model = ScriptedModel(respond=calls_tool("dump", {"q": "all"}), prompts=[])
    mw = RedisMemMiddleware(r, memory="window")  # no summary: only the caps act
    agent = create_agent(model, [dump], middleware=[mw])
    agent.invoke({"messages": [HumanMessage("Hi, I'm Alice", id="u0")]}, cfg())
    agent.invoke({"messages": [HumanMessage("dump it again", id="u1")]}, cfg())
    entries = stored(r)
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"] * 2
    assert entries[0].content == "Hi, I'm Alice"
    tools = [e for e in entries if e.role == "tool"]
    for e in tools:
        assert e.tokens <= 20_000 and "over 20000 tokens a message)]" in e.content
        assert e.meta["redis_mem_truncated"] == len(huge)
    assert mw.stats["truncated"] == 2
    # An explicit limit, and 0 = none (the app's choice: the session then evicts).
    mw2 = RedisMemMiddleware(r, memory="window", max_message_tokens=100, key_template="other:{%s}")
    agent2 = create_agent(ScriptedModel(respond=calls_tool("dump", {"q": "all"}), prompts=[]), [dump],
                          middleware=[mw2])
    agent2.invoke({"messages": [HumanMessage("hi", id="v0")]}, cfg())
    got = [e for e in RedisMemClient(r).get("other:{alice}") if e.role == "tool"]
    assert len(got) == 1 and got[0].tokens <= 100 + 16  # the limit is on the content (+ the role's overhead)


def test_async_a_tool_result_over_max_message_tokens_is_cut_too(clean):
    import asyncio

    import redis.asyncio

    @tool
    def dump(q: str) -> str:
        """Dumps a lot."""
        return "word " * 200_000

    async def main():
        ar = redis.asyncio.Redis(port=clean.port, protocol=3)
        try:
            mw = RedisMemMiddleware(async_client=ar, memory="window", maxtokens=40_000)
            agent = create_agent(ScriptedModel(respond=calls_tool("dump", {"q": "x"}), prompts=[]), [dump],
                                 middleware=[mw])
            await agent.ainvoke({"messages": [HumanMessage("Hi, I'm Alice", id="u0")]}, cfg())
            return mw
        finally:
            await ar.aclose()

    mw = asyncio.run(main())
    entries = stored(clean.client())
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert entries[2].tokens <= 10_000 + 16 and "over 10000 tokens a message)]" in entries[2].content
    assert mw.stats["truncated"] == 1


def test_a_message_that_cannot_be_counted_is_stored_not_raised(own_server, caplog):
    """max_message_tokens counts with MEM.COUNT under the session's model; a
    user without CONFIG (so mem.default-model unknown) on a server whose
    mem.encodings leaves out the assumed gpt-4o: MEM.COUNT refuses. The
    agent still answers and the message is stored (uncut)."""
    srv = own_server("--mem.encodings", "cl100k_base", "--mem.default-model", "gpt-4")
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-config")
    r = srv.client(username="app", password="pw")

    @tool
    def dump(q: str) -> str:
        """Dumps a lot."""
        return "word " * 30_000

    mw = RedisMemMiddleware(r, memory="window")
    agent = create_agent(ScriptedModel(respond=calls_tool("dump", {"q": "x"}), prompts=[]), [dump], middleware=[mw])
    out = agent.invoke({"messages": [HumanMessage("Hi, I'm Alice", id="u0")]}, cfg())
    assert out["messages"][-1].content == f"got {5 * 30_000} chars"
    assert [e.role for e in stored(admin)] == ["user", "assistant", "tool", "assistant"]
    assert "could not count a tool message" in caplog.text
