"""Issue 21, counting what the model sees: RedisMemMiddleware stores the
provider's reported output tokens for models whose tokenizer is not public,
reconciles the reported prompt tokens with its own estimate, and can size
the context as window - system prompt - tool schemas - reply reserve.
A real `create_agent` loop, a scripted chat model reporting usage_metadata,
a real redis-server with the module."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import redis.asyncio
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from fakes import NamedModel, ScriptedModel, calculator_script, with_usage
from redis_mem import RedisMemClient
from redis_mem.middleware import DEFAULT_BUDGET, BudgetBreakdown, RedisMemMiddleware, UsageDrift

SYSTEM = "You are terse."
KEY = "mem:{alice}"


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def cfg(thread="alice"):
    return {"configurable": {"thread_id": thread}}


def reported_output(answer):
    # Distinct from any count the module would make of these short texts,
    # and plausible for them (at most a token per byte of what they show).
    return len(answer.content) + 5 if not answer.tool_calls else 70


def reported_input(prompt):
    return 1000 + 10 * len(prompt)


USAGE_SCRIPT = with_usage(calculator_script, reported_input, reported_output)


def agent_with(mw, script=USAGE_SCRIPT, model=None):
    model = model or ScriptedModel(respond=script, prompts=[])
    return create_agent(model, [add], middleware=[mw], system_prompt=SYSTEM), model


def tools_tokens(mem, model):
    return mem.count(model, json.dumps(convert_to_openai_tool(add), ensure_ascii=False))


def fitting(entries, budget):
    """The newest of ``entries`` whose tokens fit ``budget`` (MEM.GET BUDGET's rule)."""
    out, used = [], 0
    for e in reversed(entries):
        if used + e.tokens > budget:
            break
        out.insert(0, e)
        used += e.tokens
    return out


@pytest.fixture
def mem_get_budgets(r):
    """The BUDGET argument of every MEM.GET the server ran since the last
    call (read from SLOWLOG with a 0 µs threshold: what was really sent)."""
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()

    def budgets():
        out = []
        for entry in reversed(r.slowlog_get(1024)):
            args = entry["command"]
            args = (args.decode() if isinstance(args, bytes) else args).split()
            if args[0].upper() == "MEM.GET" and "BUDGET" in args:
                out.append(int(args[args.index("BUDGET") + 1]))
        r.slowlog_reset()
        return out

    yield budgets
    r.config_set("slowlog-log-slower-than", 10000)


def test_claude_replies_are_stored_with_the_providers_output_tokens(r):
    mw = RedisMemMiddleware(r, model="claude-sonnet-4-5")
    agent, _ = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("add 2 3")]}, cfg())
    mem = RedisMemClient(r)
    entries = mem.get(KEY)
    assert [(e.role, e.content) for e in entries] == [
        ("user", "add 2 3"), ("assistant", ""), ("tool", "5"), ("assistant", "The sum is 5.")]
    # The AI messages carry the provider's count (TOKENS), the tool call's too.
    assert entries[1].tokens == 70
    assert entries[3].tokens == len("The sum is 5.") + 5
    # What the provider did not count keeps the module's count.
    assert entries[0].tokens == mem.count("claude-sonnet-4-5", "add 2 3", role="user")
    assert entries[2].tokens == mem.count("claude-sonnet-4-5", "5", role="tool")
    assert mw.stats["provider_tokens"] == 2
    assert mem.info(KEY).total_tokens == sum(e.tokens for e in entries)


def test_exact_models_keep_the_modules_count(r):
    mw = RedisMemMiddleware(r, model="gpt-4o")
    agent, _ = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("add 2 3")]}, cfg())
    mem = RedisMemClient(r)
    entries = mem.get(KEY)
    # The module's count, its tool call included.
    assert entries[1].tokens == mem.count("gpt-4o", "", role="assistant", meta=entries[1].meta)
    assert entries[1].tokens > mem.count("gpt-4o", "", role="assistant")
    assert entries[3].tokens == mem.count("gpt-4o", "The sum is 5.", role="assistant")
    assert mw.stats["provider_tokens"] == 0


