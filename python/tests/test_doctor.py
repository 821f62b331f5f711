"""`redis-mem doctor`: the console script and `diagnose()` against real
servers with the module (one configured as production wants, the suite's
own without persistence, one without the module, a 3-master cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster

import redis_mem.summarizer as sw
from conftest import _free_port, _wait_ready, start_server
from redis_mem import RedisMemClient
from redis_mem.doctor import ERROR, INFO, OK, WARNING, Finding, diagnose, exit_code

SCRIPT = os.path.join(os.path.dirname(sys.executable), "redis-mem")
#: A server as production wants it: AOF, the summarizer's events.
PRODUCTION = ("--appendonly", "yes", "--notify-keyspace-events", "dE")


def wait_for(what, cond, limit=60.0):
    """Polls cond() until true; fails after `limit` seconds (a bound against
    hanging, not a timing assertion)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for: {what}")


def doctor(*args, timeout=60):
    """Runs the installed console script; (exit status, stdout, stderr)."""
    p = subprocess.run([SCRIPT, "doctor", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def doctor_json(*args):
    rc, out, err = doctor("--json", *args)
    assert rc in (0, 1), err
    return rc, [Finding(**f) for f in json.loads(out)]


def about(findings, subject, level=None, text=""):
    """The findings on `subject` (a key, or `server` for any server) at
    `level` whose message contains `text`."""
    return [f for f in findings
            if (f.subject == subject or (subject == "server" and f.subject.startswith("server ")))
            and (level is None or f.level == level) and text in f.message]


def bad(findings):
    return [f for f in findings if f.level in (WARNING, ERROR)]


# -- a healthy server and session ---------------------------------------------------


def test_a_healthy_session_on_a_production_server(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    mem.append("mem:{alice}", "user", "Hi, I'm Alice", model="gpt-4o", ttl=3600)
    mem.append("mem:{alice}", "assistant", "Hello Alice!")
    mem.extset("mem:{alice}", "dify", "conv-42", ex=600)
    mem.attrset("mem:{alice}", "user_profile", {"name": "Alice"})
    worker = sw.SummarizerWorker(srv.client(), summarize_fn=sw.extractive_summarize, keep=2, sweep_interval=0)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_for("the summarizer subscribed", worker.ready.is_set)
        rc, findings = doctor_json("--url", srv.url, "alice")          # a session id: mem:{alice}
    finally:
        worker.stop()
        t.join(10)
    assert bad(findings) == [], [f.line() for f in bad(findings)]
    assert rc == 0
    # The server: the module and its version, events, persistence, policy, encodings, summarizers.
    build = r.info("mem")["mem_build"]
    assert about(findings, "server", OK, f"redis-mem module loaded: version 1, build {build}")
    assert about(findings, "server", OK, "notify-keyspace-events 'dE' carries mem.threshold (d, E)")
    assert about(findings, "server", OK, "persistence: AOF on (appendfsync everysec)")
    assert about(findings, "server", OK, "maxmemory-policy noeviction")
    assert about(findings, "server", INFO, "encodings built: o200k_base")
    assert about(findings, "server", OK, "1 summarizer(s) subscribed to __keyevent@0__:mem.threshold")
    # The session, with its facts.
    key = "mem:{alice}"
    ttl = r.pttl(key)
    assert 0 < ttl <= 3600_000
    exists = about(findings, key, OK, "exists, 2 messages; expires in ")
    assert exists and "(its TTL setting 3600s" in exists[0].message
    assert about(findings, key, OK, "model gpt-4o: counted exactly with o200k_base")
    check = mem.summarize_check(key)
    assert about(findings, key, OK, f"2 messages, {check.total_tokens} tokens; summarize at "
                 f"{check.threshold_messages} messages or {check.threshold_tokens} tokens; caps 30 messages, "
                 "80000 tokens")
    assert about(findings, key, OK, "no message was evicted without a summary")
    assert about(findings, key, OK, "no summary yet")
    assert about(findings, key, OK, "attributes: user_profile")
    ext = about(findings, key, OK, "external conversation ids: dify (")
    assert ext and ext[0].message.endswith("left)")
    # JSON shape: every finding {level, subject, message, fix}.
    rc2, out, _ = doctor("--json", "--url", srv.url, "alice")
    for f in json.loads(out):
        assert set(f) == {"level", "subject", "message", "fix"}
        assert f["level"] in (OK, INFO, WARNING, ERROR)
    # The text: one line per finding, then the verdict.
    rc3, text, _ = doctor("--url", srv.url, "mem:{alice}")
    lines = text.splitlines()
    assert rc3 == 0 and lines[-1] == "healthy: nothing to fix"
    assert any(line.startswith("OK      mem:{alice}: exists, 2 messages") for line in lines)


def test_a_missing_session_is_an_error_with_its_fix(own_server):
    srv = own_server(*PRODUCTION)
    rc, findings = doctor_json("--url", srv.url, "nobody", "mem:{gone}")
    assert rc == 1
    for key in ("mem:{nobody}", "mem:{gone}"):
        [f] = [f for f in findings if f.subject == key]
        assert f.level == ERROR and f.message.startswith("does not exist: it expired")
        assert "raise the TTL" in f.fix
    # Not a session at all.
    srv.client().set("mem:{str}", "x")
    [f] = [f for f in diagnose(srv.client(), ["mem:{str}"]) if f.subject == "mem:{str}"]
    assert (f.level, f.message) == (ERROR, "is a string, not a redis-mem session")


def test_an_expired_session_is_reported_missing(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    RedisMemClient(r).append("mem:{brief}", "user", "hi", ttl=1)
    assert about(diagnose(r, ["mem:{brief}"]), "mem:{brief}", OK, "exists, 1 messages; expires in ")
    wait_for("the session to expire", lambda: r.exists("mem:{brief}") == 0)
    assert about(diagnose(r, ["mem:{brief}"]), "mem:{brief}", ERROR, "does not exist")


# -- what made it forget -----------------------------------------------------------


def test_messages_the_caps_removed_without_a_summary(own_server):
    """MEM.INFO `evicted` (SPEC v3): the caps removed 3 messages no summary
    covers."""
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    for i in range(6):
        mem.append("mem:{lost}", "user", f"message {i}", maxmsgs=3)
    info = mem.info("mem:{lost}")
    assert info.evicted == 3
    assert info.summarized == 0 and info.summary_ts == 0
    rc, findings = doctor_json("--url", srv.url, "lost")
    assert rc == 1
    [f] = about(findings, "mem:{lost}", WARNING, "removed")
    assert f.message == "the caps or MAXAGE removed 3 messages that no summary covers"
    assert f.fix.startswith("run a summarizer (redis-mem-summarizer) / raise the caps")
    assert about(findings, "mem:{lost}", WARNING, "at its caps (3/3 messages")


def test_the_last_summary_and_what_it_covers(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    for i in range(4):
        mem.append("mem:{sum}", "user", f"message {i}")
    before = int(time.time() * 1000)
    mem.summarize("mem:{sum}", 2, "Two messages about nothing.")
    info = mem.info("mem:{sum}")
    assert info.summarized == 2 and info.evicted == 0
    assert before - 1000 <= info.summary_ts <= int(time.time() * 1000) + 1000
    [f] = about(diagnose(r, ["mem:{sum}"]), "mem:{sum}", OK, "last summary ")
    assert "covering messages up to id 2, 2 messages summarized in all" in f.message


def test_external_ids_with_their_lifetimes(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    mem.append("mem:{ext}", "user", "hi")
    mem.extset("mem:{ext}", "dify", "conv-1", ex=600)
    mem.extset("mem:{ext}", "n8n", "sess-1", ex=7200)
    info = mem.info("mem:{ext}")
    assert set(info.external_ttl) == {"dify", "n8n"}
    assert 0 < info.external_ttl["dify"] <= 600_000 < info.external_ttl["n8n"] <= 7200_000
    [f] = about(diagnose(r, ["mem:{ext}"]), "mem:{ext}", OK, "external conversation ids: ")
    assert "dify (9m 5" in f.message and "n8n (1h 59m left)" in f.message


def test_a_live_lease_is_shown_and_the_doctor_takes_none(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    for i in range(6):
        mem.append("mem:{due}", "user", f"message {i}", maxmsgs=6)   # threshold 5: due
    # Due, no lease: a warning (no summary running), and the doctor leaves the lease free.
    findings = diagnose(r, ["mem:{due}"])
    assert about(findings, "mem:{due}", WARNING, "over its summarize threshold")
    begin = mem.summarize_begin("mem:{due}", 60_000, keep=2)
    assert begin.lease > 0                        # the doctor took none
    findings = diagnose(r, ["mem:{due}"])
    [f] = about(findings, "mem:{due}", INFO, "a summarizer holds its lease for ")
    assert "more (until " in f.message
    assert not about(findings, "mem:{due}", WARNING, "over its summarize threshold")
    # The worker's lease is still its own: its summary goes through.
    assert mem.summarize("mem:{due}", begin.upto, "Summary.", lease=begin.lease).messages == 2


def test_a_model_counted_approximately(own_server):
    srv = own_server(*PRODUCTION)
    r = srv.client()
    RedisMemClient(r).append("mem:{claude}", "user", "hi", model="claude-sonnet-4-5")
    [f] = about(diagnose(r, ["mem:{claude}"]), "mem:{claude}", INFO, "model claude-sonnet-4-5: counted with ")
    assert "an approximation" in f.message and "TOKENS" in f.fix


# -- the server --------------------------------------------------------------------


def test_an_evicting_maxmemory_policy_is_flagged(own_server):
    srv = own_server(*PRODUCTION, "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru")
    rc, findings = doctor_json("--url", srv.url)
    assert rc == 1
    [f] = about(findings, "server", WARNING, "maxmemory-policy allkeys-lru")
    assert "sessions included" in f.message and "noeviction" in f.fix
    srv.client().config_set("maxmemory-policy", "volatile-ttl")
    [f] = about(diagnose(srv.client()), "server", WARNING, "maxmemory-policy volatile-ttl")
    assert "sessions have one (mem.ttl)" in f.message
    srv.client().config_set("maxmemory-policy", "noeviction")
    assert about(diagnose(srv.client()), "server", OK, "maxmemory-policy noeviction")


def test_keyspace_events_the_summarizer_needs(own_server):
    srv = own_server("--appendonly", "yes")
    r = srv.client()
    rc, findings = doctor_json("--url", srv.url)
    assert rc == 1
    [f] = about(findings, "server", WARNING, "notify-keyspace-events is empty, lacking 'dE'")
    assert f.fix.startswith("CONFIG SET notify-keyspace-events dE")
    r.config_set("notify-keyspace-events", "K$")     # keyspace string events: no module events, no E
    [f] = about(diagnose(r), "server", WARNING, "lacking 'dE'")
    r.config_set("notify-keyspace-events", "Ed")     # what the summarizer sets (the server says "dE")
    assert about(diagnose(r), "server", OK, "carries mem.threshold (d, E)")
    r.config_set("notify-keyspace-events", "AK")     # A includes d, but no E
    assert about(diagnose(r), "server", WARNING, "lacking 'E'")
    r.config_set("notify-keyspace-events", "KEA")
    assert exit_code(diagnose(r)) == 0


def test_persistence_is_flagged(clean):
    """The suite's server runs with --save '' --appendonly no."""
    r = clean.client()
    r.config_set("notify-keyspace-events", "dE")
    try:
        findings = diagnose(r)
        [f] = about(findings, "server", WARNING, "no persistence")
        assert "a restart loses every session" in f.message and f.fix.startswith("CONFIG SET appendonly yes")
        assert exit_code(findings) == 1
        r.config_set("save", "900 1")
        [f] = about(diagnose(r), "server", WARNING, "persistence: RDB snapshots only (save '900 1')")
        r.config_set("appendonly", "yes")
        assert about(diagnose(r), "server", OK, "persistence: AOF on")
        assert exit_code(diagnose(r)) == 0
    finally:
        r.config_set("appendonly", "no")
        r.config_set("save", "")
        r.config_set("notify-keyspace-events", "")


def test_a_server_without_the_module(tmp_path):
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir",
                             str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_ready(port, proc)
        rc, findings = doctor_json("--url", f"redis://127.0.0.1:{port}/0", "alice")
        assert rc == 1
        [f] = about(findings, "server", ERROR, "the redis-mem module is not loaded")
        assert f.fix.startswith("loadmodule /path/to/libredis_mem.so")
        [f] = about(findings, "mem:{alice}", ERROR)
        assert f.message.startswith("not checked: the module is not loaded on 127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(10)


def test_exit_codes(own_server, tmp_path):
    srv = own_server(*PRODUCTION)
    assert doctor("--url", srv.url)[0] == 0                         # healthy
    srv.client().config_set("appendonly", "no")
    rc, out, _ = doctor("--url", srv.url)                            # a warning
    assert rc == 1 and out.splitlines()[-1] == "1 finding(s) to fix"
    # Unreachable: 2, and a message saying where.
    port = _free_port()
    rc, out, err = doctor("--url", f"redis://127.0.0.1:{port}/0")
    assert rc == 2 and f"127.0.0.1:{port}" in err and out == ""
    # Wrong arguments: 2 (argparse).
    assert doctor("--key-template", "nothing")[0] == 2


# -- a cluster -----------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    cli = shutil.which(os.environ.get("REDIS_CLI", "redis-cli")) or os.environ.get("REDIS_CLI")
    assert cli, "redis-cli is needed to create a cluster (set REDIS_CLI)"
    nodes = [start_server(str(tmp_path), ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf",
                                          *PRODUCTION]) for i in range(3)]
    try:
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
                        "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_for("cluster_state:ok", lambda: all(
            "cluster_state:ok" in redis.Redis(port=n.port).execute_command("CLUSTER", "INFO").decode()
            for n in nodes))
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_every_master_of_a_cluster(cluster):
    rc_ = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    try:
        mem = RedisMemClient(rc_)
        keys, owners = [], {}
        for i in range(60):
            key = f"mem:{{user{i}}}"
            port = rc_.get_node_from_key(key).port
            if port not in owners:
                owners[port] = key
                mem.append(key, "user", f"hi from {key}")
                keys.append(key)
        assert set(owners) == {n.port for n in cluster}
        # One master with a problem: an evicting policy.
        redis.Redis(port=cluster[1].port).config_set("maxmemory-policy", "allkeys-lfu")
    finally:
        rc_.close()
    for flag in ([], ["--cluster"]):       # detected from INFO cluster, or told
        rc, findings = doctor_json("--url", cluster[0].url, *flag, *keys, "mem:{missing}")
        assert rc == 1
        for n in cluster:
            subject = f"server 127.0.0.1:{n.port}"
            assert [f for f in findings if f.subject == subject and "cluster master" in f.message], subject
            assert [f for f in findings if f.subject == subject and "redis-mem module loaded" in f.message]
        [f] = [f for f in findings if f.level == WARNING and "maxmemory-policy" in f.message]
        assert f.subject == f"server 127.0.0.1:{cluster[1].port}"
        for key in keys:                     # each checked on the master that owns it
            assert about(findings, key, OK, "exists, 1 messages; expires in ")
        assert about(findings, "mem:{missing}", ERROR, "does not exist")


def test_diagnose_on_every_connection_kind_writes_nothing(conn):
    """RESP2/RESP3, bytes or str: the same findings; the doctor changes
    nothing (no key, no lease, no write counted)."""
    mem = RedisMemClient(conn)
    for i in range(6):
        mem.append("mem:{kind}", "user", f"message {i}", maxmsgs=6, ttl=600)
    before = (conn.dbsize(), conn.info("mem")["mem_leases_granted"], conn.info("mem")["mem_appends"])
    findings = diagnose(conn, ["kind", "mem:{none}"])
    assert about(findings, "server", OK, "redis-mem module loaded: version 1")
    assert about(findings, "mem:{kind}", OK, "exists, 6 messages; expires in ")
    assert about(findings, "mem:{kind}", INFO, "6 messages, 42 tokens; summarize at 5 messages or 19200 tokens")
    assert about(findings, "mem:{kind}", WARNING, "over its summarize threshold")
    assert about(findings, "mem:{none}", ERROR, "does not exist")
    assert about(findings, "mem:{kind}", OK, "no attributes (no session context set, or its lifetime ended)")
    after = (conn.dbsize(), conn.info("mem")["mem_leases_granted"], conn.info("mem")["mem_appends"])
    assert after == before
    assert mem.summarize_begin("mem:{kind}", 1000, keep=2).lease > 0


def test_the_session_context_layer_and_its_lifetime(own_server):
    """The seed's 1 h context (SessionContext): listed while it lives, gone
    from the report once its own lifetime ends; the session stays."""
    from redis_mem import SessionContext

    srv = own_server(*PRODUCTION)
    r = srv.client()
    RedisMemClient(r).append("mem:{ctx}", "user", "hi")
    ctx = SessionContext(r, "mem:{ctx}", ttl=1)
    ctx.set({"step": "search"})
    SessionContext(r, "mem:{ctx}", ttl=None, name="user_profile").set({"name": "Ann"})
    [f] = about(diagnose(r, ["ctx"]), "mem:{ctx}", OK, "attributes: context (")
    assert f.message.endswith("s left), user_profile")
    wait_for("the context's lifetime to end", lambda: ctx.get() is None)
    findings = diagnose(r, ["ctx"])
    assert about(findings, "mem:{ctx}", OK, "attributes: user_profile")
    assert about(findings, "mem:{ctx}", OK, "exists, 1 messages")


def test_session_info_v3_fields_on_every_connection_kind(conn):
    """MEM.INFO's SPEC v3 fields as SessionInfo gives them: ints, and
    external_ttl a dict of str -> ms (RESP2 sends a flat array)."""
    mem = RedisMemClient(conn)
    for i in range(5):
        mem.append("mem:{v3}", "user", f"message {i}", maxmsgs=4)
    mem.extset("mem:{v3}", "dify", "conv-9", ex=100)
    info = mem.info("mem:{v3}")
    assert (info.evicted, info.summarized, info.summary_ts) == (1, 0, 0)
    assert list(info.external_ttl) == ["dify"] and 0 < info.external_ttl["dify"] <= 100_000
    mem.summarize("mem:{v3}", info.first_id + 1, "Summary.")
    info = mem.info("mem:{v3}")
    assert (info.evicted, info.summarized) == (1, 2) and info.summary_ts > 0


def test_a_read_only_user_gets_findings_not_an_exit_2(own_server):
    """An ACL user with +@read +info only (no MODULE LIST, CONFIG GET,
    PUBSUB): the doctor falls back to INFO modules, says what it could not
    check, and goes on to the sessions."""
    srv = own_server(*PRODUCTION)
    r = srv.client()
    RedisMemClient(r).append("mem:{ro}", "user", "hello")
    r.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "~*", "resetchannels", "-@all", "+@read", "+info")
    url = f"redis://reader:pw@127.0.0.1:{srv.port}/0"
    assert "no permissions" in str(pytest.raises(redis.ResponseError, redis.Redis.from_url(url).execute_command,
                                                 "MODULE", "LIST").value).lower()
    rc, out, err = doctor("--json", "--url", url, "ro")
    assert rc in (0, 1), (rc, out, err)
    findings = [Finding(**f) for f in json.loads(out)]
    assert about(findings, "server", OK, "redis-mem module loaded")
    assert about(findings, "server", INFO, "INFO modules")
    assert about(findings, "server", INFO, "not checked: this user may not run CONFIG GET")
    assert about(findings, "server", INFO, "not checked: this user may not run PUBSUB NUMSUB")
    # The module's commands are in no ACL category: +@read alone cannot check a
    # session, and the finding says which commands to grant.
    [f] = about(findings, "mem:{ro}", ERROR, "no permissions")
    assert "+mem.info" in f.fix
    # With them, the session is checked.
    r.execute_command("ACL", "SETUSER", "reader", "+mem.info", "+mem.models", "+mem.summarize_check",
                      "+mem.attrget", "+mem.get", "+time")
    rc, out, err = doctor("--json", "--url", url, "ro")
    assert rc in (0, 1), (rc, out, err)
    findings = [Finding(**f) for f in json.loads(out)]
    assert about(findings, "mem:{ro}", OK, "exists, 1 messages")
    assert not about(findings, "mem:{ro}", ERROR)
    # Not even INFO modules: the module check is skipped with a finding, the rest goes on.
    r.execute_command("ACL", "SETUSER", "reader", "-info", "+info|server", "+info|replication", "+info|mem",
                      "+info|cluster")
    rc, out, err = doctor("--json", "--url", url, "ro")
    assert rc in (0, 1), (rc, out, err)
    findings = [Finding(**f) for f in json.loads(out)]
    assert about(findings, "server", INFO, "whether the module is loaded not checked")
    assert about(findings, "mem:{ro}", OK, "exists, 1 messages")


def test_summaries_the_caps_dropped_are_a_warning(own_server):
    """MEM.INFO `summaries_dropped`: the caps evicted a summary, and what it
    covered with it."""
    srv = own_server(*PRODUCTION)
    r = srv.client()
    mem = RedisMemClient(r)
    for i in range(5):
        mem.append("mem:{drop}", "user", f"message {i}")
    reply = r.execute_command("MEM.INFO", "mem:{drop}")
    raw = dict(zip(reply[0::2], reply[1::2])) if isinstance(reply, list) else reply
    if "summaries_dropped" not in raw:
        pytest.skip("this module's MEM.INFO has no 'summaries_dropped' field (the module change is not merged)")
    assert mem.info("mem:{drop}").summaries_dropped == 0
    r.execute_command("MEM.SUMMARIZE", "mem:{drop}", 3, "A long summary of what was said. " * 20)
    r.execute_command("MEM.APPEND", "mem:{drop}", "user", "hi", "MAXTOKENS", 30)
    info = mem.info("mem:{drop}")
    assert info.summaries_dropped and info.summaries_dropped > 0
    rc, findings = doctor_json("--url", srv.url, "drop")
    assert rc == 1
    [f] = about(findings, "mem:{drop}", WARNING, "summaries")
    assert f.message == f"the caps dropped {info.summaries_dropped} summaries: what they covered is lost"
    assert "MAXTOKENS" in f.fix and "summarize earlier" in f.fix


def test_session_info_summaries_dropped_is_none_when_absent():
    from redis_mem._replies import SessionInfo

    base = {"messages": 1, "total_tokens": 3, "first_id": 1, "last_id": 1, "ttl": -1, "model": "gpt-4o",
            "encoding": "o200k_base", "maxmsgs": 10, "maxtokens": 100, "created": 1, "updated": 1,
            "summary_upto": 0}
    fields = {f.name for f in __import__("dataclasses").fields(SessionInfo)}
    base = {k: v for k, v in base.items() if k in fields}
    for name in fields - set(base) - {"external", "evicted", "summaries_dropped", "summarized", "summary_ts",
                                      "external_ttl", "lease_ttl"}:
        base[name] = 0
    assert SessionInfo.from_reply(base).summaries_dropped is None
    assert SessionInfo.from_reply({**base, "summaries_dropped": 2}).summaries_dropped == 2
