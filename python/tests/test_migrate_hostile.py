"""Issue 19, findings 1-3 and 11: the migration on hostile data, against the
real module. It never renames from the pattern, never overwrites what it did
not create, never drops messages, keeps timestamps and lifetimes, predicts
its failures in the dry run, and deletes only verified sources."""

from __future__ import annotations

import json
import time

import pytest
import redis

import redis_mem.migrate as mig
from redis_mem import RedisMemClient

from test_migrate_langchain import write_community


def doc(*contents, **extra):
    return json.dumps({"conversation_history": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)], **extra})


def module_has_import_caps(r) -> bool:
    try:
        r.execute_command("MEM.IMPORT", "probe:{caps}", '{"conversation_history":[]}', "MAXMSGS", 100)
    except redis.ResponseError as e:
        if "unknown option" in str(e):
            return False
        raise
    r.delete("probe:{caps}")
    return True


def statuses(report):
    return {x.source: (x.status.replace(mig.WOULD_MOVE, mig.MOVED), x.reason) for x in report.results}


# -- finding 1: the target name ------------------------------------------------

def test_target_is_the_id_after_the_source_prefix_whatever_the_pattern(r):
    r.set("user_memory_alice", doc("I am Alice"))
    r.set("user_memory_bob", doc("I am Bob"))
    one = mig.migrate(r, pattern="user_memory_bob", replace=True)
    assert [(x.source, x.target, x.status) for x in one.results] == [("user_memory_bob", "mem:{bob}", mig.MOVED)]
    glob = mig.migrate(r, pattern="user_memory_al*")
    assert [(x.source, x.target) for x in glob.results] == [("user_memory_alice", "mem:{alice}")]
    assert not r.exists("mem:{}") and not r.exists("mem:{ice}")
    assert RedisMemClient(r).get("mem:{bob}")[0].content == "I am Bob"


def test_an_id_holding_a_placeholder_is_not_substituted_again(r):
    r.set("user_memory_<key>", doc("tricky"))
    rep = mig.migrate(r, target_template="chat:<id>:of:<key>")
    assert [(x.target, x.status) for x in rep.results] == [("chat:<key>:of:user_memory_<key>", mig.MOVED)]


def test_a_key_outside_the_prefix_or_with_an_empty_id_fails_and_is_kept(r):
    r.set("user_memory_", doc("nobody"))
    r.set("legacy_1", doc("x"))
    rep = mig.migrate(r, pattern="*", delete_source=True)
    by = {x.source: x for x in rep.results}
    assert by["user_memory_"].status == mig.FAILED and "empty session id" in by["user_memory_"].reason
    assert by["legacy_1"].status == mig.FAILED and "source prefix" in by["legacy_1"].reason
    assert r.exists("user_memory_", "legacy_1") == 2
    assert [k for k in r.scan_iter("mem:*")] == []


def test_never_overwrites_a_session_it_did_not_create_unless_replace(r):
    mem = RedisMemClient(r)
    mem.append("mem:{carol}", "user", "the live session")
    r.set("user_memory_carol", doc("old history"))
    rep = mig.migrate(r, delete_source=True)
    assert [(x.status, x.reason, x.deleted) for x in rep.results] == [
        (mig.SKIPPED, mig._TARGET_EXISTS, False)]
    assert [m.content for m in mem.get("mem:{carol}")] == ["the live session"]
    assert r.exists("user_memory_carol")
    dry = mig.migrate(r, replace=True, dry_run=True)
    assert dry.results[0].replaced and "would replace" in dry.render()
    assert [m.content for m in mem.get("mem:{carol}")] == ["the live session"]
    rep = mig.migrate(r, replace=True)
    assert rep.results[0].replaced and "REPLACED" in rep.render() and "replaced 1" in rep.render()
    assert rep.to_dict()["replaced"] == 1
    assert [m.content for m in mem.get("mem:{carol}")] == ["old history"]


def test_replace_never_overwrites_a_key_that_is_not_a_session(r):
    """Hostile pass 28 F12/F13: --replace overwrote any type (an app's hash,
    in the dry run's verdict too), and a target template whose names match
    the pattern renamed one source onto another, unmigrated one."""
    r.hset("mem:{dora}", mapping={"app": "data"})
    r.set("user_memory_dora", doc("history"))
    for dry in (True, False):
        rep = mig.migrate(r, pattern="user_memory_dora", replace=True, dry_run=dry, delete_source=True)
        res = rep.results[0]
        assert res.status == mig.FAILED and "holds a hash, not a redis-mem session" in res.reason, res.reason
        assert not res.replaced and not res.deleted
    assert r.hgetall("mem:{dora}") == {"app": "data"} and r.exists("user_memory_dora")
    # Sources whose targets are other sources of the same run.
    r.set("user_memory_a", doc("a's history"))
    r.set("user_memory_a_v2", doc("a_v2's history"))
    rep = mig.migrate(r, pattern="user_memory_a*", target_template="user_memory_<id>_v2", replace=True)
    by = {x.source: x for x in rep.results}
    assert by["user_memory_a"].status == mig.FAILED and "holds a string" in by["user_memory_a"].reason
    assert by["user_memory_a_v2"].status == mig.MOVED
    assert json.loads(r.get("user_memory_a"))["conversation_history"][0]["content"] == "a's history"
    assert json.loads(r.get("user_memory_a_v2"))["conversation_history"][0]["content"] == "a_v2's history"
    assert RedisMemClient(r).get("user_memory_a_v2_v2")[0].content == "a_v2's history"
    assert rep.failed  # the command exits 1


# -- finding 2: never truncate -----------------------------------------------

def test_a_5000_message_history_is_imported_whole_or_not_at_all(r):
    history = [f"message {i}" for i in range(5000)]
    r.set("user_memory_huge", doc(*history))
    dry = mig.migrate(r, dry_run=True, delete_source=True)
    real = mig.migrate(r, delete_source=True)
    assert statuses(dry) == statuses(real)  # the dry run predicted it exactly
    res = real.results[0]
    if module_has_import_caps(r):
        assert (res.status, res.messages, res.deleted) == (mig.MOVED, 5000, True)
        assert "MAXMSGS 5000" in res.caps and "imported whole" in real.render()
        info = RedisMemClient(r).info("mem:{huge}")
        # The token cap is what the history needs (or the default), not the bound.
        assert info.maxmsgs == 5000 and info.maxtokens == max(80000, info.total_tokens)
        got = RedisMemClient(r).get("mem:{huge}")
        assert [m.content for m in got] == history
    else:  # an older module: refused, nothing lost
        assert res.status == mig.FAILED and "upgrade the module" in res.reason
        assert not r.exists("mem:{huge}")
        assert len(json.loads(r.get("user_memory_huge"))["conversation_history"]) == 5000


