#!/usr/bin/env python3
"""Main-thread holds of MEM.* commands under a hostile set (`make holds`).

Redis serves every client from one thread; a module command holds all of
them for as long as it runs there. Redis's SLOWLOG records exactly that time
for every command (for a command counted on the worker pool: the call that
blocked the client plus the reply after the worker, not the count itself).
This starts its own redis-server with the module and `slowlog-log-slower-than
0`, runs each hostile case, and reports per case: the longest SLOWLOG entry
of a MEM.* command, PING round trips from another client meanwhile (p99 and
max), and for the burst the server's threads and used_memory.

The cases are the stall findings of the "never stall the server" issue at
4x their sizes, within limits raised by CONFIG SET where a case needs it.
Figures only, no verdict: the machine is shared, run it when it is quiet.

  python3 benches/holds.py --module target/release/libredis_mem.so [--out docs/holds.md] [--scale 4]
          [--only "name part"]
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Server, log  # noqa: E402

import redis  # noqa: E402


def words(n_bytes, seed=0):
    vocab = ["memory", "Redis", "token", "session", "summary", "42", "über", "日本語", "\n"]
    out, size, i = [], 0, seed
    while size < n_bytes:
        w = vocab[i % len(vocab)] + " "
        out.append(w)
        size += len(w.encode())
        i = (i * 31 + 7) % 1000003
    return "".join(out)


class Pinger:
    """PING round trips from their own connection, while a case runs."""

    def __init__(self, port):
        self.port, self.rtts, self.stop = port, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=120)
        while not self.stop.is_set():
            t = time.perf_counter()
            r.ping()
            self.rtts.append((time.perf_counter() - t) * 1000)
            time.sleep(0.001)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def summary(self):
        xs = sorted(self.rtts) or [0.0]
        p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
        return {"pings": len(xs), "ping_p99_ms": round(p99, 2), "ping_max_ms": round(xs[-1], 2)}


def longest_hold(r):
    """Longest SLOWLOG entry of a MEM.* command (or of UNLINK/DEL of a
    session, which frees it) since the last reset (ms)."""
    worst, name = 0, ""
    for e in r.slowlog_get(4096):
        cmd = e["command"].decode(errors="replace") if isinstance(e["command"], bytes) else str(e["command"])
        if cmd.upper().startswith(("MEM.", "UNLINK", "DEL ")):
            if e["duration"] > worst:
                worst, name = e["duration"], cmd.split(" ")[0]
    return round(worst / 1000, 2), name


def threads_of(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def run_case(srv, name, setup, action):
    r = srv.client(timeout=300)
    r.flushall()
    r.slowlog_reset()
    r.config_set("mem.max-message-bytes", 64 * 1024 * 1024)
    r.config_set("mem.max-tokens-limit", 1_000_000_000)
    r.config_set("mem.max-messages-limit", 10_000_000)
    if setup:
        setup(r)
    r.slowlog_reset()
    with Pinger(srv.port) as p:
        time.sleep(0.2)
        t = time.perf_counter()
        extra = action(r) or {}
        wall = time.perf_counter() - t
        time.sleep(0.2)
    hold, cmd = longest_hold(r)
    row = {"case": name, "longest_hold_ms": hold, "command": cmd, "wall_s": round(wall, 2)}
    row.update(p.summary())
    row.update(extra)
    log(json.dumps(row, ensure_ascii=False))
    return row


def cases(scale):
    big = words(1024 * 1024)  # 1 MB message

    def model_switch_setup(r):
        for _ in range(20 * scale):
            r.execute_command("MEM.APPEND", "s", "user", big, "MAXTOKENS", 1_000_000_000, "MAXMSGS", 100_000)

    def model_switch(r):
        r.execute_command("MEM.APPEND", "s", "user", "hi", "MODEL", "gpt-4")

    def import_big(r):
        items = [{"role": "user", "content": big} for _ in range(5 * scale)]
        r.execute_command("MEM.IMPORT", "i", json.dumps({"conversation_history": items}))

    def import_tiny(r):
        n = 362_500 * scale  # 1.45 M tiny messages at scale 4 (40 MB of JSON at scale 1 was the finding's 1.45 M)
        doc = '{"conversation_history":[' + ",".join(['{"role":"user","content":"hi"}'] * n) + "]}"
        before = r.info("memory")["used_memory"]
        r.execute_command("MEM.IMPORT", "t", doc)
        after = r.info("memory")["used_memory"]
        return {"doc_mb": round(len(doc) / 1e6, 1), "used_memory_growth_mb": round((after - before) / 1e6, 1)}

    def summary_setup(r):
        for i in range(3):
            r.execute_command("MEM.APPEND", "m", "user", f"turn {i}", "MAXTOKENS", 1_000_000_000)

    def summarize_big(r):
        r.execute_command("MEM.SUMMARIZE", "m", 1, words(2 * 1024 * 1024 * scale))

    def multi_big(r):
        pipe = r.pipeline(transaction=True)
        for _ in range(4):
            pipe.execute_command("MEM.APPEND", "x", "user", words(4 * 1024 * 1024))
        res = pipe.execute(raise_on_error=False)
        return {"refused_in_exec": sum(1 for x in res if isinstance(x, Exception))}

    def burst(r, clients=300, size=400 * 1024 * scale):
        pid = r.info("server")["process_id"]
        content = words(size)
        base_threads = threads_of(pid)
        peak = {"threads": base_threads}
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak["threads"] = max(peak["threads"], threads_of(pid))
                time.sleep(0.01)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        before = r.info("memory")["used_memory"]

        def one(i):
            c = redis.Redis(host="127.0.0.1", port=r.connection_pool.connection_kwargs["port"], socket_timeout=300)
            c.execute_command("MEM.APPEND", f"b{i}", "user", content)
            c.close()

        ts = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        stop.set()
        w.join()
        r.flushall(asynchronous=True)
        time.sleep(0.5)
        after = r.info("memory")["used_memory"]
        return {"clients": clients, "content_kb": size // 1024, "threads_before": base_threads,
                "threads_peak": peak["threads"], "used_memory_after_flush_mb": round((after - before) / 1e6, 2)}

    def unlink_setup(r):
        n = 250_000 * scale
        doc = '{"conversation_history":[' + ",".join(['{"role":"user","content":"m"}'] * n) + "]}"
        r.config_set("mem.max-messages", n)
        r.execute_command("MEM.IMPORT", "u", doc)
        r.config_set("mem.max-messages", 30)

    def unlink(r):
        r.unlink("u")
        return {"messages": 250_000 * scale}

    def attrs_setup(r):
        value = '"' + "x" * (1024 * 1024) + '"'
        for i in range(10 * scale):
            r.execute_command("MEM.ATTRSET", "a", f"n{i}", value)

    def attrs_edit(r):
        for _ in range(3):
            r.execute_command("MEM.ATTRSET", "a", "small", 1)
        r.execute_command("MEM.ATTRGET", "a", "small")
        r.execute_command("MEM.ATTRDEL", "a", "small")

    def grow(r, piece=64 * 1024):
        # Counting given (TOKENS): what is left is the session's own growth.
        content = words(piece)
        n = 20 * scale * 1024 * 1024 // piece
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.execute_command("MEM.APPEND", "g", "user", content, "TOKENS", 1000,
                                 "MAXTOKENS", 1_000_000_000, "MAXMSGS", 10_000_000)
            if i % 64 == 63:
                pipe.execute()
        pipe.execute()
        return {"appends": n, "session_mb": round(r.memory_usage("g", samples=0) / 1e6, 1)}

    def largest_message(r):
        # At the default mem.max-message-bytes (4 MB): content and META each
        # at the limit, counted (the worker counts and lays the message out).
        meta = json.dumps({"blob": words(4 * 1024 * 1024 - 64, 1)})
        for i in range(3):
            r.execute_command("MEM.APPEND", f"l{i}", "assistant", words(4 * 1024 * 1024 - 64, 2), "META", meta)
        return {"content_mb": 4, "meta_mb": 4}

    def largest_attribute(r):
        value = json.dumps(words(4 * 1024 * 1024 - 64, 3))
        for i in range(3):
            r.execute_command("MEM.ATTRSET", "v", f"n{i}", value)

    def punctuation_runs(r):
        # One piece a text, just under each encoding's inline cap (counted on
        # the main thread): runs of one punctuation character, bpe's
        # backtracking encoder's slowest shape (hostile pass 46: 12.7-36 ms).
        for model, n in (("gpt-4o", 16 * 1024 - 1), ("gpt-4", 32 * 1024 - 1)):
            for c in "-=*/#":
                r.execute_command("MEM.COUNT", model, c * n)
                r.execute_command("MEM.APPEND", f"p{c}", "user", c * n, "MODEL", model)
                pipe = r.pipeline(transaction=True)
                pipe.execute_command("MEM.APPEND", f"q{c}", "user", c * n, "MODEL", model)
                pipe.execute()
        return {"texts": 30}

    return [
        ("runs of one punctuation character at the inline caps (COUNT, APPEND, MULTI)", None, punctuation_runs),
        ("MEM.APPEND of 4 MB content with a 4 MB META (x3)", None, largest_message),
        ("MEM.ATTRSET of a 4 MB value (x3)", None, largest_attribute),
        (f"appends growing a session to {20 * scale} MB (64 KB each, TOKENS given)", None, grow),
        (f"model switch of {20 * scale} x 1 MB", model_switch_setup, model_switch),
        (f"small ATTRSET/ATTRGET/ATTRDEL beside {10 * scale} x 1 MB attributes", attrs_setup, attrs_edit),
        (f"MEM.IMPORT of {5 * scale} x 1 MB", None, import_big),
        (f"MEM.IMPORT of {362_500 * scale} tiny messages", None, import_tiny),
        (f"MEM.SUMMARIZE of a {2 * scale} MB summary", summary_setup, summarize_big),
        ("4 x 4 MB appends in MULTI/EXEC", None, multi_big),
        (f"300 clients x {400 * scale} KB appends at once", None, burst),
        (f"UNLINK of a {250_000 * scale}-message session", unlink_setup, unlink),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--workdir", default="target/bench")
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", default=None, help="the REDIS_MEM_HOLDS file of a test-suite run")
    ap.add_argument("--only", default=None, help="run only the cases whose name contains this")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    srv = Server(os.path.abspath(a.module), os.path.abspath(a.workdir))
    srv.start()
    try:
        srv.client().config_set("slowlog-log-slower-than", 0)
        srv.client().config_set("slowlog-max-len", 4096)
        rows = []
        for name, setup, action in cases(a.scale):
            if a.only and a.only not in name:
                continue
            srv.ensure()
            srv.client().config_set("slowlog-log-slower-than", 0)
            rows.append(run_case(srv, name, setup, action))
    finally:
        srv.stop()
    lines = ["| case | longest MEM.* hold (ms) | command | PING p99 / max (ms) | other |", "|---|---|---|---|---|"]
    for row in rows:
        other = {k: v for k, v in row.items() if k not in ("case", "longest_hold_ms", "command", "ping_p99_ms", "ping_max_ms", "pings")}
        lines.append(f"| {row['case']} | {row['longest_hold_ms']} | {row['command']} | {row['ping_p99_ms']} / {row['ping_max_ms']} | "
                     + ", ".join(f"{k} {v}" for k, v in other.items()) + " |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        write_section(a.out, table, a.scale, a.suite)


def write_section(path, table, scale, suite_file):
    """Puts the figures into `path` (docs/PERFORMANCE.md) as a kept section
    (benches/bench.py carries it over when it rewrites the document)."""
    import re
    suite = ""
    if suite_file and os.path.exists(suite_file):
        rows = []
        for line in open(suite_file):
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit():
                rows.append((int(parts[0]), parts[1], parts[2].strip()))
        rows.sort(reverse=True)
        suite = (f"Whole test suite (`REDIS_MEM_HOLDS`, every test server's SLOWLOG, entries of 1 ms or more): "
                 f"{len(rows)} MEM.* commands held the main thread 1 ms or more; the longest:\n\n"
                 "| ms | command | test |\n|---|---|---|\n"
                 + "".join(f"| {us / 1000:.2f} | {cmd} | {test} |\n" for us, cmd, test in rows[:10]))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    block = (f"<!-- kept: holds -->\n## Main-thread holds (`make holds`, {when}, load {load})\n\n"
             f"The longest time a MEM.* command held Redis's main thread (its SLOWLOG duration), "
             f"with PING round trips from another client meanwhile. Hostile set at {scale}x the sizes "
             f"of the stall findings (`benches/holds.py`):\n\n{table}\n\n"
             "The holds are the module's: the command's own call plus the reply after the worker. "
             "PING's max also holds what Redis itself does on the main thread for these cases: reading "
             "a 45 MB argument from the socket, or 16 MB of appends queued for one EXEC, before any "
             "module code runs.\n\n"
             f"{suite}<!-- /kept: holds -->")
    try:
        doc = open(path).read()
    except OSError:
        doc = ""
    pattern = re.compile(r"<!-- kept: holds -->.*?<!-- /kept: holds -->", re.S)
    doc = pattern.sub(block, doc) if pattern.search(doc) else doc.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    main()
