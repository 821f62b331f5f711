"""redis-mem-summarizer as a service: the console script against a real
server and a fake OpenAI-compatible endpoint served by the test, SIGTERM,
the SCAN sweep, LLM retries with backoff, a LangChain chat model, and a real
3-master cluster (keyspace events are node-local)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from langchain_core.messages import AIMessage
from redis.cluster import RedisCluster

import redis_mem.summarizer as sw
from conftest import start_server
from fakes import OpenAIStub, ScriptedModel
from redis_mem import RedisMemClient

SCRIPT = os.path.join(os.path.dirname(sys.executable), "redis-mem-summarizer")


def fill(mem, key, n=6, maxmsgs=6):
    """A session at its threshold (maxmsgs 6 -> threshold 5 messages)."""
    for i in range(1, n + 1):
        mem.append(key, "user", f"message {i} about the trip to Lisbon", maxmsgs=maxmsgs)


def wait_for(what, cond, limit=60.0):
    """Polls cond() until true; fails with `what` after `limit` seconds (a
    bound against hanging, not a timing assertion)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for: {what}")


@pytest.fixture
def stub():
    s = OpenAIStub(lambda body: "Summary: a trip to Lisbon was planned.")
    yield s
    s.close()


def test_console_service_with_an_openai_compatible_endpoint_and_sigterm(r, clean, stub):
    mem = RedisMemClient(r)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["OPENAI_API_KEY"] = "sk-test"
    proc = subprocess.Popen(
        [SCRIPT, "--url", clean.url, "--keep", "2", "--sweep-interval", "0",
         "--openai-base-url", stub.url, "--openai-model", "tiny"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # The service is subscribed once it set the notification flags.
        wait_for("the service configured notifications",
                 lambda: "d" in r.config_get("notify-keyspace-events")["notify-keyspace-events"])
        wait_for("the service subscribed", lambda: r.pubsub_numsub("__keyevent@0__:mem.threshold")[0][1] == 1)
        fill(mem, "mem:{trip}")
        wait_for("the summary", lambda: (mem.get("mem:{trip}") or [None])[0] is not None
                 and mem.get("mem:{trip}")[0].is_summary)
        entry = mem.get("mem:{trip}")[0]
        assert entry.content == "Summary: a trip to Lisbon was planned."
        assert stub.requests[0]["model"] == "tiny"
        assert "message 1 about the trip" in stub.requests[0]["messages"][-1]["content"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if "summarized key=mem:{trip}" in line]
    assert len(lines) == 1, err
    line = lines[0]
    # One line per summary: latency and tokens (session before -> after, the
    # summary's, and what the endpoint reported).
    # (upto: every message but the newest 2 when the service got to it: the
    # event comes at the 5th append, the 6th may have landed by then.)
    upto = entry.id
    for part in (f"upto={upto}", f"messages={upto}", "latency_ms=", "tokens=", "summary_tokens=",
                 "llm_tokens=100+7"):
        assert part in line, line
    assert "signal 15: stopping" in err and "stopped:" in err


def test_the_sweep_finds_sessions_whose_event_was_missed(r):
    mem = RedisMemClient(r)
    for k in ("mem:{a}", "mem:{b}"):
        fill(mem, k)  # notifications off: no event was ever sent
    mem.append("mem:{small}", "user", "hi")
    r.set("not-a-session", "x")
    worker = sw.SummarizerWorker(r, summarize_fn=sw.extractive_summarize, keep=2, sweep_interval=0.2)
    assert sorted(worker.sweep()) == ["mem:{a}", "mem:{b}"]
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_for("both summarized", lambda: worker.stats["committed"] == 2)
    finally:
        worker.stop()
        t.join(10)
    assert all(mem.get(k)[0].is_summary for k in ("mem:{a}", "mem:{b}"))
    assert not mem.get("mem:{small}")[0].is_summary


def test_a_failing_endpoint_is_retried_with_backoff(r):
    stub = OpenAIStub(lambda body: "Third time lucky.", fail_first=2)
    try:
        mem = RedisMemClient(r)
        fill(mem, "mem:{flaky}")
        fn = sw.openai_summarizer(stub.url, "k", model="m", timeout=5)
        worker = sw.SummarizerWorker(r, summarize_fn=fn, keep=2, backoff=0.05, llm_retries=2)
        done = worker.run_once("mem:{flaky}")
    finally:
        stub.close()
    assert done is not None and len(stub.requests) == 3
    assert worker.stats["llm_calls"] == 3 and worker.stats["llm_failures"] == 0
    assert (done.llm_prompt_tokens, done.llm_completion_tokens) == (100, 7)
    assert mem.get("mem:{flaky}")[0].content == "Third time lucky."


def test_any_langchain_chat_model_summarizes(r):
    seen = []

    def respond(messages):
        seen.append(messages)
        return AIMessage("LangChain summary.", usage_metadata={"input_tokens": 50, "output_tokens": 3, "total_tokens": 53})

    mem = RedisMemClient(r)
    fill(mem, "mem:{lc}")
    worker = sw.SummarizerWorker(r, summarize_fn=sw.langchain_summarizer(ScriptedModel(respond=respond, prompts=[])), keep=2)
    done = worker.run_once("mem:{lc}")
    assert (done.llm_prompt_tokens, done.llm_completion_tokens) == (50, 3)
    assert mem.get("mem:{lc}")[0].content == "LangChain summary."
    assert seen[0][0].type == "system" and "message 4 about" in seen[0][1].content


# -- a real cluster -------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path):
    cli = shutil.which(os.environ.get("REDIS_CLI", "redis-cli")) or os.environ.get("REDIS_CLI")
    if not cli:
        pytest.skip("redis-cli is needed to create a cluster")
    nodes = [start_server(str(tmp_path), ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf"])
             for i in range(3)]
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


def test_the_service_listens_on_every_master_of_a_cluster(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    try:
        mem = RedisMemClient(rc)
        # Sessions on every master (hash tags chosen so each node owns some).
        keys, owners = [], set()
        for i in range(40):
            key = f"mem:{{user{i}}}"
            owner = rc.get_node_from_key(key).port
            if owner not in owners or len(keys) < 6:
                keys.append(key)
                owners.add(owner)
        assert owners == {n.port for n in cluster}
        worker = sw.SummarizerWorker(rc, summarize_fn=sw.extractive_summarize, keep=2, sweep_interval=0)
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        try:
            wait_for("subscribed on every master", worker.ready.is_set)
            for key in keys:
                fill(mem, key)  # the mem.threshold event fires on the key's own node
            wait_for("every session summarized", lambda: worker.stats["committed"] == len(keys))
        finally:
            worker.stop()
            t.join(10)
        assert all(mem.get(k)[0].is_summary for k in keys)
        assert worker.stats["sweeps"] == 0  # events alone did it
    finally:
        rc.close()


def test_the_service_resubscribes_after_redis_restarts(own_server):
    srv = own_server()
    r = srv.client(socket_connect_timeout=1)
    worker = sw.SummarizerWorker(srv.client(socket_connect_timeout=1, socket_timeout=5),
                                 summarize_fn=sw.extractive_summarize, keep=2, backoff=0.1, sweep_interval=0)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_for("subscribed", worker.ready.is_set)
        srv.stop()
        wait_for("the loss noticed", lambda: worker.stats["reconnects"] >= 1)
        srv.start_again()  # an empty server: notifications off again
        wait_for("subscribed again", lambda: r.pubsub_numsub("__keyevent@0__:mem.threshold")[0][1] == 1)
        fill(RedisMemClient(r), "mem:{back}")
        wait_for("summarized after the restart", lambda: worker.stats["committed"] == 1)
    finally:
        worker.stop()
        t.join(10)
    assert RedisMemClient(r).get("mem:{back}")[0].is_summary