def test_a_2000_message_langchain_list_is_imported_whole_or_not_at_all(r):
    from langchain_core.messages import AIMessage, HumanMessage
    msgs = [HumanMessage(f"q{i}") if i % 2 == 0 else AIMessage(f"a{i}") for i in range(2000)]
    write_community(r, "long", msgs)
    dry = mig.migrate(r, source="langchain", dry_run=True)
    real = mig.migrate(r, source="langchain", delete_source=True)
    assert statuses(dry) == statuses(real)
    res = real.results[0]
    if module_has_import_caps(r):
        assert (res.status, res.messages, res.deleted) == (mig.MOVED, 2000, True)
        assert [m.content for m in RedisMemClient(r).get("mem:{long}")] == [m.content for m in msgs]
    else:
        assert res.status == mig.FAILED and r.llen("message_store:long") == 2000


def test_a_history_over_the_token_cap_gets_the_cap_it_needs(r):
    if not module_has_import_caps(r):
        pytest.skip("the module's MEM.IMPORT has no MAXTOKENS")
    history = [("word " * 2000) + str(i) for i in range(60)]  # ~120k tokens > 80000
    r.set("user_memory_wordy", doc(*history))
    rep = mig.migrate(r)
    res = rep.results[0]
    info = RedisMemClient(r).info("mem:{wordy}")
    assert res.status == mig.MOVED and info.messages == 60
    assert info.total_tokens > 80000 and info.maxtokens == info.total_tokens
    assert res.caps == f"imported whole: MAXMSGS 60 MAXTOKENS {info.total_tokens}"


def test_a_leading_tool_result_fails_instead_of_being_dropped(r):
    r.set("user_memory_tool", json.dumps({"conversation_history": [
        {"role": "tool", "content": "orphan result"}, {"role": "user", "content": "hi"}]}))
    dry = mig.migrate(r, dry_run=True)
    real = mig.migrate(r, delete_source=True)
    assert statuses(dry) == statuses(real)
    assert real.results[0].status == mig.FAILED and "tool result" in real.results[0].reason
    assert r.exists("user_memory_tool") and not r.exists("mem:{tool}")


# -- finding 3: timestamps, lifetimes, the dry run's prediction ---------------

def test_numeric_and_iso_timestamps_become_the_right_ms(r):
    r.set("user_memory_ts", json.dumps({"conversation_history": [
        {"role": "user", "content": "int s", "timestamp": 1700000000},
        {"role": "user", "content": "float s", "timestamp": 1700000000.25},
        {"role": "user", "content": "ms", "timestamp": 1700000000123},
        {"role": "user", "content": "string s", "timestamp": "1700000001"},
        {"role": "user", "content": "iso", "timestamp": "2024-05-01T10:00:00+02:00"},
        {"role": "user", "content": "iso Z", "timestamp": "2024-05-01T10:00:02.500Z"},
    ]}))
    rep = mig.migrate(r)
    assert rep.results[0].status == mig.MOVED, rep.render()
    assert [m.ts for m in RedisMemClient(r).get("mem:{ts}")] == [
        1700000000000, 1700000000250, 1700000000123, 1700000001000, 1714550400000, 1714557602500]


def test_the_source_ttl_is_carried_or_the_explicit_ttl(r):
    r.set("user_memory_short", doc("a"), ex=5000)
    r.set("user_memory_forever", doc("b"))
    r.set("user_memory_given", doc("c"), ex=100)
    rep = mig.migrate(r, pattern="user_memory_[fs]*")
    by = {x.source: x for x in rep.results}
    assert 4990 <= by["user_memory_short"].ttl <= 5000
    assert 4990 <= r.ttl("mem:{short}") <= 5000
    assert by["user_memory_forever"].ttl == 0 and r.ttl("mem:{forever}") == -1
    assert RedisMemClient(r).info("mem:{forever}").ttl == 0
    mig.migrate(r, pattern="user_memory_given", ttl=3600)
    assert RedisMemClient(r).info("mem:{given}").ttl == 3600 and r.ttl("mem:{given}") > 3000


def test_a_source_s_remaining_lifetime_expires_the_key_once_not_every_write(r):
    """Hostile pass 34, F2: a source with 60 s left became a session whose
    TTL setting was 60 s, so it expired a minute after every later turn.
    The key now gets the remaining lifetime once; the session's setting is
    the server's mem.ttl, or that lifetime when longer."""
    default = int(r.config_get("mem.ttl")["mem.ttl"])
    r.set("user_memory_soon", doc("a"), ex=60)
    r.set("user_memory_later", doc("b"), ex=default * 3)
    mig.migrate(r, pattern="user_memory_soon")
    mig.migrate(r, pattern="user_memory_later")
    c = RedisMemClient(r)
    assert 55 <= r.ttl("mem:{soon}") <= 60
    assert c.info("mem:{soon}").ttl == default
    assert default * 3 - 10 <= r.ttl("mem:{later}") <= default * 3
    assert default * 3 - 10 <= c.info("mem:{later}").ttl <= default * 3
    c.append("mem:{soon}", "user", "next turn")
    assert default - 10 <= r.ttl("mem:{soon}") <= default


HOSTILE = {
    "user_memory_notjson": b"{not json",
    "user_memory_binary": b'{"conversation_history":[{"role":"user","content":"\xff\xfe"}]}',
    "user_memory_array": b"[1, 2]",
    "user_memory_histstr": b'{"conversation_history": "hello"}',
    "user_memory_contentnum": b'{"conversation_history":[{"role":"user","content":42}]}',
    "user_memory_roleint": b'{"conversation_history":[{"role":7,"content":"x"}]}',
    "user_memory_tsbool": b'{"conversation_history":[{"role":"user","content":"x","timestamp":true}]}',
    "user_memory_tsjunk": b'{"conversation_history":[{"role":"user","content":"x","timestamp":"yesterday"}]}',
    "user_memory_surrogate": b'{"conversation_history":[{"role":"user","content":"a\\ud800b"}]}',
    "user_memory_metastr": b'{"conversation_history":[{"role":"user","content":"x","meta":"no"}]}',
    "user_memory_longrole": json.dumps({"conversation_history": [{"role": "r" * 65, "content": "x"}]}).encode(),
    "user_memory_deep": b'{"conversation_history":[],"context":' + b"[" * 5000 + b"]" * 5000 + b"}",
    "user_memory_good": doc("fine", "also fine").encode(),
}


