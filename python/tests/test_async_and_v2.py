"""AsyncRedisMemClient (redis.asyncio) against the real module, the same
commands as the sync client byte for byte; TOKENS and MEM.COUNT (SPEC v2);
the ConversationIds helper (MEM.EXTSET/EXTGET) sync and async."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from redis_mem import AsyncConversationIds, AsyncRedisMemClient, ConversationIds, RedisMemClient
from redis_mem import _commands as c

KEY = "mem:{async}"


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("protocol", [2, 3])
def test_async_client_covers_every_command(clean, protocol):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port, protocol=protocol)
        mem = AsyncRedisMemClient(ar)
        try:
            a = await mem.append(KEY, "user", "hello there", meta={"k": 1}, maxmsgs=6, msgid="m1")
            dup = await mem.append(KEY, "user", "hello there", msgid="m1")
            batch = await mem.append_batch(KEY, [{"role": "assistant", "content": f"r{i}"} for i in range(5)])
            got = await mem.get(KEY, last=2)
            doc = await mem.get_json(KEY)
            check = await mem.summarize_check(KEY, keep=2)
            begin = await mem.summarize_begin(KEY, 10_000, keep=2)
            summ = await mem.summarize(KEY, begin.upto, "summary", lease=begin.lease)
            ok = await mem.extset(KEY, "dify", "conv-1", ex=60)
            ext = await mem.extget(KEY, "dify")
            await mem.attrset(KEY, "user_profile", {"name": "A"})
            attr = await mem.attrget(KEY, "user_profile")
            attrs = await mem.attrget(KEY)
            deleted = await mem.attrdel(KEY, "user_profile")
            info = await mem.info(KEY)
            imp = await mem.import_json("mem:{imp}", {"conversation_history": [{"role": "user", "content": "x"}]})
            missing = await mem.info("mem:{none}")
            gone = await mem.delete("mem:{imp}")
            return locals()
        finally:
            await ar.aclose()

    v = run(main())
    assert v["a"].id == 1 and v["a"].msgid == "m1" and v["dup"].duplicate
    assert [b.id for b in v["batch"]] == [2, 3, 4, 5, 6] and v["batch"][-1].summarize
    assert [m.content for m in v["got"]] == ["r3", "r4"]
    assert v["doc"]["conversation_history"][0]["meta"] == {"k": 1}
    assert v["check"].summarize and v["begin"].lease > 0 and v["summ"].id == v["begin"].upto
    assert v["ok"] and v["ext"] == "conv-1"
    assert v["attr"] == {"name": "A"} and v["attrs"] == {"user_profile": {"name": "A"}} and v["deleted"]
    assert v["info"].summary_upto == v["begin"].upto and v["info"].external == ["dify"]
    assert v["imp"].messages == 1 and v["missing"] is None and v["gone"] == 1


def test_sync_and_async_send_the_same_commands():
    # One command table: both clients build their arguments from it.
    args, _ = c.append("k", "user", "hi", 5, {"a": 1}, "gpt-4o", 60, 100, 10, 3600, "id-1", 7)
    assert args == ["MEM.APPEND", "k", "user", "hi", "TS", 5, "META", '{"a":1}', "MODEL", "gpt-4o", "TTL", 60,
                    "MAXTOKENS", 100, "MAXMSGS", 10, "MAXAGE", 3600, "MSGID", "id-1", "TOKENS", 7]
    assert c.count("gpt-4o", "hello")[0] == ["MEM.COUNT", "gpt-4o", "hello"]


def test_append_with_tokens_given(r):
    mem = RedisMemClient(r)
    res = mem.append("mem:{tok}", "user", "a message counted by the provider", tokens=42)
    assert res.tokens == 42 and res.total_tokens == 42
    assert mem.get("mem:{tok}")[0].tokens == 42


def test_count(r):
    mem = RedisMemClient(r)
    n = mem.count("gpt-4o", "hello world")
    assert n == 2  # o200k_base: "hello", " world"
    # The same count an append makes of its content (3 + role + content).
    assert mem.append("mem:{cnt}", "user", "hello world", model="gpt-4o").tokens == 3 + mem.count("gpt-4o", "user") + n
    # With a role: the message's count, as MEM.APPEND makes it.
    assert mem.count("gpt-4o", "hello world", role="user") == 3 + mem.count("gpt-4o", "user") + n


def test_append_batch_items_take_the_providers_tokens(r):
    mem = RedisMemClient(r)
    got = mem.append_batch("mem:{btok}", [{"role": "assistant", "content": "counted by the provider", "tokens": 77},
                                          {"role": "user", "content": "counted by the module"}])
    assert got[0].tokens == 77
    assert got[1].tokens == 3 + mem.count("gpt-4o", "user") + mem.count("gpt-4o", "counted by the module")
    assert [e.tokens for e in mem.get("mem:{btok}")] == [77, got[1].tokens]


def test_async_tokens_and_count(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            mem = AsyncRedisMemClient(ar)
            return await mem.append("mem:{atok}", "user", "x", tokens=9), await mem.count("gpt-4o", "hello world")
        finally:
            await ar.aclose()

    res, n = run(main())
    assert res.tokens == 9 and n == 2


def test_conversation_ids(r):
    ids = ConversationIds(r, "dify", ex=120)
    assert ids.get("alice") is None
    ids.remember("alice", "dify-conv-1")
    assert ids.get("alice") == "dify-conv-1"
    assert RedisMemClient(r).extget("mem:{alice}", "dify") == "dify-conv-1"
    # The session key's expiry covers the id's.
    assert 0 < r.ttl("mem:{alice}")
    n8n = ConversationIds(r, "n8n")
    made = []
    assert n8n.get_or_create("alice", lambda: made.append(1) or "n8n-session-7") == "n8n-session-7"
    assert n8n.get_or_create("alice", lambda: made.append(1) or "other") == "n8n-session-7"
    assert made == [1]
    assert sorted(RedisMemClient(r).info("mem:{alice}").external) == ["dify", "n8n"]
    with pytest.raises(ValueError):
        ids.remember("alice", "")


def test_async_conversation_ids(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port, decode_responses=True)
        try:
            ids = AsyncConversationIds(ar, "dify")
            first = await ids.get("bob")
            await ids.remember("bob", "c-9")
            return first, await ids.get("bob"), await ids.get_or_create("bob", lambda: "new")
        finally:
            await ar.aclose()

    assert run(main()) == (None, "c-9", "c-9")


def test_async_get_or_create_with_an_async_factory(clean):
    """Issue 19 finding 11: an async factory (asking the orchestrator) works."""
    async def main():
        ar = redis.asyncio.Redis(port=clean.port)
        try:
            ids = AsyncConversationIds(redis_client=ar, system="n8n")
            calls = []

            async def new_session():
                calls.append(1)
                await asyncio.sleep(0)
                return "n8n-async-1"

            first = await ids.get_or_create("dave", new_session)
            again = await ids.get_or_create("dave", new_session)
            return first, again, calls
        finally:
            await ar.aclose()

    first, again, calls = run(main())
    assert (first, again, calls) == ("n8n-async-1", "n8n-async-1", [1])
    assert RedisMemClient(clean.client()).extget("mem:{dave}", "n8n") == "n8n-async-1"
    sync = ConversationIds(system="n8n", redis_url=clean.url)
    assert sync.get("dave") == "n8n-async-1"


@pytest.mark.parametrize("protocol", [2, 3])
def test_meta_text_goes_in_as_written_and_json_text_round_trips_exactly(clean, protocol):
    """Hostile pass 40 F2: append_batch parsed a META given as text and
    wrote it again (1.0000000000000001 became 1.0, 1E2 100.0), and
    get_json -> import_json did the same to every META; get_json_text ->
    import_json is exact, on the sync and the async client alike."""
    meta = '{"discord_user":123456789012345678901,"x":1.0000000000000001,"y":1E2}'
    kw = dict(port=clean.port, protocol=protocol)
    mem = RedisMemClient(redis.Redis(**kw))
    mem.append("mem:{raw}", "user", "one", meta=meta)
    mem.append_batch("mem:{raw}", [{"role": "user", "content": "two", "meta": meta},
                                   {"role": "user", "content": "three", "meta": meta.encode()}])
    for bad in ("{nope", '{"a":NaN}', "Infinity"):
        with pytest.raises(ValueError):
            mem.append_batch("mem:{raw}", [{"role": "user", "content": "bad", "meta": bad}])
    doc = mem.get_json_text("mem:{raw}")
    assert doc.count(meta) == 3, doc
    mem.import_json("mem:{copy}", doc)
    assert mem.get_json_text("mem:{copy}") == doc

    async def main():
        amem = AsyncRedisMemClient(redis.asyncio.Redis(**kw))
        await amem.append_batch("mem:{araw}", [{"role": "user", "content": "two", "meta": meta}])
        text = await amem.get_json_text("mem:{araw}")
        await amem.redis.aclose()
        return text
    assert run(main()).count(meta) == 1
