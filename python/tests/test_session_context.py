"""SessionContext / AsyncSessionContext: the seed's 1 h session-context
layer as a session attribute with its own lifetime (MEM.ATTRSET ... EX),
against a real server with the module, over every connection kind."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis.asyncio

from redis_mem import AsyncSessionContext, RedisMemClient, SessionContext

KEY = "mem:{ctx}"


def wait_for(what, cond, limit=30.0):
    """Polls cond() until true; fails after `limit` seconds (a bound against
    hanging, not a timing assertion)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for: {what}")


def test_set_get_update_delete(conn):
    mem = RedisMemClient(conn)
    mem.append(KEY, "user", "hi")
    ctx = SessionContext(conn, KEY)
    assert (ctx.ttl, ctx.name) == (3600, "context")
    assert ctx.get() is None
    ctx.set({"channel": "web", "step": "search", "lang": "é"})
    assert ctx.get() == {"channel": "web", "step": "search", "lang": "é"}
    assert ctx.update({"step": "book", "lang": None}) == {"channel": "web", "step": "book"}
    assert ctx.get() == {"channel": "web", "step": "book"}
    # It is the session's `context` member: FORMAT JSON shows it beside the history.
    assert mem.get_json(KEY)["context"] == {"channel": "web", "step": "book"}
    assert [m.content for m in mem.get(KEY)] == ["hi"]
    assert ctx.delete() is True
    assert ctx.get() is None
    assert ctx.delete() is False
    # Any JSON value; an update of a non-dict starts from the patch.
    ctx.set(["a", 1])
    assert ctx.get() == ["a", 1]
    assert ctx.update({"x": 1}) == {"x": 1}


def test_the_context_expires_on_its_own_and_the_session_stays(conn):
    mem = RedisMemClient(conn)
    mem.append(KEY, "user", "remember me", ttl=86400)
    ctx = SessionContext(mem, KEY, ttl=1)
    other = SessionContext(mem, KEY, ttl=None, name="user_profile")
    ctx.set({"step": "search"})
    other.set({"name": "Ann"})
    assert ctx.get() == {"step": "search"}
    wait_for("the context's 1 s lifetime to end", lambda: ctx.get() is None)
    # Gone from every read: by name, the map of all, FORMAT JSON.
    assert mem.attrget(KEY) == {"user_profile": {"name": "Ann"}}
    doc = mem.get_json(KEY)
    assert "context" not in doc and doc["user_profile"] == {"name": "Ann"}
    # The session and its history live on with their own 24 h.
    assert [m.content for m in mem.get(KEY)] == ["remember me"]
    assert 0 < conn.pttl(KEY) <= 86400 * 1000


def test_a_set_without_a_lifetime_clears_the_old_one(r):
    """As Redis SET: a later ATTRSET without EX leaves no lifetime."""
    mem = RedisMemClient(r)
    mem.attrset(KEY, "context", {"v": 1}, ex=1)
    mem.attrset(KEY, "context", {"v": 2})           # no EX: lives with the session
    control = SessionContext(mem, KEY, ttl=1, name="control")
    control.set({"v": 0})
    wait_for("the control attribute's 1 s lifetime to end", lambda: control.get() is None)
    assert mem.attrget(KEY, "context") == {"v": 2}


def test_every_write_renews_the_lifetime(r):
    """A context set with EX 1, then renewed by update before it ends, is
    there after the first lifetime would have ended (a control set at the
    same time is gone)."""
    ctx = SessionContext(r, KEY, ttl=2)
    control = SessionContext(r, KEY, ttl=2, name="control")
    ctx.set({"n": 0})
    control.set({"n": 0})
    # Renew with a 30 s lifetime before the 2 s one ends.
    SessionContext(r, KEY, ttl=30).update({"n": 1})
    wait_for("the control attribute to expire", lambda: control.get() is None)
    assert ctx.get() == {"n": 1}


