"""redis-mem-migrate (redis_mem.migrate) against the real module: user_memory_* JSON keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

import redis_mem.migrate as mig
from redis_mem import RedisMemClient

#: The console script pip installed beside the interpreter.
SCRIPT = os.path.join(os.path.dirname(sys.executable), "redis-mem-migrate")

ALICE = {
    "conversation_history": [
        {"role": "user", "content": "My name is Alice.", "timestamp": "2024-05-01T10:00:00"},
        {"role": "assistant", "content": "Hello Alice!", "timestamp": "2024-05-01T10:00:02.500Z"},
        {"role": "user", "content": "I prefer tea.", "timestamp": "2024-05-01T12:00:00+02:00"},
    ],
    "user_profile": {"name": "Alice", "preferences": {"drink": "tea"}},
    "context": {"channel": "web", "tags": ["vip"]},
}
BOB = {
    "conversation_history": [{"role": "user", "content": "hi", "timestamp": "2024-06-01 08:00:00"}],
    "user_profile": {},
}


def seed(r):
    """A deployment's keys: good ones, bad ones, and unrelated ones."""
    r.set("user_memory_alice", json.dumps(ALICE))
    r.set("user_memory_bob", json.dumps(BOB), ex=5000)
    r.set("user_memory_badjson", '{"conversation_history": [ {"role": "user", ')  # truncated
    r.set("user_memory_noshape", json.dumps({"history": []}))
    # Passes the local shape check, refused by MEM.IMPORT (role over 64 bytes).
    r.set("user_memory_longrole", json.dumps(
        {"conversation_history": [{"role": "r" * 100, "content": "x"}]}))
    r.set("user_memory_binary", b"\xff\xfe not utf-8")
    r.hset("user_memory_hash", "a", "b")  # not a string: reported, untouched
    r.set("session_other", json.dumps(ALICE))  # does not match the pattern


def snapshot(r):
    return {k: (r.type(k), r.dump(k), r.pttl(k) > 0) for k in r.scan_iter(count=1000)}


BAD = ["user_memory_badjson", "user_memory_binary", "user_memory_hash", "user_memory_longrole",
       "user_memory_noshape"]


def test_dry_run_changes_nothing(clean):
    r = clean.client(decode_responses=False)
    seed(r)
    r.set("mem:{bob}", "occupied")
    before = snapshot(r)
    report = mig.migrate(r, dry_run=True)
    assert snapshot(r) == before
    by = {x.source: x for x in report.results}
    assert set(by) == {"user_memory_alice", "user_memory_bob", *BAD}
    assert by["user_memory_alice"].status == mig.WOULD_MOVE
    assert by["user_memory_alice"].target == "mem:{alice}"
    assert by["user_memory_alice"].messages == 3
    assert by["user_memory_bob"].status == mig.SKIPPED
    assert "exists" in by["user_memory_bob"].reason
    assert by["user_memory_badjson"].status == mig.FAILED
    assert "not valid JSON" in by["user_memory_badjson"].reason
    assert by["user_memory_noshape"].status == mig.FAILED
    assert by["user_memory_binary"].status == mig.FAILED and "UTF-8" in by["user_memory_binary"].reason
    # Hostile finding (fixed): a matching key of another type was skipped in
    # silence; it is reported.
    assert by["user_memory_hash"].status == mig.FAILED and "a hash key" in by["user_memory_hash"].reason
    # The dry run predicts the real run's failures exactly (finding 3).
    assert by["user_memory_longrole"].status == mig.FAILED
    assert [x.source for x in report.moved] == ["user_memory_alice"]


