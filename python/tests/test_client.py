"""RedisMemClient against the real module, over RESP2 and RESP3, with
decode_responses on and off (the `conn` fixture runs each test 4 times)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone

import pytest
import redis

from redis_mem import AppendResult, Message, ModelInfo, RedisMemClient, SessionInfo, SummarizeBegin, SummarizeCheck

KEY = "mem:{alice}"


@pytest.fixture
def mem(conn):
    return RedisMemClient(conn)


def test_append_creates_session_and_counts_tokens(mem):
    r1 = mem.append(KEY, "user", "")
    assert isinstance(r1, AppendResult)
    # tokens = 3 + count("user") + count(""): "user" is one token.
    assert (r1.id, r1.tokens, r1.total_tokens, r1.messages, r1.trimmed, r1.summarize, r1.duplicate) == (
        1, 4, 4, 1, 0, False, False)
    r2 = mem.append(KEY, "user", "hello there")  # "hello", " there"
    assert (r2.id, r2.tokens, r2.total_tokens, r2.messages) == (2, 6, 10, 2)
    r3 = mem.append(KEY, "assistant", "Hi! How can I help you today?")
    assert r3.id == 3 and r3.messages == 3
    assert r3.total_tokens == 10 + r3.tokens
    got = mem.get(KEY)
    assert [m.id for m in got] == [1, 2, 3]
    assert sum(m.tokens for m in got) == r3.total_tokens


def test_append_ts_meta_and_unicode(mem):
    meta = {"tool_calls": [{"id": "c1", "name": "lookup", "args": {"q": "é"}}], "n": 1}
    mem.append(KEY, "assistant", "Grüße, 世界 🌍", ts=1700000000123, meta=meta)
    mem.append(KEY, "user", "plain")
    first, second = mem.get(KEY)
    assert isinstance(first, Message)
    assert first.content == "Grüße, 世界 🌍"
    assert first.ts == 1700000000123
    assert first.timestamp == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    assert first.meta == meta
    assert second.meta is None
    assert abs(second.ts - time.time() * 1000) < 60_000  # server clock
    assert not first.is_summary


def test_append_settings_model_ttl_caps(mem, conn):
    mem.append(KEY, "user", "hello there", model="gpt-4", ttl=120, maxtokens=5000, maxmsgs=7)
    info = mem.info(KEY)
    assert isinstance(info, SessionInfo)
    assert (info.model, info.encoding, info.context_window) == ("gpt-4", "cl100k_base", 8192)
    assert (info.ttl, info.maxtokens, info.maxmsgs) == (120, 5000, 7)
    assert 100 <= conn.ttl(KEY) <= 120
    # Settings stick: a later append without options keeps them.
    mem.append(KEY, "user", "again")
    assert mem.info(KEY).maxmsgs == 7
    assert mem.info(KEY).model == "gpt-4"


def test_append_trims_to_maxmsgs(mem):
    for i in range(5):
        mem.append(KEY, "user", f"message {i}", maxmsgs=3)
    got = mem.get(KEY)
    assert [m.content for m in got] == ["message 2", "message 3", "message 4"]
    r = mem.append(KEY, "user", "message 5")
    assert r.trimmed == 1 and r.messages == 3 and r.id == 6
    # Lowering a cap trims at once.
    r = mem.append(KEY, "user", "message 6", maxmsgs=1)
    assert (r.messages, r.trimmed) == (1, 3)
    assert [m.id for m in mem.get(KEY)] == [7]


def test_append_trims_to_maxtokens(mem):
    for i in range(4):
        mem.append(KEY, "user", "hello there", maxtokens=13)  # 6 tokens each
    got = mem.get(KEY)
    assert [m.id for m in got] == [3, 4]
    assert mem.info(KEY).total_tokens == 12


def test_append_reports_summarize_threshold(mem):
    results = [mem.append(KEY, "user", f"m{i}", maxmsgs=4) for i in range(4)]
    assert [x.summarize for x in results] == [False, False, False, True]


def test_append_errors_change_nothing(mem):
    mem.append(KEY, "user", "keep me")
    with pytest.raises(redis.ResponseError, match="META"):
        mem.append(KEY, "user", "x", meta="[1, 2]")
    with pytest.raises(redis.ResponseError, match="META"):
        mem.append(KEY, "user", "x", meta="{not json")
    with pytest.raises(redis.ResponseError):
        mem.append(KEY, "", "x")
    assert [m.content for m in mem.get(KEY)] == ["keep me"]
    mem.redis.set("plain", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        mem.append("plain", "user", "x")


def test_get_last_after_budget(mem):
    for i in range(1, 7):
        mem.append(KEY, "user", f"message number {i}")
    all_ = mem.get(KEY)
    assert [m.id for m in mem.get(KEY, last=2)] == [5, 6]
    assert [m.id for m in mem.get(KEY, after=4)] == [5, 6]
    assert [m.id for m in mem.get(KEY, after=1, last=10)] == [2, 3, 4, 5, 6]
    per = all_[0].tokens
    assert all(m.tokens == per for m in all_)
    assert [m.id for m in mem.get(KEY, budget=per * 3)] == [4, 5, 6]
    assert [m.id for m in mem.get(KEY, budget=per * 3 + per - 1)] == [4, 5, 6]
    assert mem.get(KEY, budget=per - 1) == []
    assert mem.get("mem:{nobody}") == []


def test_summarize_and_summary_first(mem):
    for i in range(1, 6):
        mem.append(KEY, "user", f"message number {i}")
    r = mem.summarize(KEY, 3, "The user counted to three.")
    assert r.id == 3 and r.messages == 2
    got = mem.get(KEY)
    assert got[0].is_summary and got[0].role == "summary"
    assert (got[0].id, got[0].content) == (3, "The user counted to three.")
    assert got[0].tokens == r.tokens
    assert [m.id for m in got[1:]] == [4, 5]
    assert r.total_tokens == sum(m.tokens for m in got)
    # LAST keeps the summary first; AFTER leaves it out.
    assert [(m.role, m.id) for m in mem.get(KEY, last=1)] == [("summary", 3), ("user", 5)]
    assert [m.id for m in mem.get(KEY, after=3)] == [4, 5]
    # BUDGET: summary plus the newest messages that fit.
    budget = got[0].tokens + got[2].tokens
    assert [(m.role, m.id) for m in mem.get(KEY, budget=budget)] == [("summary", 3), ("user", 5)]
    assert mem.info(KEY).summary_upto == 3


def test_summarize_rejects_bad_upto(mem):
    for i in range(1, 4):
        mem.append(KEY, "user", f"m{i}")
    with pytest.raises(redis.ResponseError):
        mem.summarize(KEY, 99, "nope")
    mem.summarize(KEY, 2, "first two")
    with pytest.raises(redis.ResponseError):
        mem.summarize(KEY, 1, "older")  # below the current summary
    with pytest.raises(redis.ResponseError):
        mem.summarize("mem:{nobody}", 1, "x")
    got = mem.get(KEY)
    assert [(m.role, m.id, m.content) for m in got] == [("summary", 2, "first two"), ("user", 3, "m3")]


def test_get_json(mem):
    mem.append(KEY, "user", "hi", ts=1714557600000, meta={"a": 1})
    mem.append(KEY, "assistant", "hello", ts=1714557601000)
    doc = mem.get_json(KEY)
    assert doc["model"] == "gpt-4o"
    assert doc["summary"] is None
    h = doc["conversation_history"]
    assert [(m["id"], m["role"], m["content"]) for m in h] == [(1, "user", "hi"), (2, "assistant", "hello")]
    assert h[0]["timestamp"] == "2024-05-01T10:00:00.000Z" and h[0]["ts"] == 1714557600000
    assert h[0]["meta"] == {"a": 1} and "meta" not in h[1]
    assert doc["total_tokens"] == sum(m["tokens"] for m in h)
    assert [m["id"] for m in mem.get_json(KEY, last=1)["conversation_history"]] == [2]
    assert mem.get_json("mem:{nobody}")["conversation_history"] == []


def test_summarize_check(mem):
    empty = mem.summarize_check("mem:{nobody}")
    assert isinstance(empty, SummarizeCheck)
    assert (empty.summarize, empty.messages, empty.upto) == (False, 0, 0)
    # mem.summarize-headroom (20%) below the caps: 24 of 30 messages.
    assert (empty.threshold_tokens, empty.threshold_messages, empty.keep) == (19200, 24, 10)
    for i in range(1, 7):
        mem.append(KEY, "user", f"message {i}", maxmsgs=6)
    c = mem.summarize_check(KEY, keep=2)
    assert (c.summarize, c.messages, c.threshold_messages, c.keep, c.upto) == (True, 6, 5, 2, 4)
    msgs = mem.get(KEY)
    assert c.upto_tokens == sum(m.tokens for m in msgs[:4])
    assert c.total_tokens == sum(m.tokens for m in msgs)
    assert mem.summarize_check(KEY).upto == 0  # default keep 10 > 6 messages
    assert mem.summarize_check(KEY, model="claude-3-5-sonnet").threshold_tokens == 30000
    assert mem.summarize_check(KEY, model="some-unknown-model").threshold_tokens == 15000
    assert mem.summarize_check(KEY, context=10000).threshold_tokens == 1500
    with pytest.raises(redis.ResponseError):
        mem.summarize_check(KEY, model="gpt-4o", context=1000)


def test_append_msgid_and_retries(mem, conn):
    r = mem.append(KEY, "user", "Book a table.", msgid="turn-1")
    assert (r.id, r.duplicate, r.msgid) == (1, False, "turn-1")
    again = mem.append(KEY, "user", "Book a table.", msgid="turn-1")
    assert (again.id, again.tokens, again.duplicate, again.trimmed) == (1, r.tokens, True, 0)
    # Without a msgid the client makes one up: two calls, two messages.
    a = mem.append(KEY, "user", "same text")
    b = mem.append(KEY, "user", "same text")
    assert a.msgid and b.msgid and a.msgid != b.msgid
    assert (a.id, b.id, a.duplicate, b.duplicate) == (2, 3, False, False)
    # The same command sent twice (what a retrying redis client does) is
    # stored once.
    args = ["MEM.APPEND", KEY, "user", "resent", "MSGID", "turn-9"]
    first = AppendResult.from_reply(conn.execute_command(*args))
    second = AppendResult.from_reply(conn.execute_command(*args))
    assert (first.duplicate, second.duplicate, first.id, second.id) == (False, True, 4, 4)
    got = mem.get(KEY)
    assert [m.msgid for m in got] == ["turn-1", a.msgid, b.msgid, "turn-9"]
    assert mem.get_json(KEY)["conversation_history"][0]["msgid"] == "turn-1"
    # Batches too, item by item.
    res = mem.append_batch(KEY, [{"role": "user", "content": "x", "msgid": "turn-1"},
                                 {"role": "assistant", "content": "y"}])
    assert [(x.id, x.duplicate) for x in res] == [(1, True), (5, False)]
    assert res[1].msgid is not None
    with pytest.raises(redis.ResponseError, match="128 bytes"):
        mem.append(KEY, "user", "x", msgid="m" * 129)
    plain = RedisMemClient(conn, auto_msgid=False)
    assert plain.append(KEY, "user", "no id").msgid is None
    assert mem.get(KEY)[-1].msgid is None


def test_summarize_begin_and_lease(mem):
    for i in range(1, 7):
        mem.append(KEY, "user", f"message {i}", maxmsgs=6)
    b = mem.summarize_begin(KEY, 10_000, keep=2)
    assert isinstance(b, SummarizeBegin)
    # (SPEC v3: a token is never granted twice for a key name, so not 1.)
    assert (b.summarize, b.upto) == (True, 4) and b.lease > 0
    assert b.lease_expires > time.time() * 1000
    other = mem.summarize_begin(KEY, 10_000, keep=2)
    assert (other.lease, other.lease_expires) == (0, b.lease_expires)
    with pytest.raises(redis.ResponseError, match="LEASED"):
        mem.summarize(KEY, 4, "not mine")
    r = mem.summarize(KEY, 4, "mine", lease=b.lease)
    assert (r.id, r.duplicate) == (4, False)
    # Resent after its reply was lost: recognised.
    assert mem.summarize(KEY, 4, "mine", lease=b.lease).duplicate is True
    assert mem.summarize_begin(KEY, 10_000, keep=2).lease == 0  # nothing due


def test_summarize_check_keeps_tool_result_with_its_call(mem):
    mem.append(KEY, "user", "weather?")
    mem.append(KEY, "assistant", "", meta={"tool_calls": [{"id": "c1"}]})
    mem.append(KEY, "tool", "sunny", meta={"tool_call_id": "c1"})
    mem.append(KEY, "assistant", "It is sunny.")
    # keep=2 would start the kept part at the tool result: upto moves back.
    assert mem.summarize_check(KEY, keep=2).upto == 1


def test_extset_extget(mem, conn):
    assert mem.extset(KEY, "dify", "conv-123") is True
    assert mem.extget(KEY, "dify") == "conv-123"
    assert mem.extget(KEY, "n8n") is None
    assert mem.extget("mem:{nobody}", "dify") is None
    assert mem.extset(KEY, "n8n", "wf-9", ex=1000) is True
    assert sorted(mem.info(KEY).external) == ["dify", "n8n"]
    assert mem.extset(KEY, "dify", "conv-456") is True
    assert mem.extget(KEY, "dify") == "conv-456"
    assert conn.ttl(KEY) > 0


def test_import_json(mem, conn):
    doc = {
        "conversation_history": [
            {"role": "user", "content": "I like tea", "timestamp": "2024-05-01T10:00:00"},
            {"role": "assistant", "content": "Noted!", "timestamp": "2024-05-01T10:00:05Z"},
        ],
        "user_profile": {"name": "Ann", "lang": "en"},
        "context": {"topic": "drinks"},
    }
    r = mem.import_json(KEY, doc, model="gpt-4", ttl=600)
    assert (r.id, r.messages, r.trimmed) == (2, 2, 0)
    got = mem.get(KEY)
    assert [(m.id, m.role, m.content, m.ts) for m in got] == [
        (1, "user", "I like tea", 1714557600000),
        (2, "assistant", "Noted!", 1714557605000),
    ]
    assert r.total_tokens == sum(m.tokens for m in got)
    info = mem.info(KEY)
    assert (info.model, info.encoding, info.ttl) == ("gpt-4", "cl100k_base", 600)
    out = mem.get_json(KEY)
    assert out["user_profile"] == {"name": "Ann", "lang": "en"}
    assert out["context"] == {"topic": "drinks"}
    # The key exists: refused without REPLACE, nothing changed.
    with pytest.raises(redis.ResponseError, match="BUSYKEY"):
        mem.import_json(KEY, {"conversation_history": []})
    assert len(mem.get(KEY)) == 2
    # REPLACE, from JSON text; the FORMAT JSON document imports back.
    again = mem.import_json(KEY, json.dumps(out), replace=True)
    assert again.id == 2
    assert mem.get_json(KEY)["conversation_history"] == out["conversation_history"]
    with pytest.raises(redis.ResponseError, match="invalid document"):
        mem.import_json("mem:{bad}", {"history": []})
    assert conn.exists("mem:{bad}") == 0


def test_info(mem):
    assert mem.info("mem:{nobody}") is None
    t0 = int(time.time() * 1000)
    mem.append(KEY, "user", "a")
    mem.append(KEY, "user", "b")
    info = mem.info(KEY)
    assert (info.messages, info.first_id, info.last_id, info.summary_upto) == (2, 1, 2, 0)
    assert (info.model, info.encoding, info.context_window) == ("gpt-4o", "o200k_base", 128000)
    assert (info.maxtokens, info.maxmsgs, info.ttl) == (80000, 30, 86400)
    assert info.external == []
    assert abs(info.created - t0) < 60_000 and info.updated >= info.created
    assert info.total_tokens == sum(m.tokens for m in mem.get(KEY))


def test_from_url(clean):
    mem = RedisMemClient.from_url(clean.url, protocol=3)
    try:
        assert mem.append(KEY, "user", "hi").id == 1
        assert mem.delete(KEY) == 1
        assert mem.info(KEY) is None
    finally:
        mem.redis.close()


def test_attributes_round_trip_and_show_in_the_document(mem):
    assert mem.attrget(KEY, "user_profile") is None
    assert mem.attrget(KEY) == {}
    assert mem.attrset(KEY, "user_profile", {"name": "Ann", "langs": ["fr", "é"]})
    assert mem.attrset(KEY, "context", {"topic": "trip"})
    assert mem.attrset(KEY, "raw", '{"a": 1.50}', raw=True)
    assert mem.attrget(KEY, "user_profile") == {"name": "Ann", "langs": ["fr", "é"]}
    assert mem.attrget(KEY, "raw", raw=True) == '{"a": 1.50}'
    assert list(mem.attrget(KEY)) == ["user_profile", "context", "raw"]
    mem.append(KEY, "user", "hi")
    doc = mem.get_json(KEY)
    assert doc["user_profile"]["name"] == "Ann" and doc["context"] == {"topic": "trip"}
    assert mem.attrdel(KEY, "raw") is True
    assert mem.attrdel(KEY, "raw") is False
    with pytest.raises(redis.ResponseError):
        mem.attrset(KEY, "model", "x")
    with pytest.raises(redis.ResponseError):
        mem.attrset(KEY, "bad", "{", raw=True)
    assert list(mem.attrget(KEY)) == ["user_profile", "context"]


def test_maxage_evicts_old_messages(mem):
    now = int(time.time() * 1000)
    mem.append(KEY, "user", "recent", ts=now, maxage=3600)
    mem.append(KEY, "user", "old", ts=now - 2 * 3600 * 1000)
    r = mem.append(KEY, "user", "now", ts=now)
    assert (r.trimmed, r.messages) == (1, 2)
    assert [m.content for m in mem.get(KEY)] == ["recent", "now"]
    rs = mem.append_batch(KEY, [{"role": "user", "content": "a", "ts": now - 7200_000},
                                {"role": "user", "content": "b", "ts": now}], maxage=3600)
    assert rs[-1].trimmed == 1
    assert [m.content for m in mem.get(KEY)] == ["recent", "now", "b"]


@pytest.mark.skipif(int(redis.__version__.split(".")[0]) < 6, reason="redis-py 5 does not retry timeouts")
@pytest.mark.parametrize("auto_msgid,stored", [(True, 1), (False, 2)])
def test_a_request_resent_after_a_timeout_is_stored_once(clean, auto_msgid, stored):
    """The server stalls while an append is in flight; redis-py times out and
    resends it (its Retry covers timeouts). Both copies reach the server: with the
    client's MSGID one is recognised; without, the message is stored twice."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    flaky = redis.Redis(host="127.0.0.1", port=clean.port, decode_responses=True, socket_timeout=0.3,
                        retry=Retry(NoBackoff(), 3))  # redis-py 6+: timeouts are retried
    flaky.ping()
    stall = threading.Thread(target=lambda: clean.client().execute_command("DEBUG", "SLEEP", "0.8"))
    stall.start()
    time.sleep(0.1)
    RedisMemClient(flaky, auto_msgid=auto_msgid).append(KEY, "user", "Please book the 8pm table.")
    stall.join()
    got = RedisMemClient(clean.client()).get(KEY)
    assert [m.content for m in got] == ["Please book the 8pm table."] * stored
    flaky.close()


