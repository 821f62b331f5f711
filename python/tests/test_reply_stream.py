"""ReplyStream / AsyncReplyStream against a real server with the module:
the stream layout, write / read / resume after an event id, XREAD BLOCK, the
stream's own TTL, MAXLEN, a finish stored once however often it is retried,
errors, and the async twin."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from redis_mem import (
    AsyncReplyStream,
    RedisMemClient,
    ReplyStream,
    ReplyStreamError,
    ReplyStreamGap,
    ReplyStreamTimeout,
    reply_stream_key,
    valid_event_id,
)


def wait_until(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def assistant_messages(r, key):
    return [m for m in RedisMemClient(r).get(key) if m.role == "assistant"]


# -- the layout -----------------------------------------------------------------


@pytest.mark.parametrize("session, expected", [
    ("mem:{alice}", "mem:{alice}:reply:r1"),
    ("chat:bob", "{chat:bob}:reply:r1"),
    ("a{b", "{a{b}:reply:r1"),
    (b"mem:{carol}", "mem:{carol}:reply:r1"),
])
def test_stream_key_is_in_the_session_slot(session, expected):
    key = reply_stream_key(session, "r1")
    assert key == expected
    raw = session if isinstance(session, bytes) else session.encode()
    assert key_slot(key.encode()) == key_slot(raw)


@pytest.mark.parametrize("session", ["a}b", "x{}y}", "x{}y{z", ""])
def test_stream_key_refused_when_no_key_shares_the_slot(session):
    with pytest.raises(ValueError):
        reply_stream_key(session, "r1")


def test_stream_fields_as_documented(r):
    s = ReplyStream(r, "mem:{alice}", "reply-1")
    first = s.write("Hel")
    s.write("lo")
    end = s.finish(meta={"model": "fake"})
    raw = r.xrange("mem:{alice}:reply:reply-1")
    assert [eid for eid, _ in raw][0] == first
    assert [fields for _, fields in raw] == [
        {"type": "chunk", "text": "Hel", "n": "0"},
        {"type": "chunk", "text": "lo", "n": "1"},
        {"type": "end", "msgid": "reply-1", "chunks": "2", "message_id": str(end.message_id),
         "meta": '{"model":"fake"}'},
    ]
    assert end.type == "end" and end.last and end.msgid == "reply-1" and end.meta == {"model": "fake"}
    assert end.chunks == 2 and [e.n for e in s.read()] == [0, 1, None]


# -- write / read / resume --------------------------------------------------------


def test_write_read_and_resume_after_an_id(conn):
    s = ReplyStream(conn, "mem:{alice}")
    ids = [s.write(t) for t in ["The ", "answer ", "is ", "42."]]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-")))) and len(set(ids)) == 4
    events = s.read()
    assert [e.id for e in events] == ids
    assert [e.text for e in events] == ["The ", "answer ", "is ", "42."]
    assert all(e.type == "chunk" and not e.last for e in events)
    # A reconnecting client sends the last id it saw: it gets the rest, nothing twice.
    other = ReplyStream(conn, "mem:{alice}", s.reply_id)
    assert [e.text for e in other.read(after=ids[1])] == ["is ", "42."]
    assert other.read(after=ids[-1]) == []
    assert [e.text for e in other.read(after=ids[0], count=2)] == ["answer ", "is "]
    end = s.finish(meta={"k": "v"})
    assert other.finish(text="The answer is 42.") == end  # the retry finds the end event (any reply shape)
    [last] = other.read(after=ids[-1])
    assert (last.id, last.type, last.msgid, last.meta) == (end.id, "end", s.reply_id, {"k": "v"})
    assert [m.content for m in RedisMemClient(conn).get("mem:{alice}")] == ["The answer is 42."]


def test_read_block_times_out_empty_then_wakes_on_a_write(r):
    s = ReplyStream(r, "mem:{alice}")
    last = s.write("first")
    assert s.read(after=last, block=50) == []
    got = []
    reader = threading.Thread(target=lambda: got.extend(
        ReplyStream(redis.Redis(port=r.connection_pool.connection_kwargs["port"], decode_responses=True),
                    "mem:{alice}", s.reply_id).read(after=last, block=0)))
    reader.start()
    # The reader blocks in XREAD BLOCK 0 until the write.
    wait_until(lambda: any(c.get("cmd") == "xread" for c in r.client_list()), what="the blocked XREAD")
    second = s.write("second")
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert [(e.id, e.text) for e in got] == [(second, "second")]


def test_events_follow_a_producer_and_resume(r):
    s = ReplyStream(r, "mem:{alice}")
    words = [f"w{i} " for i in range(30)]

    def produce():
        p = ReplyStream(redis.Redis(port=r.connection_pool.connection_kwargs["port"], decode_responses=True),
                        "mem:{alice}", s.reply_id)
        for w in words:
            p.write(w)
            time.sleep(0.005)
        p.finish()

    t = threading.Thread(target=produce)
    t.start()
    seen = []
    for event in s.events(block=100):
        seen.append(event)
        if len(seen) == 10:
            break  # the connection drops here
    resumed = list(ReplyStream(r, "mem:{alice}", s.reply_id).events(after=seen[-1].id, block=100))
    t.join(timeout=10)
    chunks = [e.text for e in seen + resumed if e.type == "chunk"]
    assert chunks == words
    assert resumed[-1].type == "end" and [e.type for e in resumed].count("end") == 1
    assert "".join(ReplyStream(r, "mem:{alice}", s.reply_id).chunks()) == "".join(words)
    assert [m.content for m in assistant_messages(r, "mem:{alice}")] == ["".join(words)]


def test_events_time_out_when_nothing_comes(r):
    s = ReplyStream(r, "mem:{alice}", "nobody-writes")
    with pytest.raises(ReplyStreamTimeout):
        list(s.events(block=20, idle_timeout=0.1))


# -- lifetime and length ----------------------------------------------------------


def test_stream_has_its_own_ttl_renewed_by_each_write(r):
    mem = RedisMemClient(r)
    mem.append("mem:{alice}", "user", "hi", ttl=86400)
    s = ReplyStream(r, "mem:{alice}", ttl=40)
    s.write("a")
    assert 0 < r.ttl(s.stream_key) <= 40
    r.expire(s.stream_key, 5)
    s.write("b")
    assert 5 < r.ttl(s.stream_key) <= 40  # renewed to the stream's ttl
    s.finish()
    assert 5 < s.ttl_left() <= 40
    assert r.ttl("mem:{alice}") > 40  # the session keeps its own lifetime
    with pytest.raises(ValueError):
        ReplyStream(r, "mem:{alice}", ttl=0)


def test_stream_expires_and_reply_stays_in_the_session(r):
    s = ReplyStream(r, "mem:{alice}", ttl=1)
    s.write("gone soon")
    s.finish()
    wait_until(lambda: r.exists(s.stream_key) == 0, what="the stream's expiry")
    assert [m.content for m in assistant_messages(r, "mem:{alice}")] == ["gone soon"]


def test_maxlen_exact_keeps_the_newest(r):
    s = ReplyStream(r, "mem:{alice}", maxlen=5, approximate=False)
    ids = [s.write(f"c{i}") for i in range(20)]
    assert r.xlen(s.stream_key) == 5
    assert [e.id for e in s.read()] == ids[-5:]


def test_a_reader_behind_what_maxlen_trimmed_is_told(r):
    s = ReplyStream(r, "mem:{alice}", maxlen=5, approximate=False)
    ids = [s.write(f"c{i} ") for i in range(20)]
    end = s.finish()  # the end event trims one more: c16 ... end are kept
    for after in ["0", ids[3], ids[14]]:  # c0..c15 were trimmed: the reader would miss some
        with pytest.raises(ReplyStreamGap) as gap:
            list(s.events(after=after))
        assert gap.value.after == after and gap.value.first_kept == ids[16]
    with pytest.raises(ReplyStreamError):  # a ReplyStreamError too
        list(s.chunks(after=ids[5]))
    # From a kept event on, nothing is missing.
    assert "".join(s.chunks(after=ids[16])) == "c17 c18 c19 "
    assert [e.id for e in s.events(after=ids[18])] == [ids[19], end.id]
    # A stream never trimmed: any id resumes (tested above), "0" too.
    t = ReplyStream(r, "mem:{alice}", maxlen=5, approximate=False)
    t.write("only")
    t.finish(text="")
    assert list(t.chunks()) == ["only"]
    assert [m.content for m in assistant_messages(r, "mem:{alice}")] == ["".join(f"c{i} " for i in range(20)), ""]


def test_maxlen_approximate_bounds_the_stream(r):
    s = ReplyStream(r, "mem:{alice}", maxlen=100)
    for i in range(1000):
        s.write(f"c{i}")
    assert 100 <= r.xlen(s.stream_key) < 1000
    assert s.read()[-1].text == "c999"


# -- finish / error -------------------------------------------------------------------


def test_finish_stores_the_reply_once_however_often_retried(r):
    mem = RedisMemClient(r)
    mem.append("mem:{alice}", "user", "Tell me a story")
    s = ReplyStream(r, "mem:{alice}", append_options={"model": "gpt-4o"})
    for t in ["Once ", "upon ", "a time."]:
        s.write(t)
    end = s.finish()
    assert s.finish() == end  # the same object again: nothing new
    # Another process retrying the finish (its first try's reply was lost).
    again = ReplyStream(r, "mem:{alice}", s.reply_id).finish(text="Once upon a time.")
    assert again.id == end.id
    stored = assistant_messages(r, "mem:{alice}")
    assert [(m.content, m.msgid) for m in stored] == [("Once upon a time.", s.reply_id)]
    assert end.message_id == stored[0].id
    assert [e.type for e in s.read()].count("end") == 1
    assert mem.info("mem:{alice}").messages == 2
    with pytest.raises(RuntimeError):
        s.write("more")


def test_finish_retried_before_its_end_event_was_written(r):
    """The first finish stored the message, then died before the end event:
    the retry stores nothing again and writes the end event."""
    s = ReplyStream(r, "mem:{alice}")
    s.write("partial ")
    s.write("answer")
    RedisMemClient(r).append("mem:{alice}", "assistant", "partial answer", msgid=s.reply_id)
    end = s.finish()
    assert end.type == "end"
    assert len(assistant_messages(r, "mem:{alice}")) == 1
    assert [e.type for e in s.read()] == ["chunk", "chunk", "end"]


def test_finish_with_store_false_stores_nothing(r):
    s = ReplyStream(r, "mem:{alice}", store=False)
    s.write("x")
    end = s.finish()
    assert end.message_id is None and RedisMemClient(r).get("mem:{alice}") == []


def test_finish_meta_goes_to_the_message(r):
    s = ReplyStream(r, "mem:{alice}")
    s.write("ok")
    s.finish(meta={"model": "fake", "finish_reason": "stop"})
    [m] = assistant_messages(r, "mem:{alice}")
    assert m.meta == {"model": "fake", "finish_reason": "stop"}


def test_error_ends_the_stream_and_stores_nothing(r):
    s = ReplyStream(r, "mem:{alice}")
    s.write("Let me ")
    s.error("provider timed out")
    events = s.read()
    assert [(e.type, e.text) for e in events] == [("chunk", "Let me "), ("error", "provider timed out")]
    assert events[-1].last
    with pytest.raises(ReplyStreamError, match="provider timed out"):
        list(ReplyStream(r, "mem:{alice}", s.reply_id).chunks())
    assert RedisMemClient(r).get("mem:{alice}") == []
    with pytest.raises(RuntimeError):
        s.finish()


# -- async ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3])
def test_async_reply_stream(clean, protocol):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port, protocol=protocol)
        try:
            s = AsyncReplyStream(ar, "mem:{bob}", ttl=60, append_options={"ttl": 3600})
            words = [f"t{i} " for i in range(12)]

            async def produce():
                p = AsyncReplyStream(ar, "mem:{bob}", s.reply_id, ttl=60)
                for w in words:
                    await p.write(w)
                    await asyncio.sleep(0.005)
                return await p.finish(text="".join(words))

            task = asyncio.create_task(produce())
            seen = []
            async for event in s.events(block=100):
                seen.append(event)
                if len(seen) == 4:
                    break
            rest = [e async for e in AsyncReplyStream(ar, "mem:{bob}", s.reply_id).events(after=seen[-1].id)]
            end = await task
            assert [e.text for e in seen + rest if e.type == "chunk"] == words
            assert rest[-1].id == end.id
            assert await s.read(after=end.id, block=20) == []
            assert 0 < await s.ttl_left() <= 60
            assert "".join([c async for c in s.chunks()]) == "".join(words)
            again = await AsyncReplyStream(ar, "mem:{bob}", s.reply_id).finish(text="".join(words))
            assert again.id == end.id
            with pytest.raises(ReplyStreamTimeout):
                [e async for e in AsyncReplyStream(ar, "mem:{bob}", "none").events(block=10, idle_timeout=0.05)]
            t = AsyncReplyStream(ar, "mem:{bob}", maxlen=2, approximate=False)
            for i in range(5):
                await t.write(str(i))
            with pytest.raises(ReplyStreamGap):
                [x async for x in t.events(idle_timeout=1)]
            e = AsyncReplyStream(ar, "mem:{bob}")
            await e.write("x")
            await e.error("boom")
            with pytest.raises(ReplyStreamError):
                [c async for c in e.chunks()]
        finally:
            await ar.aclose()

    asyncio.run(main())
    r = clean.client()
    assert [m.content for m in assistant_messages(r, "mem:{bob}")] == ["".join(f"t{i} " for i in range(12))]


def test_unknown_event_types_are_skipped_by_readers(r):
    """docs/STREAMS.md: a later version may add event types before the last one."""
    s = ReplyStream(r, "mem:{alice}")
    s.write("a")
    r.xadd(s.stream_key, {"type": "usage", "tokens": "12"})
    s.write("b")
    s.finish()
    assert [e.type for e in s.read()] == ["chunk", "usage", "chunk", "end"]
    assert [e.type for e in s.events()] == ["chunk", "chunk", "end"]
    assert list(s.chunks()) == ["a", "b"]


# -- cluster and ACL ------------------------------------------------------------------


def test_on_a_cluster_the_stream_lives_on_the_sessions_node(tmp_path):
    import shutil
    import subprocess

    from conftest import start_server
    from redis.cluster import RedisCluster

    cli = shutil.which("redis-cli")
    if not cli:
        pytest.fail("redis-cli is needed to create a cluster (Debian's redis-tools)")
    nodes = [start_server(str(tmp_path), ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf"])
             for i in range(3)]
    try:
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        wait_until(lambda: all("cluster_state:ok" in redis.Redis(port=n.port).execute_command("CLUSTER", "INFO")
                               .decode() for n in nodes), 30, "cluster_state:ok")
        rc = RedisCluster(host="127.0.0.1", port=nodes[0].port, decode_responses=True)
        try:
            owners = set()
            for session in ["mem:{alice}", "mem:{bob}", "mem:{carol}", "chat:dave", "chat:erin", "plain"]:
                s = ReplyStream(rc, session)
                s.write("Hi ")
                s.write(session)
                s.finish()
                node = rc.get_node_from_key(session)
                owners.add(node.port)
                # Both keys on the session's node (a cross-slot pair would have raised above).
                direct = redis.Redis(port=node.port, decode_responses=True)
                assert direct.type(s.stream_key) == "stream"
                assert direct.type(session) == "redis-mem"
                direct.close()
                assert "".join(ReplyStream(rc, session, s.reply_id).chunks()) == "Hi " + session
                assert [m.content for m in RedisMemClient(rc).get(session)] == ["Hi " + session]
            assert len(owners) >= 2
        finally:
            rc.close()
    finally:
        for n in nodes:
            n.stop()


def test_an_acl_user_of_the_sessions_pattern_with_the_stream_commands(r, clean):
    r.execute_command("ACL", "SETUSER", "app", "on", ">pw", "resetkeys", "~mem:*", "-@all",
                      "+mem.append", "+mem.get", "+xadd", "+xread", "+xrevrange", "+xinfo|stream", "+expire")
    try:
        app = clean.client(username="app", password="pw")
        s = ReplyStream(app, "mem:{alice}")
        s.write("allowed")
        s.finish()
        assert [e.type for e in ReplyStream(app, "mem:{alice}", s.reply_id).events()] == ["chunk", "end"]
        assert [m.content for m in RedisMemClient(app).get("mem:{alice}")] == ["allowed"]
        with pytest.raises(redis.exceptions.NoPermissionError):
            ReplyStream(app, "other:{x}").write("refused")  # outside the pattern
        app.close()
    finally:
        r.execute_command("ACL", "DELUSER", "app")


def test_event_ids_and_reply_ids_are_checked(r):
    assert [valid_event_id(x) for x in [None, "", "0", "17", "1796193606806-3", b"5-1"]] == [
        "0", "0", "0", "17", "1796193606806-3", "5-1"]
    for bad in ["x", "1-", "-1", "1-2-3", "$", ">", "1 2", "+"]:
        with pytest.raises(ValueError):
            valid_event_id(bad)
    s = ReplyStream(r, "mem:{alice}")
    s.write("a")
    with pytest.raises(ValueError):
        s.read(after="$")  # a client's Last-Event-ID is input, never passed to XREAD unchecked
    assert [e.text for e in s.read(after="0-0")] == ["a"]
    with pytest.raises(ValueError):
        ReplyStream(r, "mem:{alice}", "r" * 129)
    assert ReplyStream(r, "mem:{alice}", "r" * 128).reply_id == "r" * 128


# -- events lost when the stream is recreated --------------------------------------


def test_a_restart_without_persistence_mid_reply_is_a_gap(own_server):
    """Redis restarted (no RDB/AOF) after chunk 1: the producer goes on into a
    new stream; a reader resuming after chunk 1, or from 0, is told."""
    srv = own_server()
    r = srv.client()
    s = ReplyStream(r, "mem:{alice}", "r-restart")
    ids = [s.write("c0 "), s.write("c1 ")]
    srv.stop()
    srv.start_again()
    r2 = srv.client()
    s.redis = s.mem.redis = r2                      # the producer's reconnected client
    s.write("c2 ")
    s.write("c3 ")
    end = s.finish()
    reader = ReplyStream(r2, "mem:{alice}", "r-restart")
    with pytest.raises(ReplyStreamGap) as gap:
        list(reader.chunks(after=ids[1]))
    assert gap.value.after == ids[1] and "no longer holds" in str(gap.value)
    with pytest.raises(ReplyStreamGap, match="chunk 2 came where chunk 0 was due"):
        list(reader.chunks(after="0"))
    # The text is in the session once finished (this one: what the producer wrote).
    assert [m.content for m in assistant_messages(r2, "mem:{alice}")] == ["c0 c1 c2 c3 "]
    assert end.chunks == 4
    r.close()
    r2.close()


def test_a_finish_after_the_stream_expired_is_a_gap(r):
    s = ReplyStream(r, "mem:{alice}", ttl=1)
    s.write("lost ")
    s.write("chunks")
    wait_until(lambda: r.exists(s.stream_key) == 0, what="the stream's expiry")
    end = s.finish()
    assert end.chunks == 2
    reader = ReplyStream(r, "mem:{alice}", s.reply_id)
    with pytest.raises(ReplyStreamGap, match="2 chunks"):
        list(reader.chunks(after="0"))
    assert [m.content for m in assistant_messages(r, "mem:{alice}")] == ["lost chunks"]


def test_a_resume_after_an_id_the_stream_never_held_is_a_gap(r):
    s = ReplyStream(r, "mem:{alice}")
    ids = [s.write(f"c{i} ") for i in range(3)]
    s.finish()
    assert "".join(s.chunks(after=ids[0])) == "c1 c2 "          # a held id: the rest
    with pytest.raises(ReplyStreamGap):
        list(s.events(after="1-1"))                            # never held
    with pytest.raises(ReplyStreamGap):
        list(ReplyStream(r, "mem:{alice}", "gone").events(after=ids[0], idle_timeout=0.1))

    async def main():
        ar = redis.asyncio.Redis(port=r.connection_pool.connection_kwargs["port"], decode_responses=True)
        try:
            a = AsyncReplyStream(ar, "mem:{alice}", s.reply_id)
            assert [t async for t in a.chunks(after=ids[1])] == ["c2 "]
            with pytest.raises(ReplyStreamGap):
                [t async for t in a.chunks(after="1-1")]
        finally:
            await ar.aclose()

    asyncio.run(main())


def test_an_old_producer_without_sequence_numbers_is_read_as_before(r):
    """Readers accept streams without ``n``/``chunks`` (a producer that
    predates them): nothing to check, nothing raised."""
    key = reply_stream_key("mem:{alice}", "old")
    first = r.xadd(key, {"type": "chunk", "text": "a"})
    r.xadd(key, {"type": "chunk", "text": "b"})
    r.xadd(key, {"type": "end", "msgid": "old"})
    s = ReplyStream(r, "mem:{alice}", "old")
    assert list(s.chunks()) == ["a", "b"]
    assert list(s.chunks(after=first)) == ["b"]


# -- hostile inputs ---------------------------------------------------------------


@pytest.mark.parametrize("bad", ["5\n", "5-1\n", "18446744073709551616", "1-18446744073709551616",
                                 "99999999999999999999", " 5", "5 ", "\n5"])
def test_valid_event_id_refuses_newlines_and_numbers_above_u64(bad):
    with pytest.raises(ValueError):
        valid_event_id(bad)


def test_valid_event_id_takes_u64_bounds():
    top = str((1 << 64) - 1)
    assert valid_event_id(top) == top and valid_event_id(f"{top}-{top}") == f"{top}-{top}"


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "tab\there", "nul\x00", "del\x7f", "\x1b[31m",
                                 "c1\x85", "line\u2028sep", "para\u2029sep"])
def test_reply_ids_with_control_characters_are_refused(r, bad):
    with pytest.raises(ValueError, match="control"):
        ReplyStream(r, "mem:{alice}", bad)
    with pytest.raises(redis.ResponseError, match="control"):   # the module's own rule, the same
        RedisMemClient(r).append("mem:{alice}", "assistant", "x", msgid=bad)
    assert ReplyStream(r, "mem:{alice}", "ok-é:1").reply_id == "ok-é:1"


# -- concurrent finish ------------------------------------------------------------


def test_two_processes_finishing_at_once_write_one_end_event(clean):
    """Two producers (separate processes) race finish() many times: one end
    event, one stored message, every time."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    r = clean.client()
    for run in range(15):
        reply_id = f"race-{run}"
        s = ReplyStream(r, "mem:{alice}", reply_id)
        s.write("both ")
        s.write("finish")
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_race_finish, args=(clean.port, reply_id, barrier)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        types = [e.type for e in s.read()]
        assert types == ["chunk", "chunk", "end"], (run, types)
    stored = assistant_messages(r, "mem:{alice}")
    assert [m.msgid for m in stored] == [f"race-{i}" for i in range(15)]
    r.close()