def test_real_run_moves_keys_and_keeps_failures_untouched(clean):
    r = clean.client(decode_responses=False)
    seed(r)
    bad_before = {k: (r.dump(k), r.pttl(k)) for k in BAD}
    report = mig.migrate(r, delete_source=True, ttl=3600, model="gpt-4")
    by = {x.source: x for x in report.results}
    assert {x.source for x in report.moved} == {"user_memory_alice", "user_memory_bob"}
    assert all(x.deleted for x in report.moved)
    assert {x.source for x in report.failed} == set(BAD)
    assert "over 64 bytes" in by["user_memory_longrole"].reason
    assert report.skipped == []

    # Moved: sources gone, sessions there with profile/context kept.
    assert r.exists("user_memory_alice", "user_memory_bob") == 0
    mem = RedisMemClient(r)
    doc = mem.get_json("mem:{alice}")
    assert [(m["id"], m["role"], m["content"]) for m in doc["conversation_history"]] == [
        (1, "user", "My name is Alice."), (2, "assistant", "Hello Alice!"), (3, "user", "I prefer tea.")]
    assert [m["timestamp"] for m in doc["conversation_history"]] == [
        "2024-05-01T10:00:00.000Z", "2024-05-01T10:00:02.500Z", "2024-05-01T10:00:00.000Z"]
    assert doc["user_profile"] == ALICE["user_profile"]
    assert doc["context"] == ALICE["context"]
    info = mem.info("mem:{alice}")
    assert (info.messages, info.model, info.ttl) == (3, "gpt-4", 3600)
    assert by["user_memory_alice"].messages == 3
    assert mem.get_json("mem:{bob}")["user_profile"] == {}

    # Failed: untouched (value and expiry), no session created.
    for k in BAD:
        assert (r.dump(k), r.pttl(k)) == bad_before[k]
    for suffix in ("badjson", "binary", "hash", "longrole", "noshape"):
        assert r.exists("mem:{%s}" % suffix) == 0
    # Unrelated keys untouched.
    assert r.type("user_memory_hash") == b"hash"
    assert json.loads(r.get("session_other")) == ALICE


def test_sources_kept_without_delete_and_rerun_skips(clean):
    r = clean.client()
    r.set("user_memory_alice", json.dumps(ALICE))
    first = mig.migrate(r)
    assert [x.status for x in first.results] == [mig.MOVED]
    assert not first.results[0].deleted
    assert json.loads(r.get("user_memory_alice")) == ALICE
    # A second run skips (the session exists) unless --replace: it says the
    # session is this very history; once the session has changed, that it exists.
    again = mig.migrate(r)
    assert [(x.status, x.reason) for x in again.results] == [
        (mig.SKIPPED, "the target already holds exactly this session (an earlier or concurrent run moved it)")]
    RedisMemClient(r).append("mem:{alice}", "user", "new turn")
    assert [(x.status, x.reason) for x in mig.migrate(r).results] == [
        (mig.SKIPPED, mig._TARGET_EXISTS)]
    replaced = mig.migrate(r, replace=True)
    assert [x.status for x in replaced.results] == [mig.MOVED]
    assert RedisMemClient(r).info("mem:{alice}").messages == 3


def test_custom_pattern_and_template(clean):
    r = clean.client()
    r.set("legacy:mem:42", json.dumps(BOB))
    report = mig.migrate(r, pattern="legacy:mem:*", source_prefix="legacy:mem:",
                         target_template="chat:<suffix>:from:<key>")
    assert [(x.source, x.target, x.status) for x in report.results] == [
        ("legacy:mem:42", "chat:42:from:legacy:mem:42", mig.MOVED)]
    assert RedisMemClient(r).get("chat:42:from:legacy:mem:42")[0].content == "hi"