def test_is_summary_uses_the_summary_marker_when_the_module_sends_it(mem):
    """Issue 19 item 5: a message whose role is "summary" is not the summary."""
    from redis_mem._replies import Message as M

    new = [["id", 2, "role", "summary", "content", "S", "ts", 1, "tokens", 5, "summary", 1],
           ["id", 3, "role", "summary", "content", "a message", "ts", 1, "tokens", 5]]
    got = M.list_from_reply(new)
    assert [e.is_summary for e in got] == [True, False]
    # No marker anywhere (an older module): only a first "summary" entry is it.
    old = [x[:10] for x in new]
    assert [e.is_summary for e in M.list_from_reply(old)] == [True, False]
    assert [e.is_summary for e in M.list_from_reply(old[1:])] == [True]  # (ambiguous: first entry)
    # Live: AFTER returns no summary, whatever the module version.
    mem.append(KEY, "summary", "I am a message with a summary role")
    mem.append(KEY, "user", "x")
    mem.summarize(KEY, 1, "the real summary")
    entries = mem.get(KEY)
    assert [(e.is_summary, e.content) for e in entries] == [(True, "the real summary"), (False, "x")]
    mem.append(KEY, "summary", "another message with that role")
    entries = mem.get(KEY)
    assert [e.is_summary for e in entries] == [True, False, False]