def test_hostile_values_fail_with_a_reason_the_dry_run_predicted_and_stay(clean):
    r = clean.client(decode_responses=False)
    for k, v in HOSTILE.items():
        r.set(k, v)
    dry = mig.migrate(r, dry_run=True, delete_source=True)
    assert [k for k in r.scan_iter(b"mem:*")] == []
    real = mig.migrate(r, delete_source=True)
    assert statuses(dry) == statuses(real)
    by = {x.source: x for x in real.results}
    assert by["user_memory_good"].status == mig.MOVED and by["user_memory_good"].deleted
    for k in HOSTILE:
        if k == "user_memory_good":
            continue
        assert by[k].status == mig.FAILED and by[k].reason, k
        assert r.get(k) == HOSTILE[k], k
    assert "UTF-8" in by["user_memory_binary"].reason
    assert "surrogate" in by["user_memory_surrogate"].reason
    assert [k for k in r.scan_iter("mem:*")] == [b"mem:{good}"]  # no temporary key left


def test_a_decoding_client_is_fine_with_binary_sources(r):
    """migrate() with a decode_responses=True client reads the values as bytes."""
    r.set("user_memory_bin", b"\xff\xfe")
    r.set("user_memory_ok", doc("fine"))
    rep = mig.migrate(r)
    assert statuses(rep) == {"user_memory_bin": (mig.FAILED, "value is not valid UTF-8 (invalid start byte at byte 0)"),
                             "user_memory_ok": (mig.MOVED, "")}


# -- finding 11: the seed's external conversation ids ---------------------------

def test_external_ids_move_into_the_session_with_their_lifetime(clean):
    r = clean.client(decode_responses=False)
    mem = RedisMemClient(r)
    r.set("user_memory_alice", doc("hi"))
    mig.migrate(r)
    r.set("external:dify:conversation:alice", "dify-conv-1", ex=86000)
    r.set("external:n8n:conversation:bob", "n8n-sess-9", px=1500)
    r.set("external:other:conversation:carol", "x")
    r.set("external:dify:conversation:bin", b"\xff")
    dry = mig.migrate(r, source="external", dry_run=True)
    assert mem.extget("mem:{alice}", "dify") is None
    rep = mig.migrate(r, source="external", delete_source=True)
    assert statuses(dry) == statuses(rep)
    by = {x.source: x for x in rep.results}
    assert set(by) == {"external:dify:conversation:alice", "external:n8n:conversation:bob",
                       "external:dify:conversation:bin"}
    assert by["external:dify:conversation:alice"].status == mig.MOVED
    assert by["external:dify:conversation:bin"].status == mig.FAILED
    assert mem.extget("mem:{alice}", "dify") == "dify-conv-1"
    assert [m.content for m in mem.get("mem:{alice}")] == ["hi"]  # the history kept
    assert mem.extget("mem:{bob}", "n8n") == "n8n-sess-9"
    assert not r.exists("external:dify:conversation:alice", "external:n8n:conversation:bob")
    assert r.exists("external:other:conversation:carol", "external:dify:conversation:bin") == 2
    time.sleep(2.2)  # the 1.5 s the source had left were carried as EX
    assert mem.extget("mem:{bob}", "n8n") is None
    # No expiry at the source: the longest EX, not mem.ext-ttl's day (hostile pass 33 F4).
    r.set("external:dify:conversation:dan", "dify-forever")
    kept = mig.migrate(r, source="external", pattern="external:dify:conversation:dan", delete_source=True)
    assert kept.results[0].status == mig.MOVED and "100 years" in kept.results[0].reason
    info = mem.info("mem:{dan}")
    assert info.external_ttl is not None and info.external_ttl["dify"] > 3_153_000_000_000
    # Another id already there: kept unless --replace.
    r.set("external:dify:conversation:alice", "dify-conv-2", ex=100)
    again = mig.migrate(r, source="external", pattern="external:dify:conversation:alice")
    assert again.results[0].status == mig.SKIPPED and mem.extget("mem:{alice}", "dify") == "dify-conv-1"
    forced = mig.migrate(r, source="external", pattern="external:dify:conversation:alice", replace=True)
    assert forced.results[0].replaced and mem.extget("mem:{alice}", "dify") == "dify-conv-2"


@pytest.mark.parametrize("source", ["langchain-redis"])
def test_langchain_redis_documents_carry_their_ttl_and_ms_timestamps(r, source):
    from test_migrate_langchain import write_langchain_redis
    from langchain_core.messages import AIMessage, HumanMessage
    keys = write_langchain_redis(r, "dave", [HumanMessage("q"), AIMessage("a")], t0=1_700_000_000.5)
    for k in keys:
        r.expire(k, 700)
    rep = mig.migrate(r, source=source, delete_source=True)
    res = rep.results[0]
    assert res.status == mig.MOVED and 690 <= res.ttl <= 700 and res.deleted
    assert [m.ts for m in RedisMemClient(r).get("mem:{dave}")] == [1700000000500, 1700000001750]


def test_overflow_summarize_folds_the_oldest_messages_into_the_summary(r):
    """The explicit alternative to importing whole: the report says which."""
    if not module_has_import_caps(r):
        pytest.skip("the module's MEM.IMPORT has no MAXMSGS")
    history = [f"fact number {i}" for i in range(100)]
    r.set("user_memory_long", doc(*history), ex=900)
    folded = []

    def llm(previous, entries):
        folded.extend(entries)
        return f"SUMMARY of {len(entries)} messages, from {entries[0].content} to {entries[-1].content}"

    dry = mig.migrate(r, overflow="summarize", dry_run=True)
    assert not folded and "summarized into the session summary" in dry.results[0].caps
    rep = mig.migrate(r, overflow="summarize", summarize_fn=llm, delete_source=True)
    res = rep.results[0]
    assert res.status == mig.MOVED and res.deleted and res.caps == dry.results[0].caps
    n = len(folded)
    assert res.caps == f"{n} oldest messages summarized into the session summary, {100 - n} kept"
    entries = RedisMemClient(r).get("mem:{long}")
    assert entries[0].is_summary and entries[0].content == f"SUMMARY of {n} messages, from fact number 0 to " \
        f"fact number {n - 1}"
    assert [e.content for e in entries[1:]] == history[n:]
    info = RedisMemClient(r).info("mem:{long}")
    assert (info.maxmsgs, info.maxtokens) == (30, 80000) and info.messages == 100 - n <= 24
    assert 890 <= r.ttl("mem:{long}") <= 900
    # Without an LLM it fails and keeps the source.
    r.set("user_memory_long2", doc(*history))
    rep = mig.migrate(r, pattern="user_memory_long2", overflow="summarize", delete_source=True)
    assert rep.results[0].status == mig.FAILED and r.exists("user_memory_long2")
    assert not r.exists("mem:{long2}")
    # An LLM answer that is no summary (blank, not a str) fails the same way.
    for answer in ["  ", None, {"summary": "x"}]:
        rep = mig.migrate(r, pattern="user_memory_long2", overflow="summarize", delete_source=True,
                          summarize_fn=lambda p, m: answer)
        assert rep.results[0].status == mig.FAILED and "nothing written" in rep.results[0].reason
        assert r.exists("user_memory_long2") and not r.exists("mem:{long2}")


