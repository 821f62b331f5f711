"""The runnable examples in examples/ work against a real server (offline:
their stand-in models), twice in a row, as separate processes: the second
run continues the first one's conversation from the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT
from redis_mem import RedisMemClient

EXAMPLES = os.path.join(REPO_ROOT, "examples")


def run_example(name, url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    # No protocol pin: the examples run on redis-py's default (RESP3 on
    # redis-py 8) and on RESP2 alike (test_langchain_agent_example_resp2).
    env["REDIS_URL"] = url
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_langchain_agent_example(clean):
    first = run_example("langchain_agent.py", clean.url)
    assert "It is sunny and 24 C in Lisbon." in first
    run_example("langchain_agent.py", clean.url)
    entries = RedisMemClient(clean.client()).get("mem:{demo}")
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"] * 2


def test_langchain_agent_example_resp2(clean):
    """The example's MEM.INFO read holds on RESP2 too (redis-py 5-7's default)."""
    out = run_example("langchain_agent.py", clean.url + "?protocol=2")
    assert "holds 4 messages" in out


def test_langchain_agent_example_resp3(clean):
    """redis-py 8's default is RESP3, where MEM.INFO is a map, not an array."""
    out = run_example("langchain_agent.py", clean.url + "?protocol=3")
    assert "holds 4 messages" in out


def test_langgraph_example(clean):
    out = run_example("langgraph_graph.py", clean.url)
    assert "1 message(s)" in out and "2 message(s)" in out
    assert "3 message(s)" in run_example("langgraph_graph.py", clean.url)  # continued from the session


def test_dify_n8n_example(clean):
    out = run_example("dify_n8n_conversation_ids.py", clean.url)
    lines = out.splitlines()
    assert lines[0].split()[0] == lines[1].split()[0]  # the same Dify conversation id both turns
    mem = RedisMemClient(clean.client())
    assert sorted(mem.info("mem:{carol}").external) == ["dify", "n8n"]
    assert mem.extget("mem:{carol}", "dify") == lines[0].split()[0]


def _sse_events(resp, limit=None):
    """(id, event, data) of an SSE response, up to ``limit`` events."""
    out, cur = [], {}
    while limit is None or len(out) < limit:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\n")
        if not line:
            if "data" in cur:
                out.append((cur.get("id"), cur.get("event"), json.loads(cur["data"])))
            cur = {}
            continue
        field, _, value = line.partition(": ")
        cur[field] = value
    return out


def test_sse_chat_example_resumes_from_last_event_id(clean, tmp_path):
    """The SSE example over plain HTTP (the browser test drives it in Chromium):
    a stream read halfway, then reconnected with Last-Event-ID, gets the rest;
    the same POST sent twice is one message and one reply."""
    import http.client
    import importlib.util
    import time

    from conftest import _free_port

    app = os.path.join(EXAMPLES, "sse_chat", "app.py")
    port = _free_port()
    log = open(tmp_path / "app.log", "w")
    proc = subprocess.Popen([sys.executable, app, "--port", str(port), "--redis-url", clean.url,
                             "--token-delay", "0.02", "--tokens", "25", "--name", "solo"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/healthz")
                assert json.load(c.getresponse())["server"] == "solo"
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the app did not start"
                time.sleep(0.05)

        def post():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/chat", json.dumps({"session": "sse", "message": "hi there", "message_id": "m-1"}),
                      {"Content-Type": "application/json"})
            return json.load(c.getresponse())["reply_id"]

        reply_id = post()
        assert post() == reply_id  # sent again: the same reply
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", f"/stream?session=sse&reply={reply_id}")
        first = _sse_events(c.getresponse(), limit=10)
        c.close()  # the connection drops
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", f"/stream?session=sse&reply={reply_id}&after=0", headers={"Last-Event-ID": first[-1][0]})
        rest = _sse_events(c.getresponse())
        spec = importlib.util.spec_from_file_location("sse_chat_app", app)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        expected = mod.fake_reply_tokens("hi there", 25)
        chunks = [d["text"] for _, ev, d in first + rest if ev == "chunk"]
        assert chunks == expected
        assert [ev for _, ev, _ in rest][-1] == "end"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", f"/stream?session=sse&reply={reply_id}", headers={"Last-Event-ID": "$"})
        assert c.getresponse().status == 400  # not an event id: refused, not passed to XREAD
        msgs = RedisMemClient(clean.client()).get("mem:{sse}")
        assert [(m.role, m.content, m.msgid) for m in msgs] == [
            ("user", "hi there", "m-1"), ("assistant", "".join(expected), reply_id)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
