"""RedisMemChatMessageHistory: every LangChain message kind round-trips
through the module, tool calls included; budget context; clear."""

from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from redis_mem import RedisMemClient
from redis_mem.langchain import (
    DEFAULT_SUMMARY_PREFIX,
    FunctionMessage,
    RedisMemChatMessageHistory,
)

KEY = "mem:{lc}"


def conversation():
    msgs = [
        SystemMessage("You are a weather bot."),
        HumanMessage("Weather in Paris and Rome?", id="msg-1"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"},
                {"name": "get_weather", "args": {"city": "Rome"}, "id": "call_2"},
            ],
            id="msg-2",
        ),
        ToolMessage('{"temp": 18}', tool_call_id="call_1", name="get_weather"),
        ToolMessage('{"temp": 25}', tool_call_id="call_2", name="get_weather", status="success"),
        AIMessage("Paris 18°C, Rome 25°C.", additional_kwargs={"refusal": None, "x": [1, 2]},
                  response_metadata={"model_name": "gpt-4o", "finish_reason": "stop"}),
        ChatMessage(role="critic", content="Answer was fine."),
        HumanMessage(content=[{"type": "text", "text": "And this picture?"},
                              {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]),
        HumanMessage("Named user", name="ann"),
    ]
    if FunctionMessage is not None:
        msgs.append(FunctionMessage(name="legacy_fn", content="legacy result"))
    return msgs


@pytest.mark.parametrize("protocol,decode", [(2, True), (2, False), (3, True), (3, False)])
def test_every_message_kind_round_trips(clean, protocol, decode):
    client = clean.client(protocol=protocol, decode_responses=decode)
    h = RedisMemChatMessageHistory(KEY, client)
    msgs = conversation()
    h.add_messages(msgs)
    got = h.messages
    assert len(got) == len(msgs)
    for sent, back in zip(msgs, got):
        assert type(back) is type(sent)
        assert back == sent
    # Tool call details survive exactly.
    assert got[2].tool_calls[1] == {"name": "get_weather", "args": {"city": "Rome"},
                                    "id": "call_2", "type": "tool_call"}
    assert got[4].tool_call_id == "call_2"
    # A second history object (another process) reads the same messages.
    assert RedisMemChatMessageHistory(KEY, clean.client()).messages == msgs
    client.close()


def test_stored_roles_and_meta(clean):
    r = clean.client()
    h = RedisMemChatMessageHistory(KEY, r)
    h.add_messages(conversation())
    stored = RedisMemClient(r).get(KEY)
    roles = [m.role for m in stored]
    expected = ["system", "user", "assistant", "tool", "tool", "assistant", "critic", "user", "user"]
    if FunctionMessage is not None:
        expected.append("function")
    assert roles == expected
    call = stored[2]
    assert call.content == ""
    assert [tc["id"] for tc in call.meta["tool_calls"]] == ["call_1", "call_2"]
    assert call.meta["id"] == "msg-2"
    assert stored[3].meta["tool_call_id"] == "call_1" and stored[3].meta["name"] == "get_weather"
    assert stored[5].meta["additional_kwargs"]["x"] == [1, 2]
    # Content blocks: the text is stored (and counted), the blocks in META.
    assert stored[7].content == "And this picture?"
    assert stored[7].meta["lc_content"][1]["type"] == "image_url"
    assert stored[8].meta["name"] == "ann"
    # Tokens are counted on the stored text: 3 + count(role) + count(content).
    assert all(m.tokens >= 4 for m in stored)