def test_a_source_that_expires_mid_run_is_not_given_a_new_lifetime(clean):
    """Found by the outside tester: a source read just before it expired had
    no PTTL left (-2) and its session got mem.ttl (24 h) instead: data the
    application had let expire came back for a day."""
    from langchain_core.messages import HumanMessage
    raw = clean.client(decode_responses=False)
    raw.set("user_memory_gone", doc("short-lived"), px=60_000)
    write_community(raw, "lc", [HumanMessage("hi")])
    raw.pexpire("message_store:lc", 60_000)
    real_pttl = raw.pttl

    def expire_first(name):
        raw.delete(name)  # the key expires right after the run read it
        return real_pttl(name)

    raw.pttl = expire_first  # type: ignore[method-assign]
    rep = mig.migrate(raw, pattern="user_memory_gone", delete_source=True)
    assert [(x.status, x.reason) for x in rep.results] == [(mig.SKIPPED, "source key expired or was deleted during the migration")]
    rep = mig.migrate(raw, source="langchain")
    assert [(x.status, x.reason) for x in rep.results] == [(mig.SKIPPED, "source keys expired or were deleted during the migration")]
    assert not raw.exists("mem:{gone}") and not raw.exists("mem:{lc}")


def test_ctrl_c_mid_run_then_a_rerun_finishes_and_deletes(clean, tmp_path):
    """Found by the outside tester: SIGINT during a --delete-source run of
    20,000 keys printed a KeyboardInterrupt traceback; a source whose
    session was renamed into place but not yet deleted was then 'skipped:
    target key exists (use --replace)' by every rerun, never deleted. Now the
    interrupted run says what holds, and a rerun recognizes the identical
    session and deletes the source."""
    import os
    import signal
    import subprocess
    import sys

    r = clean.client()
    with r.pipeline(transaction=False) as p:
        for i in range(4000):
            p.set(f"user_memory_u{i}", doc(f"hello {i}", "hi"))
        p.execute()
    # The window an interrupt can hit: renamed into place, source not deleted.
    r.set("user_memory_w", doc("in the window"))
    assert mig.migrate(r, pattern="user_memory_w").results[0].status == mig.MOVED
    w = mig.migrate(r, pattern="user_memory_w", delete_source=True).results[0]
    assert (w.status, w.deleted) == (mig.SKIPPED, True) and "already holds exactly this session" in w.reason
    assert not r.exists("user_memory_w") and r.exists("mem:{w}")
    script = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from redis_mem.migrate import main\nsys.exit(main())\n")
    state = str(tmp_path / "state")
    proc = subprocess.Popen([sys.executable, "-c", script, "--url", clean.url, "--delete-source", "--state", state],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (os.path.exists(state) and os.path.getsize(state) > 2000):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 130:  # (a fast machine may finish first)
        assert "interrupted" in err and "Traceback" not in err
    assert not list(r.scan_iter("*redis-mem-migrate*"))  # no temporary key left
    rep = mig.migrate(r, delete_source=True)
    assert not rep.failed
    assert not list(r.scan_iter("user_memory_*"))  # every source deleted
    assert len(list(r.scan_iter("mem:*"))) == 4001


def test_a_langchain_list_with_a_non_utf8_session_id_keeps_its_bytes(clean):
    """Found by the outside tester: message_store:\\xff\\xfe moved to a session
    named with the escaped text (b'mem:{\\\\xff\\\\xfe}': a backslash, x, f,
    f...), a key no application would ever read; with --delete-source the
    history was lost to it."""
    from langchain_core.messages import HumanMessage
    raw = clean.client(decode_responses=False)
    raw.lpush(b"message_store:\xff\xfe id", json.dumps({"type": "human", "data": {"content": "hi"}}))
    write_community(raw, "new\nline {x}", [HumanMessage("nl")])
    rep = mig.migrate(raw, source="langchain", delete_source=True)
    assert sorted((x.status, x.deleted) for x in rep.results) == [(mig.MOVED, True)] * 2
    assert sorted(raw.scan_iter("mem:*")) == [b"mem:{new\nline {x}}", b"mem:{\xff\xfe id}"]
    assert RedisMemClient(raw).get(b"mem:{\xff\xfe id}")[0].content == "hi"


def test_a_profile_without_a_conversation_yet_is_moved(r):
    """Found by the outside tester: {"user_profile": {...}} with no
    conversation_history (a user who has not chatted yet) failed as
    'conversation_history is missing': the profile could never be moved."""
    r.set("user_memory_new", json.dumps({"user_profile": {"name": "Nora", "plan": "pro"}, "context": {"tz": "UTC"}}))
    r.set("user_memory_junk", json.dumps({"something": "else"}))
    rep = mig.migrate(r, delete_source=True)
    assert statuses(rep) == {"user_memory_new": (mig.MOVED, ""),
                             "user_memory_junk": (mig.FAILED, "conversation_history is missing or not an array")}
    attrs = RedisMemClient(r).attrget("mem:{new}")
    assert attrs["user_profile"] == {"name": "Nora", "plan": "pro"} and attrs["context"] == {"tz": "UTC"}
    assert r.exists("user_memory_junk") and not r.exists("user_memory_new")


def test_a_message_s_members_the_module_does_not_read_move_into_its_meta(r):
    """Hostile pass 25, F1: an OpenAI-shaped history's tool_calls,
    tool_call_id and name were dropped, and the source deleted."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    r.set("user_memory_h", json.dumps({"conversation_history": [
        {"role": "user", "content": "weather?", "meta": {"lang": "en"}, "name": "ann"},
        {"role": "assistant", "content": "", "name": "bob", "tool_calls": [call]},
        {"role": "tool", "content": "18C", "tool_call_id": "c1"}]}))
    report = mig.migrate(r, pattern="user_memory_h", delete_source=True)
    assert [x.status for x in report.results] == [mig.MOVED]
    got = json.loads(r.execute_command("MEM.GET", "mem:{h}", "FORMAT", "JSON"))["conversation_history"]
    assert [m.get("meta") for m in got] == [
        {"lang": "en", "name": "ann"}, {"name": "bob", "tool_calls": [call]}, {"tool_call_id": "c1"}]
    assert not r.exists("user_memory_h")
    # A member also in its meta is refused, the source kept.
    r.set("user_memory_c", json.dumps({"conversation_history": [
        {"role": "user", "content": "x", "name": "a", "meta": {"name": "b"}}]}))
    report = mig.migrate(r, pattern="user_memory_c", delete_source=True)
    assert [(x.status, "both as a member and in its meta" in x.reason) for x in report.results] == [(mig.FAILED, True)]
    assert r.exists("user_memory_c") and not r.exists("mem:{c}")


def test_a_turn_that_only_calls_tools_with_null_content_is_moved(r):
    """Hostile pass 33, F5: OpenAI's shape of a tool-calling turn
    (content null, tool_calls) failed the whole session. It is kept with
    content "", its calls in META; other null content still fails."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    r.set("user_memory_n", json.dumps({"conversation_history": [
        {"role": "user", "content": "go", "timestamp": 1735725600},
        {"role": "assistant", "content": None, "tool_calls": [call], "timestamp": 1735725601},
        {"role": "tool", "content": "done", "tool_call_id": "c1", "timestamp": 1735725602},
        {"role": "assistant", "content": None, "meta": {"tool_calls": [call]}, "timestamp": 1735725603},
        {"role": "tool", "content": "again", "meta": {"tool_call_id": "c1"}, "timestamp": 1735725604}]}))
    report = mig.migrate(r, pattern="user_memory_n", delete_source=True)
    assert [x.status for x in report.results] == [mig.MOVED], report.render()
    got = json.loads(r.execute_command("MEM.GET", "mem:{n}", "FORMAT", "JSON"))["conversation_history"]
    assert [(m["role"], m["content"], m.get("meta")) for m in got] == [
        ("user", "go", None), ("assistant", "", {"tool_calls": [call]}), ("tool", "done", {"tool_call_id": "c1"}),
        ("assistant", "", {"tool_calls": [call]}), ("tool", "again", {"tool_call_id": "c1"})]
    assert not r.exists("user_memory_n")
    r.set("user_memory_u", json.dumps({"conversation_history": [{"role": "user", "content": None}]}))
    report = mig.migrate(r, pattern="user_memory_u", delete_source=True)
    assert [(x.status, "content is not a string" in x.reason) for x in report.results] == [(mig.FAILED, True)]
    assert r.exists("user_memory_u") and not r.exists("mem:{u}")


