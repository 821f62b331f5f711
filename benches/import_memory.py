#!/usr/bin/env python3
"""What one large MEM.IMPORT costs the server: memory and main-thread time.

A measurement for docs/PERFORMANCE.md, not a test. Starts its own
redis-server with the release module, sends one document of N tiny messages
(default 1.45 M, about 40 MB) and reports:
  - RSS growth: the server's VmHWM (peak resident set) after the import less
    its VmRSS before the document was sent (the document itself, held in the
    query buffer as the command's argument, is part of it);
  - used_memory_peak growth (what Redis's allocator saw at its peak);
  - main-thread time: MEM.IMPORT's usec in INFO commandstats (for a command
    counted on the pool: the part before the hand-off plus the resumed part),
    and the longest entry of the SLOWLOG;
  - the worst PING round trip seen by another client during the import
    (informational: the machine is shared).

Usage: target/venv/bin/python benches/import_memory.py [messages] [module.so]
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_450_000
    module = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/release/libredis_mem.so")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="import-bench-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--loadmodule", module, "--slowlog-log-slower-than", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        # Tokenizer tables are built on first use: not part of the import.
        r.execute_command("MEM.APPEND", "warm", "user", "warm up")
        r.delete("warm")
        doc = json.dumps({"conversation_history": [{"role": "u", "content": "hi"}] * n},
                         separators=(",", ":"))
        time.sleep(0.5)
        rss_before = proc_status(server.pid, "VmRSS")
        used_before = int(r.info("memory")["used_memory"])
        r.config_resetstat()
        r.execute_command("SLOWLOG", "RESET")

        worst = [0.0]
        stop = threading.Event()

        def pinger():
            p = redis.Redis(port=port)
            while not stop.is_set():
                t = time.perf_counter()
                p.ping()
                worst[0] = max(worst[0], time.perf_counter() - t)
                time.sleep(0.001)

        t = threading.Thread(target=pinger)
        t.start()
        start = time.perf_counter()
        reply = r.execute_command("MEM.IMPORT", "imp", doc)
        wall = time.perf_counter() - start
        time.sleep(0.3)
        stop.set()
        t.join()
        hwm = proc_status(server.pid, "VmHWM")
        mem = r.info("memory")
        stats = r.info("commandstats").get("cmdstat_mem.import", {})
        slow = r.execute_command("SLOWLOG", "GET", "10")
        longest = max((e[2] for e in slow if b"mem.import" in (e[3][0] or b"").lower()), default=0)
        info_mem = r.info("mem")
        print(f"document: {len(doc) / 1e6:.1f} MB, {n} messages; reply {reply}")
        print(f"RSS growth (VmHWM after - VmRSS before): {(hwm - rss_before) / 2**20:.0f} MiB")
        print(f"used_memory_peak growth: {(int(mem['used_memory_peak']) - used_before) / 2**20:.0f} MiB")
        print(f"used_memory growth after: {(int(mem['used_memory']) - used_before) / 2**20:.1f} MiB")
        print(f"main thread: commandstats usec {stats.get('usec', 0)} ({stats.get('calls', 0)} call(s)); "
              f"longest SLOWLOG entry {longest} us")
        print(f"wall time {wall * 1000:.0f} ms; worst PING round trip {worst[0] * 1000:.1f} ms")
        print(f"counts_off_thread {info_mem.get('mem_counts_off_thread')}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
