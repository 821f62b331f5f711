#!/usr/bin/env python3
"""Load simulation: agents and summarizers against redis-mem (part 7 of
`make bench`; also runs alone: `python benches/agent_sim.py --module ...`).

Many sessions driven like real agents: a user turn, an assistant tool call,
1-4 tool results arriving in a burst, the answer; a think pause between
turns, sometimes a long one. Three summarizer workers (examples/python/
summarizer_worker.py, unchanged, with a fake LLM that takes 1-3 s) listen
to `mem.threshold`. The client "times out" on a share of its appends and
sends them again. Every time is scaled by `--scale` (default 0.2: the run
is 5 times faster than real time; the figures are reported both as
measured and scaled back to real time).

Four variants run at once, each against its own redis-server (same module,
same machine, same random script of turns), so they can be compared:

  v2            headroom 20 %, workers with leases, client with MSGIDs
  headroom 0    the thresholds at the caps (the old rule), leases and MSGIDs
  no leases     headroom 20 %, workers on MEM.SUMMARIZE_CHECK (every worker
                acts on every event), no MSGIDs
  before        headroom 0, no leases, no MSGIDs (today's build before v2)

Measured per variant: messages evicted by the caps without a summary
(INFO mem messages_trimmed: a message leaves either by trim, never
summarized, or by a summary), LLM calls wasted per summary committed (calls
whose summary was refused or never sent), duplicate messages stored (a
resent append stored again), and the summarizer's latency from the append
that made a session meet its threshold to the commit of its summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import summarizer_worker as sw  # noqa: E402
from redis_mem.client import RedisMemClient  # noqa: E402

VARIANTS = [
    # name, headroom, leases, msgids
    ("v2", 20, True, True),
    ("headroom 0", 0, True, True),
    ("no leases", 20, False, False),
    ("before", 0, False, False),
]


class Server:
    def __init__(self, module, workdir):
        self.dir = tempfile.mkdtemp(prefix="redis-sim-", dir=workdir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", "redis.log", "--loadmodule", module],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 15
        while True:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server for the simulation did not start")
                time.sleep(0.05)

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, protocol=2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Tracker:
    """When each session last met its threshold with no summary since, and
    the latencies from there to the commit of a summary."""

    def __init__(self):
        self.lock = threading.Lock()
        self.since = {}
        self.latencies = []

    def threshold(self, key):
        with self.lock:
            self.since.setdefault(key, time.monotonic())

    def committed(self, key):
        with self.lock:
            t = self.since.pop(key, None)
            if t is not None:
                self.latencies.append(time.monotonic() - t)


def fake_llm(rng_seed, scale):
    """1-3 s (scaled) per call. Its text differs from call to call, as a
    real LLM's does (two workers' summaries of the same messages are two
    summaries, not a retry of one)."""
    rng = random.Random(rng_seed)
    lock = threading.Lock()

    def summarize(previous, messages):
        with lock:
            secs = rng.uniform(1.0, 3.0) * scale
            nonce = rng.getrandbits(32)
            summarize.busy_secs += secs
        time.sleep(secs)
        return (f"Summary of messages {messages[0].id}..{messages[-1].id}"
                + (" (after an earlier summary)" if previous else "") + f" [{nonce:08x}]")

    summarize.busy_secs = 0.0
    return summarize


class LeaseWorker(sw.SummarizerWorker):
    """summarizer_worker.py as shipped, noting commits for the latency."""

    def __init__(self, *a, tracker, **kw):
        super().__init__(*a, **kw)
        self.tracker = tracker

    def run_once(self, key):
        res = super().run_once(key)
        if res is not None:
            self.tracker.committed(key)
        return res


class CheckWorker(LeaseWorker):
    """The worker before leases: MEM.SUMMARIZE_CHECK, the LLM call, then
    MEM.SUMMARIZE; every worker acts on every event."""

    def run_once(self, key):
        check = self.mem.summarize_check(key, keep=self.keep)
        if not check.summarize or check.upto == 0:
            return None
        previous, todo = None, []
        for e in self.mem.get(key):
            if e.is_summary:
                previous = e.content
            elif e.id <= check.upto:
                todo.append(sw.Entry(e.id, e.role, e.content, e.ts))
        if not todo:
            return None
        self.stats["llm_calls"] += 1
        text = self.summarize_fn(previous, todo)
        try:
            result = self.mem.summarize(key, check.upto, text)
        except redis.ResponseError:
            self.stats["refused"] += 1
            return None
        self.stats["committed"] += 1
        self.tracker.committed(key)
        return sw.SummaryDone(key, check.upto, len(todo), result.messages, result.total_tokens)


def script(seed, turns):
    """The turns of one session, the same in every variant: (think pause,
    model time, tool times, content sizes) in real seconds."""
    rng = random.Random(seed)
    out = []
    for _ in range(turns):
        long_pause = rng.random() < 0.15
        out.append({
            "think": rng.uniform(8.0, 14.0) if long_pause else rng.uniform(2.0, 6.0),
            "model": [rng.uniform(0.3, 0.8), rng.uniform(0.3, 0.8)],
            "tools": [rng.uniform(0.02, 0.15) for _ in range(rng.randint(1, 4))],
            "retry": [rng.random() for _ in range(8)],
        })
    return out


class Counts:
    """Counters shared by the agent threads of one variant."""

    def __init__(self):
        self.lock = threading.Lock()
        self.n = {"appends": 0, "resent": 0, "stored_twice": 0}

    def bump(self, name):
        with self.lock:
            self.n[name] += 1


class Agent:
    def __init__(self, server, key, turns, scale, msgids, retry_share, tracker, counts):
        self.mem = RedisMemClient(server.client(), auto_msgid=msgids)
        self.key, self.turns, self.scale = key, turns, scale
        self.msgids, self.retry_share = msgids, retry_share
        self.tracker, self.counts = tracker, counts

    def append(self, role, content, retry_draw, meta=None):
        msgid = uuid.uuid4().hex if self.msgids else None
        r = self.mem.append(self.key, role, content, meta=meta, msgid=msgid)
        self.counts.bump("appends")
        if r.summarize:
            self.tracker.threshold(self.key)
        if retry_draw < self.retry_share:
            # The reply "timed out": the client sends the same command again.
            again = self.mem.append(self.key, role, content, meta=meta, msgid=msgid)
            self.counts.bump("resent")
            if not again.duplicate:
                self.counts.bump("stored_twice")

    def run(self):
        s = self.scale
        for n, turn in enumerate(self.turns):
            time.sleep(turn["think"] * s)
            draws = iter(turn["retry"])
            self.append("user", f"Turn {n}: please look up the flights and the hotel prices.", next(draws))
            time.sleep(turn["model"][0] * s)
            calls = [{"id": f"call_{n}_{i}", "name": "search"} for i in range(len(turn["tools"]))]
            self.append("assistant", "", next(draws), meta={"tool_calls": calls})
            for i, t in enumerate(turn["tools"]):
                time.sleep(t * s)
                self.append("tool", f'{{"result": "option {i} for turn {n}", "price": {100 + i}}}', next(draws),
                            meta={"tool_call_id": f"call_{n}_{i}"})
            time.sleep(turn["model"][1] * s)
            self.append("assistant", f"Here is what I found for turn {n}: three flights and two hotels.", next(draws))


def run_variant(name, headroom, leases, msgids, a, sessions, results):
    server = Server(a.module, a.workdir)
    try:
        r = server.client()
        r.config_set("mem.summarize-headroom", headroom)
        tracker = Tracker()
        counts = Counts()
        workers = []
        llms = [fake_llm(1000 + w, a.scale) for w in range(a.workers)]
        for w in range(a.workers):
            cls = LeaseWorker if leases else CheckWorker
            workers.append(cls(server.client(), summarize_fn=llms[w], keep=10,
                               lease_ms=int(max(2.0, 10 * a.scale) * 1000), tracker=tracker))
        threads = [threading.Thread(target=w.run, kwargs={"timeout": 3600}, daemon=True) for w in workers]
        for t in threads:
            t.start()
        for w in workers:
            w.ready.wait(10)
        agents = [Agent(server, f"mem:{{agent{i}}}", script(i, a.turns), a.scale, msgids, a.retry_share, tracker, counts)
                  for i in range(sessions)]
        start = time.monotonic()
        agent_threads = [threading.Thread(target=ag.run, daemon=True) for ag in agents]
        for t in agent_threads:
            t.start()
        for t in agent_threads:
            t.join()
        agents_secs = time.monotonic() - start
        # Let the workers finish what they started (and what was pending).
        time.sleep(3.0 * a.scale + 0.5)
        for w in workers:
            w.stop()
        for t in threads:
            t.join(30)
        info = r.info("mem")
        lat = sorted(tracker.latencies)
        stats = {k: sum(w.stats[k] for w in workers) for k in workers[0].stats}
        committed = stats["committed"]
        results[name] = {
            "headroom": headroom, "leases": leases, "msgids": msgids,
            "appends": counts.n["appends"], "resent": counts.n["resent"],
            "stored_twice": counts.n["stored_twice"],
            "evicted_unsummarized": int(info.get("mem_messages_trimmed", 0)),
            "summaries": committed, "llm_calls": stats["llm_calls"],
            "wasted_llm_calls": stats["llm_calls"] - committed,
            "wasted_per_summary": (stats["llm_calls"] - committed) / committed if committed else float("nan"),
            "refused": stats["refused"],
            "latency_p50": statistics.median(lat) if lat else float("nan"),
            "latency_p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
            "latency_n": len(lat),
            "never_summarized": len(tracker.since),
            "agents_secs": agents_secs,
            # Share of the workers' time spent in LLM calls while the agents ran.
            "busy": sum(f.busy_secs for f in llms) / (a.workers * agents_secs),
        }
    finally:
        server.stop()


def simulate(a, sessions):
    """The four variants at once, `sessions` agents each: (results by
    variant, errors, seconds)."""
    results = {}
    errors = []

    def guarded(*args):
        try:
            run_variant(*args, a, sessions, results)
        except Exception as e:  # reported, the other variants go on
            errors.append(f"{args[0]}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=guarded, args=v) for v in VARIANTS]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results, errors, time.monotonic() - t


def run_loads(a):
    """Every load of `a.sessions` ("24,12"), one after the other."""
    runs = []
    for sessions in (int(x) for x in str(a.sessions).split(",") if x.strip()):
        results, errors, elapsed = simulate(a, sessions)
        runs.append((sessions, results, errors, elapsed))
    return runs


def fmt(x, digits=2):
    if isinstance(x, float):
        return "n/a" if x != x else f"{x:.{digits}f}"
    return f"{x:,}"


def table(results, a):
    """The markdown table of the variants, in VARIANTS order."""
    s = a.scale
    rows = [
        ("messages appended (resent ones not counted)", lambda r: fmt(r["appends"])),
        ("appends resent by the client (a reply 'timed out')", lambda r: fmt(r["resent"])),
        ("**duplicate messages stored** (goal 0)", lambda r: fmt(r["stored_twice"])),
        ("**messages evicted by the caps without a summary** (goal 0)", lambda r: fmt(r["evicted_unsummarized"])),
        ("summaries committed", lambda r: fmt(r["summaries"])),
        ("workers' time in LLM calls", lambda r: f"{r['busy']:.0%}"),
        ("LLM calls", lambda r: fmt(r["llm_calls"])),
        ("**wasted LLM calls per summary** (goal 0)", lambda r: fmt(r["wasted_per_summary"])),
        ("summaries refused (stale, lease)", lambda r: fmt(r["refused"])),
        (f"latency threshold -> commit p50, s (measured; real = / {s})",
         lambda r: f"{fmt(r['latency_p50'])} ({fmt(r['latency_p50'] / s, 1)} real)"),
        ("latency threshold -> commit p99, s (measured; real)",
         lambda r: f"{fmt(r['latency_p99'])} ({fmt(r['latency_p99'] / s, 1)} real)"),
        ("sessions over their threshold at the end, unsummarized", lambda r: fmt(r["never_summarized"])),
    ]
    names = [v[0] for v in VARIANTS if v[0] in results]
    head = "| | " + " | ".join(
        f"{n} (headroom {results[n]['headroom']}%, {'leases' if results[n]['leases'] else 'no leases'}, "
        f"{'MSGIDs' if results[n]['msgids'] else 'no MSGIDs'})" for n in names) + " |"
    lines = [head, "|---" * (len(names) + 1) + "|"]
    for label, f in rows:
        lines.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    return "\n".join(lines)


def section(runs, a):
    """The PERFORMANCE.md section of the simulation; `runs`: (sessions,
    results, errors, seconds) per load."""
    s = a.scale
    total = sum(r[3] for r in runs)
    out = [f"""## Load simulation: agents and summarizers (part 7)