def test_messages_without_a_timestamp_are_reported_and_null_members_left_out(r):
    """Hostile pass 25 (low): a message without a timestamp got the
    migration's time silently; a null member of an OpenAI-shaped message
    became a null in its META."""
    r.set("user_memory_t", json.dumps({"conversation_history": [
        {"role": "user", "content": "old", "timestamp": "2025-01-01T10:00:00"},
        {"role": "assistant", "content": "no time", "function_call": None, "tool_calls": None},
        {"role": "user", "content": "nor here"}]}))
    report = mig.migrate(r, pattern="user_memory_t")
    assert [(x.status, x.untimed) for x in report.results] == [(mig.MOVED, 2)]
    assert "2 without a timestamp, stamped with the migration's time" in report.render()
    assert report.to_dict()["keys"][0]["untimed"] == 2
    got = json.loads(r.execute_command("MEM.GET", "mem:{t}", "FORMAT", "JSON"))["conversation_history"]
    assert [m.get("meta") for m in got] == [None, None, None]


def test_a_state_file_tells_a_non_utf8_key_from_one_holding_a_backslash(clean, tmp_path):
    """Hostile pass 29 F6: b'user_memory_\\xff' and the name with a literal
    backslash, x, f, f were both journaled as `user_memory_\\xff`, so a rerun
    skipped the second as finished."""
    raw = clean.client(decode_responses=False)
    state = str(tmp_path / "state")
    raw.set(b"user_memory_\xff", doc("the byte"))
    first = mig.migrate(raw, state=state, delete_source=True)
    raw.set(b"user_memory_\\xff", doc("the backslash"))
    second = mig.migrate(raw, state=state, delete_source=True)
    assert [(x.source, x.status) for x in first.results] == [("user_memory_\\xff", mig.MOVED)]
    assert [(x.source, x.status) for x in second.results] == [("user_memory_\\\\xff", mig.MOVED)]
    assert RedisMemClient(raw).get(b"mem:{\xff}")[0].content == "the byte"
    assert RedisMemClient(raw).get(b"mem:{\\xff}")[0].content == "the backslash"


class _WritesAfterTheMove(redis.Redis):
    """A client that, right after the run's RENAMENX, lets an old
    application instance rewrite the source and a new one do ``app`` to
    the migrated session (a command, or nothing)."""

    def __init__(self, r: redis.Redis, app=None) -> None:
        # Bytes, as the run reads sources (a decoding client is swapped for one).
        kw = {**r.connection_pool.connection_kwargs, "decode_responses": False}
        super().__init__(connection_pool=redis.ConnectionPool(**kw))
        self.side, self.app, self.fired = r, app, False

    def execute_command(self, *args, **kw):
        out = super().execute_command(*args, **kw)
        if not self.fired and str(args[0]).upper() == "RENAMENX":
            self.fired = True
            if self.app:
                self.side.execute_command(*self.app)
            self.side.set("user_memory_race", doc("old", "old app's reply"))
        return out


def test_a_source_changed_after_the_move_never_overwrites_what_the_new_session_got(r):
    """Hostile pass 34, F1: with --delete-source, a source rewritten after
    its session was placed was imported again with a plain RENAME over the
    session, dropping a turn a new application instance had appended to it
    meanwhile; the source was then deleted and the report said moved."""
    r.set("user_memory_race", doc("old"))
    append = ("MEM.APPEND", "mem:{race}", "user", "new app's turn")
    report = mig.migrate(_WritesAfterTheMove(r, append), pattern="user_memory_race", delete_source=True)
    assert [(x.status, "both kept" in x.reason) for x in report.results] == [(mig.FAILED, True)]
    got = RedisMemClient(r).get("mem:{race}")
    assert [e.content for e in got] == ["old", "new app's turn"]
    assert r.exists("user_memory_race")
    # Pass 35: a change of the session's expiry alone (PERSIST, EXPIRE) is a write too.
    for app, pttl_ok in ((("PERSIST", "mem:{race}"), lambda p: p == -1),
                         (("PEXPIRE", "mem:{race}", 5_000_000), lambda p: 4_900_000 < p <= 5_000_000)):
        r.delete("mem:{race}")
        r.set("user_memory_race", doc("old"), ex=100)
        report = mig.migrate(_WritesAfterTheMove(r, app), pattern="user_memory_race", delete_source=True)
        assert [(x.status, "both kept" in x.reason) for x in report.results] == [(mig.FAILED, True)], app
        assert pttl_ok(r.pttl("mem:{race}")) and r.exists("user_memory_race"), app
    # Without a write to the session, the changed source is imported again and deleted.
    r.delete("mem:{race}")
    r.set("user_memory_race", doc("old"))
    report = mig.migrate(_WritesAfterTheMove(r), pattern="user_memory_race", delete_source=True)
    assert [(x.status, x.deleted) for x in report.results] == [(mig.MOVED, True)]
    assert [e.content for e in RedisMemClient(r).get("mem:{race}")] == ["old", "old app's reply"]
    assert not r.exists("user_memory_race")