def _race_finish(port, reply_id, barrier):
    c = redis.Redis(port=port, decode_responses=True)
    s = ReplyStream(c, "mem:{alice}", reply_id)
    barrier.wait(30)
    s.finish(text="both finish")
    c.close()


def test_threads_finishing_at_once_write_one_end_event(r, clean):
    for run in range(20):
        s = ReplyStream(r, "mem:{alice}", f"t-{run}")
        s.write("x")
        barrier = threading.Barrier(4)
        results = []

        def go():
            c = clean.client()
            barrier.wait(10)
            results.append(ReplyStream(c, "mem:{alice}", s.reply_id).finish(text="x").id)
            c.close()

        threads = [threading.Thread(target=go) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(set(results)) == 1 and len(results) == 4
        assert [e.type for e in s.read()] == ["chunk", "end"]


# -- a reply over mem.max-message-bytes ------------------------------------------


def test_a_reply_over_max_message_bytes_is_stored_truncated(r, caplog):
    limit = int(r.config_get("mem.max-message-bytes")["mem.max-message-bytes"])
    s = ReplyStream(r, "mem:{alice}")
    piece = "é" * (1 << 19)                                    # 1 MB a chunk
    for _ in range(limit // len(piece.encode()) + 1):
        s.write(piece)
    full = s.text
    assert len(full.encode()) > limit
    with caplog.at_level("WARNING", logger="redis_mem.reply_stream"):
        end = s.finish(meta={"model": "m"})
    assert "over mem.max-message-bytes" in caplog.text
    [stored] = assistant_messages(r, "mem:{alice}")
    assert len(stored.content.encode()) <= limit
    assert stored.content.endswith("over mem.max-message-bytes)]") and full.startswith(stored.content[:1000])
    assert stored.meta == {"model": "m", "redis_mem_truncated": len(full.encode())}
    assert end.meta["redis_mem_truncated"] == len(full.encode()) and end.message_id == stored.id
    # The stream keeps it whole until its TTL.
    assert "".join(ReplyStream(r, "mem:{alice}", s.reply_id).chunks()) == full
    assert s.finish() == end                                   # retried: nothing new