Sessions driven like agents, {a.turns} turns each: a user message, an assistant tool call,
1-4 tool results (a burst: 0.02-0.15 s apart), the answer (0.3-0.8 s of "model" before
each assistant message), then a think pause of 2-6 s (15% of the time a long one, 8-14
s). {a.workers} summarizer workers (`examples/python/summarizer_worker.py`) on `mem.threshold`,
KEEP 10, whose fake LLM takes 1-3 s (its text differs from call to call, as a real
LLM's). The client sends {a.retry_share:.0%} of its appends twice (the first reply "timed out").
Default caps (30 messages, 80,000 tokens, gpt-4o). **Every time is scaled by {s}** (the
run is {1 / s:.0f}x faster than real time; latencies are given as measured and scaled back),
so the load on the summarizers relative to their speed is the real one. At each load the
four variants ran at the same time, each on its own redis-server, with the same script
of turns; {total:.0f} s in all.
"""]
    for sessions, results, errors, elapsed in runs:
        v2 = results.get("v2")
        load = f"the v2 workers in LLM calls {v2['busy']:.0%} of the time" if v2 else "v2 failed"
        out.append(f"### {sessions} sessions ({load}; {elapsed:.0f} s)\n")
        out.append(table(results, a))
        out.append("")
        if errors:
            out.append("Failed variants: " + "; ".join(errors))
            out.append("")
    out.append("""Evicted without a summary: `INFO mem` `messages_trimmed` (a message leaves a session
either by a cap's trim, never summarized, or by a summary). Wasted LLM calls: calls
whose summary was refused or never sent, over the summaries committed. Duplicates: a
resent append whose reply was not `duplicate 1`. Latency: from the append that made a
session meet its threshold (the first since its last summary) to the commit of its next
summary. "no leases" and "before" run the worker as it was before leases
(MEM.SUMMARIZE_CHECK then MEM.SUMMARIZE: every worker that hears an event summarizes)
and send no MSGID.

Where v2 still evicts (the busier load), it is in bursts: a turn brings up to 7
messages, more than the 6 of headroom at the default 30-message cap, while all 3
workers are in LLM calls. A larger headroom does not cure that at this load: each
summary then covers fewer messages, so the workers need more calls and fall further
behind; one more worker does (a trial run of this script with 4 workers at 24
sessions evicted none).""")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description="redis-mem agent/summarizer load simulation")
    ap.add_argument("--module", default=os.path.join(ROOT, "target/release/libredis_mem.so"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "target/bench"))
    ap.add_argument("--sessions", default="24,12", help="loads to run, comma-separated")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--retry-share", type=float, default=0.1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    runs = run_loads(a)
    if a.json:
        print(json.dumps({n: r for n, r, _, _ in runs}, indent=1))
    print(section(runs, a))


if __name__ == "__main__":
    main()