def test_a_member_given_twice_fails_the_source_and_keeps_it(r):
    """Hostile pass 34, F5: json.loads keeps the last of a repeated name,
    so a message's first content (or any member) was dropped from the
    re-encoded document and the source deleted; MEM.IMPORT itself refuses
    such a document. The source now fails, kept."""
    r.set("user_memory_twice", '{"conversation_history":[{"role":"user","content":"first","content":"second"}]}')
    r.set("user_memory_twice2", '{"conversation_history":[],"user_profile":{"a":1},"user_profile":{"a":2}}')
    r.lpush("message_store:twice", '{"type":"human","data":{"content":"a","content":"b"}}')
    for source, names in (("user-memory", ["user_memory_twice", "user_memory_twice2"]), ("langchain", ["twice"])):
        report = mig.migrate(r, source=source, pattern=None if source == "langchain" else "user_memory_twice*",
                             delete_source=True)
        by = {x.source: x for x in report.results}
        for name in names:
            assert by[name].status == mig.FAILED and "is given twice" in by[name].reason, report.render()
    assert r.exists("user_memory_twice", "user_memory_twice2", "message_store:twice") == 3
    assert not r.exists("mem:{twice}", "mem:{twice2}")


def test_a_target_with_the_same_turns_but_less_is_not_taken_as_moved(r):
    """Hostile pass 35, F1: a target holding the same roles, contents and
    metas (an application writing both stores, or --from external run
    first) was taken as "moved by an earlier run", and --delete-source
    deleted a source whose profile, context, times and msgids the session
    lacked. The whole session must be the same."""
    r.set("user_memory_same", json.dumps({
        "conversation_history": [
            {"role": "user", "content": "hi", "timestamp": "2025-01-01T10:00:00Z", "msgid": "m1"},
            {"role": "assistant", "content": "hello", "timestamp": "2025-01-01T10:00:01Z"}],
        "user_profile": {"name": "Ann"}, "context": {"k": 1}}))
    c = RedisMemClient(r)
    c.append("mem:{same}", "user", "hi")
    c.append("mem:{same}", "assistant", "hello")
    r.set("user_memory_carol", json.dumps({"user_profile": {"name": "Carol"}}))
    r.execute_command("MEM.EXTSET", "mem:{carol}", "dify", "conv-1")
    report = mig.migrate(r, pattern="user_memory_[sc]*", delete_source=True)
    assert {x.source: (x.status, x.reason, x.deleted) for x in report.results} == {
        "user_memory_same": (mig.SKIPPED, mig._TARGET_EXISTS, False),
        "user_memory_carol": (mig.SKIPPED, mig._TARGET_EXISTS, False)}
    assert r.exists("user_memory_same", "user_memory_carol") == 2
    # The session an interrupted run did move is recognized, and the source deleted.
    r.delete("mem:{same}")
    first = mig.migrate(r, pattern="user_memory_same")
    assert [x.status for x in first.results] == [mig.MOVED]
    again = mig.migrate(r, pattern="user_memory_same", delete_source=True)
    assert [(x.status, x.deleted) for x in again.results] == [(mig.SKIPPED, True)]
    assert c.attrget("mem:{same}", "user_profile") == {"name": "Ann"}


def test_a_server_without_session_ttl_keeps_none_after_the_source_s_lifetime(r):
    """Hostile pass 35, F5: with mem.ttl 0 (sessions never expire) a source
    with 60 s left made the session's TTL setting 60 s again. The setting
    is the server's (none), the key expires once when the source would
    have; a later write makes it persistent, as the server's own sessions."""
    old = r.config_get("mem.ttl")["mem.ttl"]
    r.config_set("mem.ttl", 0)
    try:
        r.set("user_memory_z", doc("a"), ex=60)
        mig.migrate(r, pattern="user_memory_z")
        assert RedisMemClient(r).info("mem:{z}").ttl == 0
        assert 55 <= r.ttl("mem:{z}") <= 60
        RedisMemClient(r).append("mem:{z}", "user", "next")
        assert r.ttl("mem:{z}") == -1
    finally:
        r.config_set("mem.ttl", old)


def test_numbers_move_as_written_and_true_is_not_one(r):
    """Hostile pass 36, F3/F4: the source went through float and back, so
    0.1000000000000000055511151231257827 became 0.1 and a 20-digit
    fraction lost digits, and the read-back (also through float, and
    taking true == 1) passed: the source was deleted. Numbers now move as
    written, and a target holding {"vip": 1} is not the session of a source
    holding {"vip": true}."""
    exact = '{"conversation_history":[{"role":"user","content":"x","ts":1735725600000,' \
            '"meta":{"p":0.1000000000000000055511151231257827,"big":98765432109876543210.5,"n":12345678901234567890}}],' \
            '"user_profile":{"score":1234567890.123456789012}}'
    r.set("user_memory_num", exact)
    report = mig.migrate(r, pattern="user_memory_num", delete_source=True)
    assert [(x.status, x.deleted) for x in report.results] == [(mig.MOVED, True)], report.render()
    raw = r.execute_command("MEM.GET", "mem:{num}", "FORMAT", "JSON")
    for text in ("0.1000000000000000055511151231257827", "98765432109876543210.5", "12345678901234567890",
                 "1234567890.123456789012"):
        assert text in raw, text
    r.set("user_memory_vip", '{"conversation_history":[{"role":"user","content":"x","ts":1735725600000}],'
                             '"user_profile":{"vip":true}}')
    r.execute_command("MEM.IMPORT", "mem:{vip}", '{"conversation_history":[{"role":"user","content":"x",'
                      '"ts":1735725600000}],"user_profile":{"vip":1}}', "TTL", 0)
    report = mig.migrate(r, pattern="user_memory_vip", delete_source=True)
    assert [(x.status, x.reason) for x in report.results] == [(mig.SKIPPED, mig._TARGET_EXISTS)]
    assert r.exists("user_memory_vip")