@pytest.mark.parametrize("chat_model_name, setting, from_usage, expected", [
    ("gemini-2.5-pro", None, None, True),            # the chat model's own name: no public tokenizer
    ("models/gemini-2.5-flash", None, None, True),   # Google's resource name
    ("my-local-model", None, None, True),            # unknown to the module: exact 0
    ("gpt-4.1-mini", None, None, False),             # o200k_base, exact
    ("gpt-4o", "claude-opus-4", None, True),         # model= names the model that sees the text
    ("claude-sonnet-4-5", None, False, False),       # tokens_from_usage decides
    ("gpt-4o", None, True, True),
])
def test_which_models_store_the_providers_count(r, chat_model_name, setting, from_usage, expected):
    mw = RedisMemMiddleware(r, model=setting, tokens_from_usage=from_usage)
    model = NamedModel(respond=USAGE_SCRIPT, prompts=[], model_name=chat_model_name)
    agent, _ = agent_with(mw, model=model)
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    answer = RedisMemClient(r).get(KEY)[-1]
    assert answer.content == "You said: hello"
    provider = len("You said: hello") + 5
    assert (answer.tokens == provider) is expected
    if not expected:
        count_model = setting or chat_model_name
        assert answer.tokens == RedisMemClient(r).count(count_model, "You said: hello", role="assistant")


def test_reasoning_tokens_are_not_stored_and_no_usage_falls_back_to_the_module(r):
    mw = RedisMemMiddleware(r, model="gemini-2.5-pro")
    agent, _ = agent_with(mw, script=with_usage(calculator_script, reported_input, lambda a: 50, reasoning=30))
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    # The thoughts are not sent back to the model in later turns.
    assert RedisMemClient(r).get(KEY)[-1].tokens == 20
    plain, _ = agent_with(RedisMemMiddleware(r, model="claude-sonnet-4-5"), script=calculator_script)
    plain.invoke({"messages": [HumanMessage("hello")]}, cfg("bob"))
    answer = RedisMemClient(r).get("mem:{bob}")[-1]
    assert answer.tokens == RedisMemClient(r).count("claude-sonnet-4-5", "You said: hello", role="assistant")


def test_drift_compares_the_reported_prompt_with_the_estimate(r, caplog):
    mw = RedisMemMiddleware(r, model="claude-sonnet-4-5")
    agent, model = agent_with(mw)
    mem = RedisMemClient(r)
    fixed = mem.count("claude-sonnet-4-5", SYSTEM) + tools_tokens(mem, "claude-sonnet-4-5")
    with caplog.at_level(logging.DEBUG, logger="redis_mem.middleware"):
        agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    first = fixed + mem.get(KEY)[0].tokens  # the only context message: the input
    assert mw.usage_drift == {"claude-sonnet-4-5": UsageDrift(
        calls=1, last_estimated=first, last_reported=reported_input(model.prompts[0]),
        mean_ratio=reported_input(model.prompts[0]) / first)}
    assert f"{reported_input(model.prompts[0])} tokens reported by the provider, {first} estimated" in caplog.text
    agent.invoke({"messages": [HumanMessage("add 1 2")]}, cfg())
    # Three calls now, each given every message stored before it: hello,
    # its answer, add 1 2 (call 2), then the tool call and its result (call 3).
    tokens = [e.tokens for e in mem.get(KEY)]
    assert len(tokens) == 6 and len(model.prompts) == 3 and model.prompts[-1][-1].content == "3"
    estimates = [fixed + sum(tokens[:n]) for n in (1, 3, 5)]
    reports = [reported_input(p) for p in model.prompts]
    drift = mw.usage_drift["claude-sonnet-4-5"]
    assert (drift.calls, drift.last_estimated, drift.last_reported) == (3, estimates[-1], reports[-1])
    assert drift.mean_ratio == pytest.approx(sum(rep / est for rep, est in zip(reports, estimates)) / 3)
    # A reply without usage leaves the drift as it was.
    quiet = RedisMemMiddleware(r, model="claude-sonnet-4-5")
    agent_with(quiet, script=calculator_script)[0].invoke({"messages": [HumanMessage("hi")]}, cfg("carol"))
    assert quiet.usage_drift == {}


