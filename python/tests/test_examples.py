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


# -- the SSE example against hostile requests ---------------------------------


def _start_sse(clean, tmp_path, *extra):
    """The SSE example as a process on a free port: (port, proc, log path)."""
    import http.client
    import time

    from conftest import _free_port

    app = os.path.join(EXAMPLES, "sse_chat", "app.py")
    port = _free_port()
    logpath = tmp_path / f"app-{port}.log"
    log = open(logpath, "w")
    proc = subprocess.Popen([sys.executable, app, "--port", str(port), "--redis-url", clean.url,
                             "--name", "hostile", *extra], stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    log.close()
    deadline = time.monotonic() + 20
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz")
            c.getresponse().read()
            return port, proc, logpath
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the app did not start"
            time.sleep(0.05)


def _call(port, method, path, body=None, headers=None, timeout=10):
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body, headers or {})
    resp = c.getresponse()
    data = resp.read()
    c.close()
    return resp.status, resp.getheader("Content-Type"), data


def test_sse_chat_example_refuses_bad_posts_before_any_write(clean, tmp_path):
    port, proc, _ = _start_sse(clean, tmp_path, "--token-delay", "0.01", "--tokens", "3")
    r = clean.client()
    try:
        for body in [
            json.dumps({"session": "}", "message": "hi"}),                  # breaks the key's hash tag
            json.dumps({"session": "a{b", "message": "hi"}),
            json.dumps({"session": "", "message": "hi"}),
            json.dumps({"session": "x" * 65, "message": "hi"}),
            json.dumps({"session": ["s"], "message": "hi"}),
            json.dumps({"session": "s", "message": ""}),
            json.dumps({"session": "s", "message": {"a": 1}}),
            json.dumps({"session": "s", "message": "hi", "message_id": "a\nb"}),
            json.dumps({"session": "s", "message": "hi", "message_id": "x" * 200}),
            json.dumps({"session": "s", "message": "hi", "message_id": 5}),
            json.dumps(["s", "hi"]),
            "not json",
            b"\xff\xfe",
        ]:
            status, ctype, data = _call(port, "POST", "/chat", body, {"Content-Type": "application/json"})
            assert status == 400, (body, status, data)
            assert ctype == "application/json" and "error" in json.loads(data)
            assert r.keys("*") == [], body                                 # nothing written
        status, _, data = _call(port, "POST", "/chat", json.dumps({"session": "ok", "message": "hi"}))
        assert status == 200 and json.loads(data)["reply_id"]
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        r.close()


def test_sse_chat_example_refuses_bad_stream_requests_at_once(clean, tmp_path):
    import time

    port, proc, _ = _start_sse(clean, tmp_path, "--token-delay", "0.01", "--tokens", "3")
    try:
        status, _, data = _call(port, "POST", "/chat",
                                json.dumps({"session": "s", "message": "hi", "message_id": "m1"}))
        reply = json.loads(data)["reply_id"]
        base = f"/stream?session=s&reply={reply}"
        for path, headers in [
            (base + "&after=5%0A", {}),                                 # "5\n"
            (base + "&after=18446744073709551616", {}),                 # above 2^64-1
            (base + "&after=1-18446744073709551616", {}),
            (base, {"Last-Event-ID": "99999999999999999999"}),
            (base + "&after=%24", {}),                                  # "$"
            ("/stream?session=s&reply=a%0Ab", {}),                      # not a MSGID
            ("/stream?session=%7D&reply=r", {}),                        # session "}"
            ("/history?session=%7D", {}),
        ]:
            status, ctype, data = _call(port, "GET", path, headers=headers)
            assert status == 400, (path, status, data)
            assert ctype == "application/json" and "error" in json.loads(data)
        # A reply nobody produces: 404 at once, not a thread held for a minute.
        started = time.monotonic()
        status, _, _ = _call(port, "GET", "/stream?session=s&reply=nobody")
        assert status == 404 and time.monotonic() - started < 5
        # The known reply streams.
        status, ctype, data = _call(port, "GET", base, timeout=30)
        assert status == 200 and ctype == "text/event-stream" and b"event: end" in data
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sse_chat_example_bounds_concurrent_streams(clean, tmp_path):
    import http.client

    port, proc, _ = _start_sse(clean, tmp_path, "--token-delay", "0.5", "--tokens", "20", "--max-streams", "1")
    try:
        _, _, data = _call(port, "POST", "/chat", json.dumps({"session": "s", "message": "hi"}))
        reply = json.loads(data)["reply_id"]
        held = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        held.request("GET", f"/stream?session=s&reply={reply}")
        resp = held.getresponse()
        assert resp.status == 200 and resp.readline() == b"retry: 300\n"
        status, _, data = _call(port, "GET", f"/stream?session=s&reply={reply}")
        assert status == 503 and "too many" in json.loads(data)["error"]
        held.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sse_chat_example_logs_no_forged_lines(clean, tmp_path):
    import socket

    port, proc, logpath = _start_sse(clean, tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /x\rFORGED line\x1b[31m HTTP/1.0\r\n\r\n")
            while s.recv(65536):
                pass
        _call(port, "GET", "/stream?session=s&reply=a%0A%5Bforged%5D%20FORGED")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    log = open(logpath, "rb").read()
    assert b"\r" not in log and b"\x1b" not in log
    assert b"\\rFORGED" in log
    assert not any(line.lstrip().startswith((b"FORGED", b"[forged]")) for line in log.split(b"\n"))