def test_an_earlier_run_s_session_counts_only_with_every_time_expiry_and_member(r):
    """Hostile pass 36: the "already moved" check ignored every message's
    time when one was untimed (F5), the target's key expiring sooner (F1)
    or a shorter TTL setting (F2); a summary's own members were dropped
    (F7) and ts beside a different timestamp lost one (F10): each deleted
    a source whose information the session lacked."""
    c = RedisMemClient(r)
    two = {"conversation_history": [{"role": "user", "content": "a", "timestamp": "2021-01-01T00:00:00Z"},
                                     {"role": "assistant", "content": "b"}]}
    r.set("user_memory_t", json.dumps(two), ex=86400)
    mig.migrate(r, pattern="user_memory_t")
    r.execute_command("MEM.IMPORT", "mem:{t}", json.dumps({"conversation_history": [
        {"role": "user", "content": "a", "timestamp": "2025-01-01T00:00:00Z"},
        {"role": "assistant", "content": "b"}]}), "REPLACE")
    report = mig.migrate(r, pattern="user_memory_t", delete_source=True)
    assert [x.status for x in report.results] == [mig.SKIPPED] and r.exists("user_memory_t")
    # The earlier run's own session is recognized; then one expiring sooner, or a shorter setting, is not.
    r.delete("mem:{t}")
    mig.migrate(r, pattern="user_memory_t")
    for change, kept in (((), False), (("PEXPIRE", "mem:{t}", 3000), True),
                         (("MEM.IMPORT", "mem:{t}", "REPLACE", "TTL", 2), True)):
        if change and change[0] == "MEM.IMPORT":
            doc = r.execute_command("MEM.GET", "mem:{t}", "FORMAT", "JSON")
            r.execute_command(change[0], change[1], doc, *change[2:])
            r.expire("mem:{t}", 86400)
        elif change:
            r.execute_command(*change)
        report = mig.migrate(r, pattern="user_memory_t", dry_run=True, delete_source=True)
        assert ([x.reason for x in report.results] == [mig._TARGET_EXISTS]) == kept, change
    r.set("user_memory_s", json.dumps({"conversation_history": [], "summary": {
        "content": "earlier", "upto": 0, "author": "bot"}}))
    r.set("user_memory_b", json.dumps({"conversation_history": [
        {"role": "user", "content": "x", "ts": 1735725600000, "timestamp": "2021-01-01T00:00:00Z"}]}))
    report = mig.migrate(r, pattern="user_memory_[sb]", delete_source=True)
    by = {x.source: x for x in report.results}
    assert by["user_memory_s"].status == mig.FAILED and "'author'" in by["user_memory_s"].reason
    assert by["user_memory_b"].status == mig.FAILED and "both ts and timestamp" in by["user_memory_b"].reason
    assert r.exists("user_memory_s", "user_memory_b") == 2
    assert c.info("mem:{s}") is None


def test_a_summary_moves_whole_or_its_source_fails(r):
    """Hostile pass 37, F1/F4: a summary with content and text kept only
    content, one with ts and a different timestamp lost the timestamp, a ts
    in seconds was read as milliseconds (1970), and nothing read the
    summary back; a rerun did not recognize its own session when the
    summary had no time."""
    msgs = [{"id": 5, "role": "user", "content": "hi", "ts": 1735725600000}]
    r.set("user_memory_both", json.dumps({"conversation_history": msgs, "summary": {
        "content": "A", "text": "B", "upto": 4}}))
    r.set("user_memory_two", json.dumps({"conversation_history": msgs, "summary": {
        "content": "A", "upto": 4, "ts": 1690000000, "timestamp": "2021-01-01T00:00:00Z"}}))
    r.set("user_memory_sec", json.dumps({"conversation_history": msgs, "summary": {
        "content": "earlier", "upto": 4, "ts": 1690000000}}))
    r.set("user_memory_none", json.dumps({"conversation_history": msgs, "summary": {
        "content": "earlier", "upto": 4}}))
    report = mig.migrate(r, pattern="user_memory_[btsn]*", delete_source=True)
    by = {x.source: x for x in report.results}
    assert by["user_memory_both"].status == mig.FAILED and "both content and text" in by["user_memory_both"].reason
    assert by["user_memory_two"].status == mig.FAILED and "both ts and timestamp" in by["user_memory_two"].reason
    assert [by[k].status for k in ("user_memory_sec", "user_memory_none")] == [mig.MOVED, mig.MOVED]
    summary = json.loads(r.execute_command("MEM.GET", "mem:{sec}", "FORMAT", "JSON"))["summary"]
    assert (summary["content"], summary["ts"]) == ("earlier", 1690000000000)
    assert r.exists("user_memory_both", "user_memory_two") == 2
    # A rerun recognizes a session whose summary the first run stamped.
    r.set("user_memory_none", json.dumps({"conversation_history": msgs, "summary": {
        "content": "earlier", "upto": 4}}))
    again = mig.migrate(r, pattern="user_memory_none", delete_source=True)
    assert [(x.status, x.deleted) for x in again.results] == [(mig.SKIPPED, True)], again.render()


def test_pass_38_a_folded_summary_keeps_the_old_one_and_nothing_beside_a_message_is_dropped(r):
    """Hostile pass 38: --overflow summarize gave the summarizer no previous
    summary, so the source's own summary was replaced and lost (F1); a
    LangChain item's or document's member beside its message was dropped,
    an item without data became an empty message (F3); a source journaled
    deleted and written anew was skipped as finished (F4)."""
    if not module_has_import_caps(r):
        pytest.skip("the module's MEM.IMPORT has no MAXMSGS")
    history = [{"id": i + 5, "role": "user" if i % 2 == 0 else "assistant", "content": f"fact {i}",
                "ts": 1735725600000 + i} for i in range(60)]
    r.set("user_memory_fold", json.dumps({"conversation_history": history, "summary": {
        "content": "Bob is allergic to peanuts.", "upto": 4}}))
    seen = []

    def llm(previous, entries):
        seen.append(previous)
        return f"{previous} Then {len(entries)} more."
    report = mig.migrate(r, pattern="user_memory_fold", overflow="summarize", summarize_fn=llm)
    assert [x.status for x in report.results] == [mig.MOVED], report.render()
    assert seen == ["Bob is allergic to peanuts."]
    assert RedisMemClient(r).get("mem:{fold}")[0].content.startswith("Bob is allergic to peanuts.")
    r.lpush("message_store:extra", '{"type":"human","data":{"content":"hi"},"metadata":{"user":42}}')
    r.lpush("message_store:flat", '{"type":"human","content":"I am flat"}')
    report = mig.migrate(r, source="langchain", delete_source=True)
    by = {x.source: x for x in report.results}
    assert by["extra"].status == mig.FAILED and "'metadata'" in by["extra"].reason
    assert by["flat"].status == mig.FAILED and "not a message_to_dict object" in by["flat"].reason
    assert r.exists("message_store:extra", "message_store:flat") == 2