def test_concurrent_updates_lose_nothing(clean):
    """Two nodes updating the context at once (WATCH/MULTI): every member set
    by either is there, while appends change the session meanwhile."""
    clients = [clean.client(), clean.client(), clean.client()]
    RedisMemClient(clients[0]).append(KEY, "user", "start")
    errors = []

    def node(client, prefix):
        try:
            ctx = SessionContext(client, KEY)
            for i in range(25):
                ctx.update({f"{prefix}{i}": i})
        except Exception as e:  # reported below
            errors.append(e)

    def appender(client):
        mem = RedisMemClient(client)
        for i in range(25):
            mem.append(KEY, "user", f"msg {i}")

    threads = [threading.Thread(target=node, args=(clients[0], "a")),
               threading.Thread(target=node, args=(clients[1], "b")),
               threading.Thread(target=appender, args=(clients[2],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    got = SessionContext(clients[0], KEY).get()
    assert got == {**{f"a{i}": i for i in range(25)}, **{f"b{i}": i for i in range(25)}}
    for c in clients:
        c.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_async_session_context(clean, protocol):
    async def main():
        r = redis.asyncio.Redis(host="127.0.0.1", port=clean.port, protocol=protocol)
        try:
            ctx = AsyncSessionContext(r, KEY, ttl=1)
            assert await ctx.get() is None
            await ctx.set({"step": "search", "who": "Ann"})
            assert await ctx.get() == {"step": "search", "who": "Ann"}
            assert await ctx.update({"step": "book"}) == {"step": "book", "who": "Ann"}
            deadline = time.monotonic() + 30
            while await ctx.get() is not None:
                assert time.monotonic() < deadline, "the async context never expired"
                await asyncio.sleep(0.05)
            await ctx.set([1, 2])
            assert await ctx.delete() is True
            assert await ctx.get() is None
        finally:
            await r.aclose()

    asyncio.run(main())


def test_bad_arguments(r):
    with pytest.raises(ValueError):
        SessionContext(r, "")
    with pytest.raises(ValueError):
        SessionContext(r, KEY, ttl=0)
    with pytest.raises(ValueError):
        SessionContext(r, KEY, name="")


def test_expires_at_is_the_contexts_own_end(r):
    def server_ms():
        sec, usec = r.time()
        return sec * 1000 + usec // 1000

    ctx = SessionContext(r, KEY)                 # 1 h
    assert ctx.expires_at() is None              # not set
    before = server_ms()
    ctx.set({"step": "search"})
    at = ctx.expires_at()
    assert before + 3600_000 <= at <= server_ms() + 3600_000
    # The key's expiry is never earlier than the context's.
    assert r.pttl(KEY) >= at - server_ms() - 1000
    forever = SessionContext(r, KEY, ttl=None, name="user_profile")
    forever.set({"name": "Ann"})
    assert forever.expires_at() is None          # lives with the session
    ctx.delete()
    assert ctx.expires_at() is None

    async def main():
        ar = redis.asyncio.Redis(host="127.0.0.1", port=r.connection_pool.connection_kwargs["port"])
        try:
            actx = AsyncSessionContext(ar, KEY, ttl=60)
            assert await actx.expires_at() is None
            await actx.set(1)
            at = await actx.expires_at()
            assert server_ms() < at <= server_ms() + 60_000
        finally:
            await ar.aclose()

    asyncio.run(main())


def test_update_of_256_kb_or_more_fails_clearly_and_writes_nothing(conn):
    """The module refuses a WATCH/MULTI ATTRSET of 256 KB or more (checked off
    the main thread): update() says so, naming set(), before writing."""
    ctx = SessionContext(conn, KEY)
    ctx.set({"step": "search"})
    big = "x" * (256 << 10)
    with pytest.raises(ValueError, match=r"256 KB.*set\(\)"):
        ctx.update({"blob": big})
    assert ctx.get() == {"step": "search"}           # untouched
    # Just under the threshold still updates atomically.
    small = "y" * ((256 << 10) - 100)
    assert ctx.update({"blob": small})["blob"] == small
    # A context already 256 KB or more: update() refuses, set() works.
    ctx.set({"blob": big})
    with pytest.raises(ValueError, match=r"set\(\)"):
        ctx.update({"step": "book"})
    assert ctx.get() == {"blob": big}
    assert ctx.update({"blob": None}) == {}             # shrinking back under it works

    async def main():
        ar = redis.asyncio.Redis(host="127.0.0.1", port=conn.connection_pool.connection_kwargs["port"])
        try:
            actx = AsyncSessionContext(ar, KEY)
            await actx.set({"a": 1})
            with pytest.raises(ValueError, match=r"set\(\)"):
                await actx.update({"blob": big})
            assert await actx.get() == {"a": 1}
        finally:
            await ar.aclose()

    if hasattr(conn, "connection_pool"):
        asyncio.run(main())
