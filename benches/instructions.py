#!/usr/bin/env python3
"""Instructions and cache misses a command costs in the server, counted, not timed.

    make instructions [INSTRUCTIONS_ARGS="--against other.so --messages 2000"]
    benches/instructions.py --module target/release/libredis_mem.so [--against old.so]

Times on this shared two-vCPU machine move 10-30% from hour to hour (the same
module's cold MEM.COUNT measured 6.7 to 10.3 us a call within a day), more than
most changes to counting are worth. Valgrind's cachegrind counts what a change
does instead: each server runs under it twice, once with the warm-up alone and
once with N commands more, and the difference over N is a command's own cost.
The commands are part 8's (bench.py): MEM.COUNT gpt-4o <600 B> ROLE user over
the same distinct messages, cold (a fresh server: tables built, no piece seen);
MEM.APPEND ... TOKENS 150 (the append without counting) and XADD MAXLEN 30 of the
same bytes, each into 200 keys filled to 30 entries first. Misses are cachegrind's model:
a 48 KB first-level data cache and, as "L2", a 2 MB last level (this machine's
L2 a core; its L3 is not modelled). Counts are exact from run to run; what they
leave out is what time the machine's other work takes, and how well misses
overlap.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from bench import resp, send_raw  # noqa: E402

import redis  # noqa: E402

L2 = "--LL=2097152,16,64"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(module, commands, out, workdir):
    """One server under cachegrind: the warm-up, then each list of `commands`,
    then exit."""
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=cachegrind", "--cache-sim=yes", L2,
         f"--cachegrind-out-file={out}", "redis-server", "--port", str(port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
         "--loadmodule", module],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=600)
    for _ in range(1200):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            if server.poll() is not None:
                raise RuntimeError("redis-server under valgrind exited")
            time.sleep(0.1)
    r.execute_command("MEM.COUNT", "gpt-4o", "tables built")
    for some in commands:
        send_raw(port, some)
    try:
        r.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    server.wait(timeout=600)


def load(path):
    """Cachegrind's totals by function: {function: {event: count}}."""
    events, by_fn, fn = [], defaultdict(lambda: defaultdict(int)), None
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif fn and line[:1].isdigit():
                for event, value in zip(events, line.split()[1:]):
                    by_fn[fn][event] += int(value)
    return by_fn


def per_command(module, commands, workdir, setup=()):
    """A command's instructions and misses, and its costliest functions
    (`setup` runs in both servers: what is measured is `commands` alone)."""
    files = [os.path.join(workdir, f"cg.{n}.out") for n in (0, 1)]
    run(module, [c for c in [setup] if c], files[0], workdir)
    run(module, [c for c in [setup, commands] if c], files[1], workdir)
    base, more = load(files[0]), load(files[1])
    n = len(commands)
    cost = defaultdict(lambda: defaultdict(float))
    for fn, events in more.items():
        for event, value in events.items():
            cost[fn][event] = (value - base.get(fn, {}).get(event, 0)) / n
    total = defaultdict(float)
    for events in cost.values():
        for event, value in events.items():
            total[event] += value
    return total, cost


def misses(events, level):
    return events.get(f"{level}mr", 0) + events.get(f"{level}mw", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default="target/release/libredis_mem.so")
    ap.add_argument("--against", help="a second build of the module, side by side")
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--functions", type=int, default=8, help="costliest functions shown")
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind is missing: `make instructions` installs it (apt-get install valgrind)")
    all_texts = corpus.messages(12000, 600)
    fill, texts = all_texts[:6000], all_texts[6000:6000 + a.messages]
    count = [["MEM.COUNT", "gpt-4o", m, "ROLE", "user"] for m in texts]

    # Part 8's sessions and streams: 200 of each, filled to their caps (30)
    # first, so that every measured call trims.
    def xadd(items):
        return [["XADD", f"xs:{i % 200}", "MAXLEN", "30", "*", "content", m]
                for i, m in enumerate(items)]

    def append(items):
        return [["MEM.APPEND", f"mem:{i % 200}", "user", m, "TOKENS", "150"]
                for i, m in enumerate(items)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="redis-mem-instructions-") as workdir:
        def measure(name, module, commands, setup=()):
            total, cost = per_command(os.path.abspath(module), commands, workdir, setup)
            rows.append((name, total))
            print(f"\n{name}: {module}")
            top = sorted(cost.items(), key=lambda kv: -kv[1]["Ir"])[:a.functions]
            for fn, events in top:
                print(f"  {events['Ir']:9.0f} instructions  {misses(events, 'D1'):6.0f} D1 "
                      f"{misses(events, 'DL'):5.1f} L2 misses  {fn[:80]}")
            worst = max(cost.items(), key=lambda kv: misses(kv[1], "DL"))
            print(f"  most L2 misses: {misses(worst[1], 'DL'):.1f} in {worst[0][:80]}")

        modules = [a.module] + ([a.against] if a.against else [])
        for module in modules:
            measure(f"MEM.COUNT cold, {os.path.basename(module)}", module, count)
        for name, build in [("MEM.APPEND TOKENS 150 (no counting), at the caps", append),
                            ("XADD MAXLEN 30, same bytes, at the caps", xadd)]:
            measure(name, a.module, build(texts), build(fill))
    print(f"\n{a.messages} distinct 600 B messages (benches/corpus.py), per command:")
    print("| command | instructions | D1 misses | L2 (2 MB) misses |")
    print("|---|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t['Ir']:,.0f} | {misses(t, 'D1'):,.0f} | {misses(t, 'DL'):,.1f} |")


if __name__ == "__main__":
    main()