def test_a_source_written_anew_after_its_delete_is_looked_at_again(r, tmp_path):
    """Hostile pass 38, F4: --state skipped a source journaled deleted that an
    old application instance had written anew, as "finished in an earlier
    run"; it is looked at again (and, its session holding other turns, kept)."""
    state = str(tmp_path / "s")
    r.set("user_memory_again", doc("one", "two"))
    first = mig.migrate(r, pattern="user_memory_again", delete_source=True, state=state)
    assert [(x.status, x.deleted) for x in first.results] == [(mig.MOVED, True)]
    r.set("user_memory_again", doc("three"))
    again = mig.migrate(r, pattern="user_memory_again", delete_source=True, state=state)
    assert [(x.status, x.reason) for x in again.results] == [(mig.SKIPPED, mig._TARGET_EXISTS)]
    assert r.exists("user_memory_again")
    assert [e.content for e in RedisMemClient(r).get("mem:{again}")] == ["one", "two"]


class _PersistsTheSource(redis.Redis):
    """A client that, right after the run's RENAMENX, lets the application
    PERSIST the source (its content unchanged)."""

    def __init__(self, r: redis.Redis) -> None:
        kw = {**r.connection_pool.connection_kwargs, "decode_responses": False}
        super().__init__(connection_pool=redis.ConnectionPool(**kw))
        self.side, self.fired = r, False

    def execute_command(self, *args, **kw):
        out = super().execute_command(*args, **kw)
        if not self.fired and str(args[0]).upper() == "RENAMENX":
            self.fired = True
            self.side.persist("user_memory_kept")
        return out


def test_a_source_s_expiry_changed_mid_move_is_followed(r):
    """Hostile pass 38, F2: an application's PERSIST of the source after its
    PTTL was read went unseen: the source was deleted and the session
    expired on the old time. The change is imported again: no expiry."""
    r.set("user_memory_kept", doc("a"), ex=60)
    report = mig.migrate(_PersistsTheSource(r), pattern="user_memory_kept", delete_source=True)
    assert [(x.status, x.deleted) for x in report.results] == [(mig.MOVED, True)], report.render()
    assert r.ttl("mem:{kept}") == -1 and RedisMemClient(r).info("mem:{kept}").ttl == 0


def test_pass_39_external_ids_in_place_and_a_shared_state_file(r, tmp_path):
    """Hostile pass 39: (F2) histories moved without --delete-source, then
    --from external (the documented order), then the cut-over rerun with
    --delete-source: the session's external ids made it "another session"
    and the advice, --replace, lost the id for good; (F3) one --state file
    for two kinds of source took a langchain-redis session for the
    langchain one of the same id, finished."""
    r.set("user_memory_bob", doc("hi", "hello"))
    mig.migrate(r, pattern="user_memory_bob")
    r.set("external:dify:conversation:bob", "dify-1")
    mig.migrate(r, source="external", delete_source=True)
    rerun = mig.migrate(r, pattern="user_memory_bob", delete_source=True)
    assert [(x.status, x.deleted) for x in rerun.results] == [(mig.SKIPPED, True)], rerun.render()
    assert RedisMemClient(r).extget("mem:{bob}", "dify") == "dify-1"
    from langchain_core.messages import HumanMessage
    from test_migrate_langchain import write_community, write_langchain_redis
    state = str(tmp_path / "shared")
    write_community(r, "alice", [HumanMessage("from the list")])
    write_langchain_redis(r, "alice", [HumanMessage("from the documents")])
    mig.migrate(r, source="langchain", target_template="mem:{lc-<id>}", state=state)
    other = mig.migrate(r, source="langchain-redis", target_template="mem:{lcr-<id>}", state=state)
    assert [x.status for x in other.results] == [mig.MOVED], other.render()
    assert RedisMemClient(r).get("mem:{lcr-alice}")[0].content == "from the documents"


def test_replace_keeps_the_external_ids_the_source_does_not_have(r):
    """--replace overwrote the target whole: the Dify / n8n ids --from
    external (or the application) had put in the session were lost for good.
    They stay now, each until its own expiry; an id the source carries for
    the same system is the source's."""
    mem = RedisMemClient(r)
    mem.append("mem:{erin}", "user", "the live session")
    r.execute_command("MEM.EXTSET", "mem:{erin}", "dify", "dify-erin", "EX", 500)
    r.execute_command("MEM.EXTSET", "mem:{erin}", "n8n", "n8n-old", "EX", 500)
    before = mig._external_ids(r, b"mem:{erin}")
    source = json.loads(r.execute_command("MEM.GET", "mem:{erin}", "FORMAT", "JSON"))
    source["conversation_history"] = [{"role": "user", "content": "old history"}]
    source["redis_mem"] = {"external": {"n8n": {"id": "n8n-source", "expires": before["n8n"]["expires"] + 9000}}}
    r.set("user_memory_erin", json.dumps(source), ex=100)
    rep = mig.migrate(r, pattern="user_memory_erin", replace=True)
    assert [(x.status, x.replaced) for x in rep.results] == [(mig.MOVED, True)], rep.render()
    assert "kept the replaced session's external ids (dify)" in rep.render()
    assert [m.content for m in mem.get("mem:{erin}")] == ["old history"]
    assert mem.extget("mem:{erin}", "dify") == "dify-erin"
    assert mem.extget("mem:{erin}", "n8n") == "n8n-source"
    after = mig._external_ids(r, b"mem:{erin}")
    assert 0 <= after["dify"]["expires"] - before["dify"]["expires"] < 1000
    # The key expires when its source would have (hostile pass 41: MEM.EXTSET
    # had kept it alive as long as the id), the ids with it at the latest.
    assert 0 < r.pttl("mem:{erin}") <= 100_000


def test_replace_keeping_ids_is_predicted_by_the_dry_run_and_needs_extset(r):
    """Hostile pass 41 F2: the dry run said "would move" where the real run
    failed, for a user who may not run MEM.EXTSET (and that row had no
    target)."""
    mem = RedisMemClient(r)
    mem.append("mem:{finn}", "user", "the live session")
    r.execute_command("MEM.EXTSET", "mem:{finn}", "dify", "dify-finn", "EX", 500)
    r.set("user_memory_finn", doc("old history"))
    dry = mig.migrate(r, pattern="user_memory_finn", replace=True, dry_run=True)
    assert "kept the replaced session's external ids (dify)" in dry.render()
    r.execute_command("ACL", "SETUSER", "noext", "on", ">pw", "~*", "&*", "+@all", "-mem.extset")
    try:
        limited = redis.Redis(port=r.connection_pool.connection_kwargs["port"], username="noext", password="pw")
        for dry_run in (True, False):
            rep = mig.migrate(limited, pattern="user_memory_finn", replace=True, dry_run=dry_run)
            [res] = rep.results
            assert (res.status, res.target) == (mig.FAILED, "mem:{finn}"), rep.render()
            assert "may not run MEM.EXTSET" in res.reason
        assert [m.content for m in mem.get("mem:{finn}")] == ["the live session"]
        assert mem.extget("mem:{finn}", "dify") == "dify-finn"
        assert r.exists("user_memory_finn")
    finally:
        r.execute_command("ACL", "DELUSER", "noext")