def test_auto_budget_is_window_minus_system_tools_and_reply_reserve(r, mem_get_budgets):
    mem = RedisMemClient(r)
    mw = RedisMemMiddleware(r, budget="auto", model="gpt-4o")
    agent, _ = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    expected = 128000 - mem.count("gpt-4o", SYSTEM) - tools_tokens(mem, "gpt-4o") - 4096
    assert mw.last_budget == BudgetBreakdown("gpt-4o", 128000, mem.count("gpt-4o", SYSTEM),
                                             tools_tokens(mem, "gpt-4o"), 4096, expected)
    assert mem_get_budgets() == [expected]
    # The chat model's max_tokens is the reply reserve; Claude's window.
    mw = RedisMemMiddleware(r, budget="auto")
    model = NamedModel(respond=USAGE_SCRIPT, prompts=[], model_name="claude-sonnet-4-5", max_tokens=64000)
    agent_with(mw, model=model)[0].invoke({"messages": [HumanMessage("hello")]}, cfg("bob"))
    claude = 200000 - mem.count("claude-sonnet-4-5", SYSTEM) - tools_tokens(mem, "claude-sonnet-4-5") - 64000
    assert mw.last_budget.budget == claude and mem_get_budgets() == [claude]


def test_auto_budget_overrides_cut_the_context(r, mem_get_budgets):
    mem = RedisMemClient(r)
    for i in range(20):
        mem.append(KEY, "user" if i % 2 == 0 else "assistant", f"message number {i} " * 5, model="gpt-4o")
    fixed = mem.count("gpt-4o", SYSTEM) + tools_tokens(mem, "gpt-4o")
    window = fixed + 100 + 120  # 120 tokens of context once 100 are reserved
    mw = RedisMemMiddleware(r, budget="auto", model="gpt-4o", context_window=window, reply_reserve=100)
    agent, model = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("hello", id="h1")]}, cfg())
    assert mem_get_budgets() == [120]
    fits = fitting(mem.get(KEY)[:-1], 120)  # before the answer was stored
    # The model saw exactly what fits 120 tokens (no older message).
    assert [m.content for m in model.prompts[0][1:]] == [e.content for e in fits]
    assert fits[-1].content == "hello" and 1 < len(fits) < 21


def test_auto_budget_counts_the_attributes_in_the_system_prompt(r):
    mem = RedisMemClient(r)
    mem.attrset(KEY, "user_profile", {"name": "Alice"})
    mw = RedisMemMiddleware(r, budget="auto", model="gpt-4o", attributes=["user_profile"], reply_reserve=0)
    agent, model = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    system = model.prompts[0][0].content
    assert system.startswith(SYSTEM) and "Alice" in system
    assert mw.last_budget.system_tokens == mem.count("gpt-4o", system)
    assert mw.last_budget.budget == 128000 - mem.count("gpt-4o", system) - tools_tokens(mem, "gpt-4o")


def test_auto_budget_of_an_unknown_window_is_the_default_with_a_warning(r, mem_get_budgets, caplog):
    mw = RedisMemMiddleware(r, budget="auto", model="my-local-model")
    with caplog.at_level(logging.WARNING, logger="redis_mem.middleware"):
        agent_with(mw)[0].invoke({"messages": [HumanMessage("hello")]}, cfg())
    assert mem_get_budgets() == [DEFAULT_BUDGET]
    assert "context window of my-local-model is unknown" in caplog.text


def test_a_fixed_budget_still_wins(r, mem_get_budgets):
    mem = RedisMemClient(r)
    for i in range(10):
        mem.append(KEY, "user", f"old message {i}", model="claude-sonnet-4-5")
    mw = RedisMemMiddleware(r, budget=40, model="claude-sonnet-4-5", context_window=100000)
    agent, model = agent_with(mw)
    agent.invoke({"messages": [HumanMessage("hello", id="h1")]}, cfg())
    assert mem_get_budgets() == [40]
    assert mw.last_budget is None
    fits = fitting(mem.get(KEY)[:-1], 40)
    assert [m.content for m in model.prompts[0][1:]] == [e.content for e in fits]
    assert 1 < len(fits) < 11