def test_a_first_message_whose_role_is_summary_is_not_taken_for_the_summary(mem):
    """Hostile pass 25, F5: no summary, the first message's role "summary":
    no marker is the module's answer, and MEM.INFO settles it."""
    mem.append(KEY, "summary", "I am a message")
    mem.append(KEY, "user", "x")
    for entries in (mem.get(KEY), mem.get(KEY, last=5), mem.get(KEY, budget=1000)):
        assert [(e.is_summary, e.content) for e in entries] == [(False, "I am a message"), (False, "x")]
    mem.summarize(KEY, 1, "the real summary")
    assert [e.is_summary for e in mem.get(KEY)] == [True, False]
    # An older module's reply (no marker at all) is settled the same way.
    from redis_mem._replies import Message as M
    old = M.list_from_reply([["id", 1, "role", "summary", "content", "S", "ts", 1, "tokens", 5]])
    assert [e.is_summary for e in M.resolve_summary(old, 1)] == [True]
    assert [e.is_summary for e in M.resolve_summary(old, 0)] == [False]


def test_models_says_whether_the_count_is_exact_and_the_window(mem):
    claude = mem.models("claude-sonnet-4-5")
    assert isinstance(claude, ModelInfo)
    # No public tokenizer: counted with mem.default-encoding, not exact.
    assert (claude.model, claude.encoding, claude.exact, claude.context_window) == (
        "claude-sonnet-4-5", "o200k_base", False, 200000)
    assert (claude.entry, claude.source) == ("claude*", "builtin")
    gpt = mem.models("gpt-4o")
    assert (gpt.encoding, gpt.exact, gpt.context_window, gpt.entry) == ("o200k_base", True, 128000, "gpt-4o*")
    unknown = mem.models("no-such-model")
    assert (unknown.exact, unknown.context_window, unknown.entry, unknown.source) == (False, 0, None, "none")