def test_cli_dry_run_then_real_run(clean):
    r = clean.client()
    seed(r)
    host, port = "127.0.0.1", str(clean.port)
    before = snapshot(r)
    dry = subprocess.run(
        [SCRIPT, "--host", host, "--port", port, "--dry-run", "--json"],
        capture_output=True, text=True, timeout=60)
    assert dry.returncode == 1, dry.stderr  # failures in the report
    rep = json.loads(dry.stdout)
    assert (rep["dry_run"], rep["moved"], rep["skipped"], rep["failed"]) == (True, 2, 0, 5)
    assert snapshot(r) == before

    real = subprocess.run(
        [SCRIPT, "--url", clean.url, "--delete-source"],
        capture_output=True, text=True, timeout=60)
    assert real.returncode == 1
    assert "moved 2, skipped 0, failed 5" in real.stdout
    assert "failed     user_memory_badjson -> mem:{badjson}: not valid JSON" in real.stdout
    assert r.exists("mem:{alice}") and r.exists("mem:{bob}")
    assert not r.exists("user_memory_alice")
    assert r.exists("user_memory_badjson")

    ok = subprocess.run(
        [SCRIPT, "--url", clean.url, "--pattern", "user_memory_alice*"],
        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "moved 0, skipped 0, failed 0" in ok.stdout

    bad = subprocess.run([SCRIPT, "--target-template", "fixed"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--target-template" in bad.stderr


def test_delete_source_reimports_a_source_changed_meanwhile(clean, monkeypatch):
    r = clean.client()
    r.set("user_memory_carol", json.dumps(BOB))
    newer = dict(BOB, conversation_history=BOB["conversation_history"] + [
        {"role": "assistant", "content": "written by the old app meanwhile"}])
    real_place = mig._place
    calls = []

    def import_then_app_writes(run, res, name, target, *args):
        out = real_place(run, res, name, target, *args)
        calls.append(target in run.created)
        if len(calls) == 1:  # the old application writes right after our import
            r.set("user_memory_carol", json.dumps(newer))
        return out

    monkeypatch.setattr(mig, "_place", import_then_app_writes)
    report = mig.migrate(r, delete_source=True)
    assert calls == [True, True]
    assert [(x.status, x.deleted) for x in report.results] == [(mig.MOVED, True)]
    assert not r.exists("user_memory_carol")
    msgs = RedisMemClient(r).get("mem:{carol}")
    assert [m.content for m in msgs] == ["hi", "written by the old app meanwhile"]


def test_a_server_without_the_module_is_one_error_not_a_failure_per_key():
    """Found by the outside tester: against a plain Redis every source
    failed, one report line each, with "unknown command 'MEM.IMPORT'"."""
    import shutil

    from conftest import _free_port, _wait_ready

    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_ready(port, proc)
        r = redis.Redis(port=port)
        r.set("user_memory_a", json.dumps(ALICE))
        with pytest.raises(redis.ResponseError, match="no redis-mem module"):
            mig.migrate(r, delete_source=True)
        out = subprocess.run([SCRIPT, "--port", str(port), "--delete-source"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "no redis-mem module" in out.stderr
        assert r.exists("user_memory_a")
    finally:
        proc.kill()
        proc.wait(timeout=10)


KILLED_AT = """
import os, signal, sys
import redis
import redis_mem.migrate as mig
where = sys.argv[1]
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if where == "import":  # imported into its temporary key, no expiry yet
    mig._mortal = die
elif where == "verify":  # the session is in its temporary key, not yet renamed
    mig._verify = die
else:  # its expiry taken off, not yet renamed
    real_persist = redis.Redis.persist
    def persist_then_die(self, name):
        real_persist(self, name)
        die()
    redis.Redis.persist = persist_then_die
sys.exit(mig.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("where", ["import", "verify", "persist"])
def test_a_run_killed_mid_session_leaves_nothing_that_outlives_it(r, clean, where, monkeypatch):
    """Hostile passes 28 F3, 29 F4: kill -9 between the import and the rename
    left the temporary session of a source without expiry, for good."""
    r.set("user_memory_a", json.dumps(ALICE))
    args = ["--port", str(clean.port), "--delete-source"]
    out = subprocess.run([sys.executable, "-c", KILLED_AT, where, *args], capture_output=True, timeout=60)
    assert out.returncode == -9, out.stderr
    assert r.exists("user_memory_a")  # the source is deleted only after its session is in place
    left = [k for k in r.keys("*") if k != "user_memory_a"]
    assert len(left) == 1 and "~redis-mem-migrate~" in left[0]
    if where == "verify":
        assert 0 < r.pttl(left[0]) <= mig.SCRATCH_LIFETIME_MS  # goes by itself
    else:
        assert r.pttl(left[0]) == -1  # a rerun removes it once it is idle
    # A rerun while it may still be a live run's leaves it; once idle, removes it.
    assert mig.migrate(r, dry_run=True).leftovers == []
    monkeypatch.setattr(mig, "LEFTOVER_IDLE_S", 0)
    dry = mig.migrate(r, dry_run=True, delete_source=True)
    assert dry.leftovers == ([] if where == "verify" else left) and r.exists(left[0])
    # The rerun moves it; the session has no expiry, as its source had none.
    rep = mig.migrate(r, delete_source=True)
    assert [(x.status, x.deleted) for x in rep.results] == [(mig.MOVED, True)]
    assert ("temporary key(s) an interrupted run left" in rep.render()) == (where != "verify")
    assert r.pttl("mem:{a}") == -1 and not r.exists("user_memory_a")
    assert r.keys("*") == ["mem:{a}"] or (where == "verify" and len(r.keys("*")) == 2)
    assert [m.content for m in RedisMemClient(r).get("mem:{a}")] == [
        m["content"] for m in ALICE["conversation_history"]]
