"""summarizer_worker.py against the real module: keyspace notifications,
MEM.SUMMARIZE_CHECK / MEM.SUMMARIZE, concurrent appends during a slow
summary, the OpenAI-compatible summarizer (against a local HTTP stub) and
the offline default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import summarizer_worker as sw
from redis_mem import RedisMemClient

KEY = "mem:{worker}"
PY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        monkeypatch.delenv(var, raising=False)


def start_worker(worker, **kwargs):
    out = []
    t = threading.Thread(target=lambda: out.extend(worker.run(**kwargs)), daemon=True)
    t.start()
    assert worker.ready.wait(10), "worker did not subscribe"
    return t, out


def notify_flags(r):
    return r.config_get("notify-keyspace-events")["notify-keyspace-events"]


def test_ensure_notifications_adds_d_and_E_keeping_others(r):
    assert notify_flags(r) == ""
    sw.ensure_notifications(r)
    flags = notify_flags(r)
    assert "d" in flags and "E" in flags
    r.config_set("notify-keyspace-events", "Kx")
    sw.ensure_notifications(r)
    flags = notify_flags(r)
    assert all(f in flags for f in "KxdE")
    r.config_set("notify-keyspace-events", "AK")
    sw.ensure_notifications(r)
    assert "E" in notify_flags(r) and "K" in notify_flags(r)


@pytest.mark.parametrize("protocol,decode", [(2, True), (3, False)])
def test_worker_summarizes_when_threshold_event_arrives(clean, protocol, decode):
    r = clean.client()
    mem = RedisMemClient(r)
    worker = sw.SummarizerWorker(clean.client(protocol=protocol, decode_responses=decode),
                                 summarize_fn=sw.extractive_summarize, keep=2)
    thread, done = start_worker(worker, max_events=1, timeout=30)
    flags = notify_flags(r)
    assert "d" in flags and "E" in flags
    results = [mem.append(KEY, "user" if i % 2 else "assistant",
                          f"Message {i} talks about topic {i}. More detail follows here.",
                          maxmsgs=6) for i in range(1, 7)]
    assert [x.summarize for x in results] == [False] * 5 + [True]
    thread.join(30)
    assert not thread.is_alive()
    assert len(done) == 1
    assert (done[0].key, done[0].upto, done[0].summarized, done[0].messages) == (KEY, 4, 4, 2)
    entries = mem.get(KEY)
    assert entries[0].is_summary and entries[0].id == 4
    for i in range(1, 5):
        assert f"Message {i} talks about topic {i}." in entries[0].content
    assert "Message 5" not in entries[0].content
    assert [m.id for m in entries[1:]] == [5, 6]
    assert mem.info(KEY).summary_upto == 4
    assert mem.summarize_check(KEY, keep=2).summarize is False


def test_messages_appended_during_summarization_are_kept(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    writer = RedisMemClient(clean.client())
    seen = {}

    def slow_summary(previous, messages):
        seen["ids"] = [m.id for m in messages]
        # The conversation goes on while the (slow) LLM call runs.
        writer.append(KEY, "user", "written during the summary")
        time.sleep(0.2)
        writer.append(KEY, "assistant", "also written during the summary")
        return "SUMMARY of " + ",".join(str(m.id) for m in messages)

    worker = sw.SummarizerWorker(clean.client(), summarize_fn=slow_summary, keep=2)
    thread, done = start_worker(worker, max_events=1, timeout=30)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    thread.join(30)
    assert not thread.is_alive()
    assert seen["ids"] == [1, 2, 3, 4]
    assert done and done[0].upto == 4
    entries = mem.get(KEY)
    assert (entries[0].role, entries[0].id, entries[0].content) == ("summary", 4, "SUMMARY of 1,2,3,4")
    assert [(m.id, m.content) for m in entries[1:]] == [
        (5, "m5"),
        (6, "m6"),
        (7, "written during the summary"),
        (8, "also written during the summary"),
    ]
    assert mem.info(KEY).total_tokens == sum(m.tokens for m in entries)


def test_run_once(clean):
    r = clean.client(decode_responses=False)
    mem = RedisMemClient(r)
    assert sw.run_once(KEY, client=r, keep=2) is None  # no session
    for i in range(1, 5):
        mem.append(KEY, "user", f"m{i}", maxmsgs=5)
    assert sw.run_once(KEY, client=r, keep=2) is None  # below the threshold
    mem.append(KEY, "user", "m5")
    res = sw.run_once(KEY, client=r, keep=2, summarize_fn=sw.extractive_summarize)
    assert (res.upto, res.summarized, res.messages) == (3, 3, 2)
    assert sw.run_once(KEY, client=r, keep=2) is None  # done already
    # Next round folds the previous summary in.
    for i in range(6, 9):
        mem.append(KEY, "assistant", f"m{i}")
    res = sw.run_once(KEY, client=r, keep=1, summarize_fn=sw.extractive_summarize)
    assert res.upto == 7
    summary = mem.get(KEY)[0]
    assert summary.id == 7 and "- user: m1" in summary.content and "- assistant: m7" in summary.content


def test_run_once_loses_race_without_damage(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)

    def racing(previous, messages):
        mem.summarize(KEY, 5, "the other worker's summary")  # got there first
        return "late summary"

    assert sw.SummarizerWorker(r, summarize_fn=racing, keep=2).run_once(KEY) is None
    entries = mem.get(KEY)
    assert (entries[0].id, entries[0].content) == (5, "the other worker's summary")
    assert [m.id for m in entries[1:]] == [6]


def test_run_stops_on_timeout_without_events(clean):
    worker = sw.SummarizerWorker(clean.client(), keep=2)
    start = time.monotonic()
    assert worker.run(timeout=1.0) == []
    assert time.monotonic() - start < 20


def test_extractive_summary_is_bounded_and_offline():
    msgs = [sw.Entry(i, "user", f"Sentence number {i} is here. Second sentence.", 0)
            for i in range(1, 200)]
    text = sw.extractive_summarize("Old summary.", msgs, max_chars=1000)
    assert len(text) <= 1000
    assert text.startswith("Old summary.")
    assert "- user: Sentence number 199 is here." in text
    assert "Second sentence" not in text
    assert "earlier messages omitted" in text
    assert sw.default_summarizer() is sw.extractive_summarize


class _Stub(BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.requests.append((self.path, dict(self.headers), body))
        out = json.dumps({"choices": [{"message": {"role": "assistant",
                                                   "content": "  LLM summary.  "}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def llm_stub():
    _Stub.requests = []
    httpd = HTTPServer(("127.0.0.1", 0), _Stub)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    t.join(10)


def test_openai_compatible_summarizer_from_env(clean, llm_stub, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", llm_stub)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_MODEL", "tiny-model")
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    mem.summarize(KEY, 1, "previous summary")
    mem.append(KEY, "user", "m7")
    res = sw.SummarizerWorker(r, keep=2).run_once(KEY)  # default summarizer: the endpoint
    assert res.upto == 5
    path, headers, body = _Stub.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "tiny-model"
    prompt = body["messages"][-1]["content"]
    assert "previous summary" in prompt and "user: m2" in prompt and "user: m5" in prompt
    assert "m6" not in prompt
    entries = mem.get(KEY)
    assert (entries[0].id, entries[0].content) == (5, "LLM summary.")


def test_cli_once(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    out = subprocess.run(
        [sys.executable, os.path.join(PY_ROOT, "summarizer_worker.py"), "--url", clean.url,
         "--once", KEY, "--keep", "3"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["upto"] == 3
    assert mem.get(KEY)[0].id == 3