def test_messages_written_by_other_clients(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    mem.append(KEY, "system", "rules")
    mem.append(KEY, "user", "hi", meta={"lang": "en"})
    mem.append(KEY, "assistant", "", meta={"tool_calls": [{"name": "f", "args": {}, "id": "c9"}]})
    mem.append(KEY, "tool", "done", meta={"tool_call_id": "c9"})
    mem.append(KEY, "tool", "orphan without id")
    mem.append(KEY, "narrator", "meanwhile")
    got = RedisMemChatMessageHistory(KEY, r).messages
    assert got[0] == SystemMessage("rules")
    assert isinstance(got[1], HumanMessage) and got[1].additional_kwargs == {"lang": "en"}
    assert isinstance(got[2], AIMessage) and got[2].tool_calls[0]["id"] == "c9"
    assert isinstance(got[3], ToolMessage) and got[3].tool_call_id == "c9"
    assert isinstance(got[4], ChatMessage) and got[4].role == "tool"
    assert got[5] == ChatMessage(role="narrator", content="meanwhile")


def test_add_message_helpers_and_clear(clean):
    r = clean.client()
    h = RedisMemChatMessageHistory.for_session("bob", r)
    assert h.key == "mem:{bob}"
    assert h.messages == []
    h.add_user_message("hello")
    h.add_ai_message("hi bob")
    h.add_message(ToolMessage("x", tool_call_id="t"))
    assert [type(m) for m in h.messages] == [HumanMessage, AIMessage, ToolMessage]
    assert [x.id for x in h.last_results] == [3]
    h.clear()
    assert r.exists("mem:{bob}") == 0
    assert h.messages == []


def test_settings_are_sent_and_caps_apply(clean):
    r = clean.client()
    h = RedisMemChatMessageHistory(KEY, r, model="gpt-4", ttl=300, maxmsgs=4)
    h.add_messages([HumanMessage(f"q{i}") for i in range(6)])
    info = RedisMemClient(r).info(KEY)
    assert (info.model, info.encoding, info.ttl, info.maxmsgs) == ("gpt-4", "cl100k_base", 300, 4)
    assert [m.content for m in h.messages] == ["q2", "q3", "q4", "q5"]
    assert [x.summarize for x in h.last_results] == [False, False, False, True, True, True]
    assert 0 < r.ttl(KEY) <= 300


def test_summary_is_the_same_message_as_the_middlewares_first(clean):
    """Issue 19 finding 12: one summary message type everywhere."""
    from redis_mem.middleware import RedisMemMiddleware

    r = clean.client()
    h = RedisMemChatMessageHistory(session_id="lc", redis_client=r)  # langchain-redis names
    assert h.key == KEY
    h.add_messages([HumanMessage(f"question {i}") for i in range(4)])
    RedisMemClient(r).summarize(KEY, 2, "User asked two questions.")
    got = h.messages
    assert isinstance(got[0], HumanMessage)
    assert got[0].content == DEFAULT_SUMMARY_PREFIX + "User asked two questions."
    assert got[0].additional_kwargs["lc_source"] == "summarization"
    assert got[0].additional_kwargs["redis_mem"]["summary_upto"] == 2
    mw = RedisMemMiddleware(r)
    context, _tokens = mw._context(KEY, RedisMemClient(r).get(KEY))
    assert context[0] == got[0]
    assert got[1:] == [HumanMessage("question 2"), HumanMessage("question 3")]
    no_summary = RedisMemChatMessageHistory(KEY, r, include_summary=False)
    assert no_summary.messages == [HumanMessage("question 2"), HumanMessage("question 3")]


def test_context_for_budget(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    h = RedisMemChatMessageHistory(KEY, r, summary_prefix="")
    h.add_messages([HumanMessage(f"question number {i}") for i in range(8)])
    mem.summarize(KEY, 3, "Earlier the user asked questions 0 to 2.")
    entries = mem.get(KEY)
    summary, rest = entries[0], entries[1:]
    budget = summary.tokens + sum(m.tokens for m in rest[-3:])
    ctx = h.context_for_budget(budget)
    assert ctx[0].content == "Earlier the user asked questions 0 to 2."
    assert ctx[0].additional_kwargs["lc_source"] == "summarization"
    assert [m.content for m in ctx[1:]] == ["question number 5", "question number 6",
                                            "question number 7"]
    # One token less: one message fewer (contiguous newest run).
    assert [m.content for m in h.context_for_budget(budget - 1)[1:]] == [
        "question number 6", "question number 7"]
    # A big budget: the whole session, summary first.
    assert len(h.context_for_budget(10**6)) == len(entries)
    # Below the summary's own size: nothing fits.
    assert h.context_for_budget(summary.tokens - 1) == []


def test_context_for_budget_drops_tool_result_without_its_call(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    h = RedisMemChatMessageHistory(KEY, r)
    h.add_messages([
        HumanMessage("weather?"),
        AIMessage("", tool_calls=[{"name": "w", "args": {}, "id": "c1"}]),
        ToolMessage("sunny and warm, 25 degrees", tool_call_id="c1"),
        AIMessage("It is sunny."),
    ])
    entries = mem.get(KEY)
    budget = entries[2].tokens + entries[3].tokens  # the tool result + answer
    # The module leaves out a tool result whose call does not fit.
    assert [m.role for m in mem.get(KEY, budget=budget)] == ["assistant"]
    ctx = h.context_for_budget(budget)
    assert ctx == [AIMessage("It is sunny.")]
    full = h.context_for_budget(budget + entries[1].tokens)
    assert [type(m) for m in full] == [AIMessage, ToolMessage, AIMessage]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # RunnableWithMessageHistory
def test_runnable_with_message_history(clean):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory

    r = clean.client()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{question}")])
    model = FakeListChatModel(responses=["Hello Ann.", "Your name is Ann."])
    seen = []
    chain = RunnableWithMessageHistory(
        prompt | (lambda p: seen.append(p.to_messages()) or p) | model,
        lambda session_id: RedisMemChatMessageHistory.for_session(session_id, r),
        input_messages_key="question",
        history_messages_key="history",
    )
    cfg = {"configurable": {"session_id": "ann"}}
    assert chain.invoke({"question": "I am Ann."}, config=cfg).content == "Hello Ann."
    assert chain.invoke({"question": "Who am I?"}, config=cfg).content == "Your name is Ann."
    # The second prompt carried the first turn, read back from Redis.
    assert [m.content for m in seen[1]] == ["Be brief.", "I am Ann.", "Hello Ann.", "Who am I?"]
    stored = RedisMemClient(r).get("mem:{ann}")
    assert [(m.role, m.content) for m in stored] == [
        ("user", "I am Ann."), ("assistant", "Hello Ann."),
        ("user", "Who am I?"), ("assistant", "Your name is Ann.")]


def test_messages_are_sent_with_msgids_and_a_retried_call_stores_nothing_twice(clean):
    r = clean.client()
    h = RedisMemChatMessageHistory(KEY, r)
    long_id = "run-" + "x" * 200
    turn = [HumanMessage("book it", id="msg-7"), AIMessage("booked", id=long_id), AIMessage("no id")]
    h.add_messages(turn)
    first = h.last_results
    assert [(x.id, x.duplicate) for x in first] == [(1, False), (2, False), (3, False)]
    stored = RedisMemClient(r).get(KEY)
    assert stored[0].msgid == "msg-7"
    assert stored[1].msgid.startswith("sha256:") and len(stored[1].msgid) <= 128
    assert stored[2].msgid == first[2].msgid and stored[2].msgid  # made up by the client
    # The application retries the turn (its first call timed out): the
    # messages with an id are recognised, not stored again.
    h.add_messages(turn[:2])
    assert [(x.id, x.duplicate) for x in h.last_results] == [(1, True), (2, True)]
    assert [m.content for m in h.messages] == ["book it", "booked", "no id"]
    # They still come back equal to what was added.
    assert h.messages == turn


def test_ids_and_roles_the_module_would_refuse_are_stored_not_raised(clean):
    """A message id with a control character (or a lone surrogate) becomes a
    hashed MSGID, and a ChatMessage role the module refuses (a newline,
    empty, over 64 bytes) is kept in META: the batch is stored, not lost to
    an error, and a retry is still recognised."""
    r = clean.client()
    h = RedisMemChatMessageHistory(KEY, r)
    turn = [
        HumanMessage("hi", id="turn-1\n"),
        AIMessage("hello", id="run\ud800x"),
        HumanMessage("sep", id="turn\u20282"),
        ChatMessage(role="critic\nnotes", content="fine"),
        ChatMessage(role="", content="empty role"),
        ChatMessage(role="r" * 65, content="long role"),
        ChatMessage(role="critic\x85", content="C1 control"),
    ]
    h.add_messages(turn)
    stored = RedisMemClient(r).get(KEY)
    assert [m.msgid.startswith("sha256:") for m in stored[:3]] == [True, True, True]
    assert [m.role for m in stored[3:]] == ["chat", "chat", "chat", "chat"]
    back = h.messages
    assert [getattr(m, "role", None) for m in back[3:]] == ["critic\nnotes", "", "r" * 65, "critic\x85"]
    h.add_messages(turn[:3])
    assert [x.duplicate for x in h.last_results] == [True, True, True]