@pytest.mark.parametrize("kwargs", [
    {"budget": 0}, {"budget": -5}, {"budget": "big"}, {"budget": True}, {"budget": 1.5},
    {"context_window": 0}, {"context_window": "128k"}, {"context_window": 10**30}, {"budget": 2**63},
    {"reply_reserve": -1}, {"tokens_from_usage": "yes"},
])
def test_bad_budget_settings_are_refused(r, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RedisMemMiddleware(r, **kwargs)


def test_async_path_stores_usage_counts_the_drift_and_the_auto_budget(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            mw = RedisMemMiddleware(async_client=ar, budget="auto", model="claude-sonnet-4-5", reply_reserve=8192)
            agent, model = agent_with(mw)
            await agent.ainvoke({"messages": [HumanMessage("add 4 5")]}, cfg())
            return mw, model
        finally:
            await ar.aclose()

    mw, model = asyncio.run(main())
    mem = RedisMemClient(clean.client())
    entries = mem.get(KEY)
    assert [e.tokens for e in entries if e.role == "assistant"] == [70, len("The sum is 9.") + 5]
    fixed = mem.count("claude-sonnet-4-5", SYSTEM) + tools_tokens(mem, "claude-sonnet-4-5")
    assert mw.last_budget.budget == 200000 - fixed - 8192
    drift = mw.usage_drift["claude-sonnet-4-5"]
    assert drift.calls == 2
    assert drift.last_estimated == fixed + sum(e.tokens for e in entries[:-1])
    assert drift.last_reported == reported_input(model.prompts[-1])


def test_langgraph_nodes_auto_budget_is_the_window_less_the_reserve(r, mem_get_budgets):
    from langchain_core.runnables import RunnableLambda
    from redis_mem.langgraph import SessionMemory

    memory = SessionMemory(r, budget="auto", model="gpt-4o", reply_reserve=1000)
    got = RunnableLambda(memory.model_input).invoke({"messages": [HumanMessage("hello", id="h1")]}, cfg())
    assert [m.content for m in got] == ["hello"]
    # No system prompt or tools are known to a node: the window less the reserve.
    assert mem_get_budgets() == [128000 - 1000]


def test_a_providers_count_the_module_refuses_falls_back_to_the_modules(r):
    # Over mem.max-tokens-limit (10,000,000): the answer is stored all the
    # same, with the module's count.
    mw = RedisMemMiddleware(r, model="claude-sonnet-4-5")
    agent, _ = agent_with(mw, script=with_usage(calculator_script, reported_input, lambda a: 50_000_000))
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    answer = RedisMemClient(r).get(KEY)[-1]
    assert answer.content == "You said: hello"
    assert answer.tokens == RedisMemClient(r).count("claude-sonnet-4-5", "You said: hello", role="assistant")
    assert mw.stats["refused"] == 0 and mw.stats["provider_tokens"] == 0


def test_the_readme_budget_example(r, mem_get_budgets):
    # python/README.md "Counting what the model sees": the figures it shows.
    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"

    @tool
    def book_flight(origin: str, destination: str, date: str) -> str:
        """Books a flight; date as YYYY-MM-DD."""
        return "booked"

    memory = RedisMemMiddleware(r, budget="auto")
    model = NamedModel(respond=USAGE_SCRIPT, prompts=[], model_name="claude-sonnet-4-5", max_tokens=8192)
    agent = create_agent(model, [get_weather, book_flight], middleware=[memory],
                         system_prompt="You are a travel assistant. Answer briefly.")
    agent.invoke({"messages": [HumanMessage("hello")]}, cfg())
    assert memory.last_budget == BudgetBreakdown("claude-sonnet-4-5", 200000, 9, 56 + 84, 8192, 191659)
    assert mem_get_budgets() == [191659]


@pytest.mark.parametrize("reported", [0, 180_300, 9_000_000])
def test_implausible_provider_counts_are_not_stored(r, reported):
    """A count no reply of these bytes can have (cumulative usage summed over
    streamed chunks, thinking tokens reported as output, a 0) is not stored:
    it would evict the whole conversation, or hide the reply from the caps."""
    text = "word " * 600
    script = with_usage(lambda msgs: AIMessage(text), reported_input, lambda answer: reported)
    mw = RedisMemMiddleware(r, model="claude-sonnet-4-5")
    agent, _ = agent_with(mw, script=script)
    for turn in range(3):
        agent.invoke({"messages": [HumanMessage(f"talk {turn}")]}, cfg())
    mem = RedisMemClient(r)
    entries = mem.get(KEY)
    assert [e.role for e in entries] == ["user", "assistant"] * 3, "nothing evicted"
    for e in entries:
        if e.role == "assistant":
            assert e.tokens == mem.count("claude-sonnet-4-5", e.content, role="assistant", meta=e.meta)
    assert mw.stats["provider_tokens_implausible"] == 3
    assert mw.stats["provider_tokens"] == 0
