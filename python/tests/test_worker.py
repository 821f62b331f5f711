"""redis-mem-summarizer (redis_mem.summarizer) against the real module: keyspace notifications,
MEM.SUMMARIZE_BEGIN leases / MEM.SUMMARIZE, concurrent appends during a slow
summary, several workers on one event (one LLM call), an LLM call that
fails or times out (nothing lost, another worker takes over), the
OpenAI-compatible summarizer (against a local HTTP stub) and the offline
default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import redis

import redis_mem.summarizer as sw
from redis_mem import RedisMemClient

KEY = "mem:{worker}"
SCRIPT = os.path.join(os.path.dirname(sys.executable), "redis-mem-summarizer")


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
    # MAXMSGS 7: the threshold is 6 (7 less mem.summarize-headroom, 20%).
    results = [mem.append(KEY, "user" if i % 2 else "assistant",
                          f"Message {i} talks about topic {i}. More detail follows here.",
                          maxmsgs=7) for i in range(1, 7)]
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
    # MAXMSGS 10: the threshold (8) comes with two appends of room, which
    # the conversation uses while the summary is made: nothing is evicted.
    for i in range(1, 9):
        mem.append(KEY, "user", f"m{i}", maxmsgs=10)
    thread.join(30)
    assert not thread.is_alive()
    assert seen["ids"] == [1, 2, 3, 4, 5, 6]
    assert done and done[0].upto == 6
    entries = mem.get(KEY)
    assert (entries[0].role, entries[0].id, entries[0].content) == ("summary", 6, "SUMMARY of 1,2,3,4,5,6")
    assert [(m.id, m.content) for m in entries[1:]] == [
        (7, "m7"),
        (8, "m8"),
        (9, "written during the summary"),
        (10, "also written during the summary"),
    ]
    assert mem.info(KEY).total_tokens == sum(m.tokens for m in entries)


def test_run_once(clean):
    r = clean.client(decode_responses=False)
    mem = RedisMemClient(r)
    assert sw.run_once(KEY, client=r, keep=2, allow_extractive=True) is None  # no session
    for i in range(1, 5):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    assert sw.run_once(KEY, client=r, keep=2, allow_extractive=True) is None  # below the threshold (5)
    mem.append(KEY, "user", "m5")
    res = sw.run_once(KEY, client=r, keep=2, summarize_fn=sw.extractive_summarize)
    assert (res.upto, res.summarized, res.messages) == (3, 3, 2)
    assert sw.run_once(KEY, client=r, keep=2, allow_extractive=True) is None  # done already
    # Next round folds the previous summary in.
    for i in range(6, 9):
        mem.append(KEY, "assistant", f"m{i}")
    res = sw.run_once(KEY, client=r, keep=1, summarize_fn=sw.extractive_summarize)
    assert res.upto == 7
    summary = mem.get(KEY)[0]
    assert summary.id == 7 and "- user: m1" in summary.content and "- assistant: m7" in summary.content


def test_a_second_worker_is_kept_out_by_the_lease(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    other = sw.SummarizerWorker(clean.client(), summarize_fn=lambda p, m: "other's", keep=2)
    calls = []

    def first(previous, messages):
        calls.append([m.id for m in messages])
        # Another worker heard the same event meanwhile: no lease for it,
        # and a summary without the lease is refused.
        assert other.run_once(KEY) is None
        with pytest.raises(redis.ResponseError, match="LEASED"):
            mem.summarize(KEY, 4, "a summary without the lease")
        return "the holder's summary"

    res = sw.SummarizerWorker(r, summarize_fn=first, keep=2).run_once(KEY)
    assert res is not None and res.upto == 4 and calls == [[1, 2, 3, 4]]
    assert other.stats["busy"] == 1 and other.stats["llm_calls"] == 0
    entries = mem.get(KEY)
    assert (entries[0].id, entries[0].content) == (4, "the holder's summary")
    assert [m.id for m in entries[1:]] == [5, 6]


def test_several_workers_make_one_llm_call_per_summary(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    calls = []
    lock = threading.Lock()

    def llm(previous, messages):
        with lock:
            calls.append([m.id for m in messages])
        time.sleep(0.3)  # every worker hears the events meanwhile
        return f"summary of {messages[0].id}..{messages[-1].id}"

    workers = [sw.SummarizerWorker(clean.client(), summarize_fn=llm, keep=2) for _ in range(3)]
    threads = [start_worker(w, timeout=4)[0] for w in workers]
    for i in range(1, 9):
        mem.append(KEY, "user", f"m{i}", maxmsgs=10)  # threshold 8: one event, heard by all
    for t in threads:
        t.join(30)
    assert calls == [[1, 2, 3, 4, 5, 6]], "one LLM call for the one summary"
    assert sum(w.stats["committed"] for w in workers) == 1
    assert sum(w.stats["refused"] for w in workers) == 0
    assert mem.get(KEY)[0].content == "summary of 1..6"


def test_a_failed_llm_call_loses_nothing_and_is_retried_after_the_lease(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    calls = []

    def flaky(previous, messages):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("503 from the LLM")
        return "second try"

    worker = sw.SummarizerWorker(clean.client(), summarize_fn=flaky, keep=2, lease_ms=400)
    thread, done = start_worker(worker, max_events=1, timeout=20)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=7)  # one event, at the 6th
    thread.join(30)
    assert not thread.is_alive()
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.35, "retried once the lease ran out"
    assert worker.stats["llm_failures"] == 1 and worker.stats["committed"] == 1
    assert done and done[0].upto == 4
    entries = mem.get(KEY)
    assert (entries[0].id, entries[0].content) == (4, "second try")
    assert [m.id for m in entries[1:]] == [5, 6]


def test_a_timed_out_llm_call_is_taken_over_by_another_worker(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    late, release = threading.Event(), threading.Event()

    def hung(previous, messages):
        release.wait(10)  # answers only after the test is done with the lease
        late.set()
        return "too late"

    # A 2 s lease: long enough that the helper's first look surely falls inside it.
    stuck = sw.SummarizerWorker(clean.client(), summarize_fn=hung, keep=2, lease_ms=2000, llm_timeout=0.2)
    assert stuck.run_once(KEY) is None
    assert stuck.stats["llm_failures"] == 1
    helper = sw.SummarizerWorker(clean.client(), summarize_fn=lambda p, m: "taken over", keep=2, lease_ms=2000)
    assert helper.run_once(KEY) is None  # the stuck worker's lease is still live
    assert helper.stats["busy"] == 1
    # Every message is still there meanwhile.
    assert [m.id for m in mem.get(KEY)] == [1, 2, 3, 4, 5, 6]
    res, end = None, time.monotonic() + 10
    while res is None and time.monotonic() < end:  # until the stuck lease expires
        time.sleep(0.1)
        res = helper.run_once(KEY)
    assert res is not None and res.upto == 4
    release.set()
    late.wait(5)
    entries = mem.get(KEY)
    assert (entries[0].id, entries[0].content) == (4, "taken over")
    assert [m.id for m in entries[1:]] == [5, 6]


def test_a_summary_of_a_deleted_conversation_never_lands_on_the_new_one(clean):
    # The key is deleted (or replaced) while the LLM summarizes it; the new
    # conversation's ids start again at 1, so the old upto names new messages.
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"old {i}", maxmsgs=6)

    def llm(previous, messages):
        r.delete(KEY)
        for i in range(1, 7):
            mem.append(KEY, "user", f"new {i}", maxmsgs=6)
        return "a summary of the old conversation"

    worker = sw.SummarizerWorker(clean.client(), summarize_fn=llm, keep=2)
    assert worker.run_once(KEY) is None
    assert worker.stats["refused"] == 1 and worker.stats["committed"] == 0
    assert [m.content for m in mem.get(KEY)] == [f"new {i}" for i in range(1, 7)]
    # Queued to be looked at again: the new conversation is due too.
    assert KEY in worker._queued


@pytest.mark.parametrize("answer", ["", "  \n ", "\u200b\ufeff\x00", "\u3000\u00a0\u2800", "\ufe0f\u0301", None, 42,
                                    {"summary": "x"}, "bad \udc80 text"])
def test_a_summarize_fn_answer_that_is_not_a_summary_is_a_failed_call(clean, answer):
    r = clean.client()
    mem = RedisMemClient(r)
    for i in range(1, 7):
        mem.append(KEY, "user", f"m{i}", maxmsgs=6)
    worker = sw.SummarizerWorker(clean.client(), summarize_fn=lambda p, m: answer, keep=2,
                                 llm_retries=0)
    assert worker.run_once(KEY) is None
    assert worker.stats["llm_failures"] == 1 and worker.stats["committed"] == 0
    assert KEY in worker._queued, "looked at again after the lease"
    assert [m.content for m in mem.get(KEY)] == [f"m{i}" for i in range(1, 7)]


def test_the_module_refuses_a_blank_summary(clean):
    mem = RedisMemClient(clean.client())
    for i in range(1, 4):
        mem.append(KEY, "user", f"m{i}")
    for blank in ["", " \t\n", "\u200b\u00ad", "\x0b\u0085\u2028", "\ufe0f\u034f\u0301"]:
        with pytest.raises(redis.ResponseError, match="summary is empty"):
            mem.summarize(KEY, 2, blank)
    assert len(mem.get(KEY)) == 3


def test_run_stops_on_timeout_without_events(clean):
    worker = sw.SummarizerWorker(clean.client(), keep=2, allow_extractive=True)
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
    assert sw.default_summarizer(allow_extractive=True) is sw.extractive_summarize


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
    # No LLM configured: it refuses to start, saying how to configure one
    # (issue 19 finding 9: no silent extractive fallback).
    refused = subprocess.run([SCRIPT, "--url", clean.url, "--once", KEY, "--keep", "3"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "no LLM configured" in refused.stderr
    assert "--extractive" in refused.stderr and "OPENAI_BASE_URL" in refused.stderr
    assert not mem.get(KEY)[0].is_summary
    out = subprocess.run(
        [SCRIPT, "--url", clean.url, "--extractive",
         "--once", KEY, "--keep", "3"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "OFFLINE EXTRACTIVE" in out.stderr
    assert json.loads(out.stdout)["upto"] == 3
    # Found by the outside tester: --once on a key that is not a session
    # ended in a WRONGTYPE traceback (exit 1); now one line, exit 2.
    r.set("not-a-session", "x")
    bad = subprocess.run([SCRIPT, "--url", clean.url, "--extractive", "--once", "not-a-session"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "not-a-session: WRONGTYPE" in bad.stderr and "Traceback" not in bad.stderr
    assert mem.get(KEY)[0].id == 3


def test_no_llm_and_no_extractive_is_a_clear_error(clean):
    with pytest.raises(sw.NoSummarizer, match="no LLM configured"):
        sw.SummarizerWorker(clean.client(), keep=2)


def test_concurrency_summarizes_due_sessions_at_once(clean):
    """Issue 19 finding 9: 5 sessions due at once, each LLM call 0.6 s."""
    r = clean.client()
    mem = RedisMemClient(r)
    running, peak, lock = [0], [0], threading.Lock()

    def slow(previous, msgs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.6)
        with lock:
            running[0] -= 1
        return f"summary of {len(msgs)}"

    worker = sw.SummarizerWorker(r, summarize_fn=slow, keep=2, concurrency=5)
    t, out = start_worker(worker, timeout=6.0)
    started = time.monotonic()
    keys = [f"mem:{{c{i}}}" for i in range(5)]
    for i in range(1, 7):
        for k in keys:
            mem.append(k, "user", f"m{i}", maxmsgs=6)
    while time.monotonic() - started < 5 and not all(mem.get(k)[0].is_summary for k in keys):
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    worker.stop()
    t.join(10)
    assert all(mem.get(k)[0].is_summary for k in keys)
    assert peak[0] >= 4, peak  # in parallel, not one after another
    assert elapsed < 5 * 0.6, elapsed


def test_the_prompt_shows_tool_calls_with_name_and_arguments(clean):
    r = clean.client()
    mem = RedisMemClient(r)
    mem.append(KEY, "user", "weather in Lisbon?")
    mem.append(KEY, "assistant", "", meta={"tool_calls": [
        {"id": "c1", "name": "get_weather", "args": {"city": "Lisbon"}}]})
    mem.append(KEY, "tool", "sunny, 24 C", meta={"tool_call_id": "c1", "name": "get_weather"})
    mem.append(KEY, "assistant", "", meta={"tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "book", "arguments": '{"seat": "12A"}'}}]})
    mem.append(KEY, "tool", "booked", meta={"tool_call_id": "c2"})
    for i in range(3):
        mem.append(KEY, "user", f"more {i}", maxmsgs=8)
    seen = []

    def capture(previous, msgs):
        from redis_mem.summarizing import transcript
        seen.append(transcript(previous, msgs))
        return "summary"

    assert sw.SummarizerWorker(r, summarize_fn=capture, keep=2).run_once(KEY) is not None
    text = seen[0]
    assert 'assistant: [called get_weather({"city": "Lisbon"})]' in text
    assert "tool get_weather returned: sunny, 24 C" in text
    assert 'assistant: [called book({"seat": "12A"})]' in text
    assert "tool c2 returned: booked" in text
