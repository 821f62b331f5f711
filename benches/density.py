#!/usr/bin/env python3
"""Many sessions and per-command cost by session size (issue 12's measurement).

Part "memory": for each message size (200 B, 600 B) and each store, a fresh
redis-server (temp dir, `--save '' --appendonly no`, loopback) is filled with
100,000 sessions of 30 messages and measured: used_memory growth per session,
MEMORY USAGE of one key against that growth, RDB bytes, SAVE time and DEBUG
RELOAD time (min / median / max over --runs runs, interleaved across the
stores' servers, which stay up together for one size). The stores hold the same
bytes (30 varied English-like messages, alternating user/assistant):
  mem   a redis-mem session built by MEM.APPEND (TS given)
  list  a Redis list of the contents (RPUSH, one per message)
  json  the client-side `user_memory_*` string the seed stored
        ({"conversation_history":[{"role","content","timestamp"}...],
          "user_profile":{},"context":{}}, Python json.dumps)
Built fast: one session is built by writes, DUMPed, and RESTOREd under N keys
(raw pipelined RESP), all with the same 24 h expiry (the module's default TTL,
the seed's SET EX 86400). A sample of --sample sessions built by the writes
themselves (MEM.APPEND / RPUSH + PEXPIRE / SET EX) checks that RESTORE does not
flatter a store (a representation grown by appends may carry slack).

Part "commands": one session each of 30 / 1,000 / 10,000 messages of 600 B
(caps raised to the size, so every measured MEM.APPEND trims one), server CPU
per call from INFO commandstats (usec_per_call, best of --reps batches) of
MEM.APPEND of 600 B and of 16 B (counting ~0: the structure's own cost),
MEM.GET LAST 10, MEM.GET BUDGET 2000, MEM.GET, MEM.SUMMARIZE_CHECK, MEM.INFO,
with XADD MAXLEN n of the same bytes as a reference.

  python3 benches/density.py [--memory-only | --commands-only] [--sizes 200,600]
          [--sessions 100000] [--runs 3] [--out docs/PERFORMANCE.md]

Without --out nothing is written (the lead's quick loop:
`--memory-only --sizes 200 --sessions 20000 --runs 1`, about 30 s).
"""

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ROOT, Server, as_map, cmdstats, iso, log, machine  # noqa: E402
from density_report import STORES, command_table, fmt_runs, goals, memory_tables, render_doc, write_section  # noqa: E402

import redis  # noqa: E402

HISTORY = 30
TTL_MS = 86_400_000
T0 = 1_764_547_200_000  # 2025-12-01T00:00:00Z, message i at T0 + i s

WORDS = ("the of and to in is that it for as with was on be by this are from at or an have not but they "
         "which you one all were we their there been has more if when will can would no so what about out up "
         "into some time them other than then its only like also new could these two may first any very after "
         "our most over such even how where just those because people through back much good well should work "
         "each same while before here know make between still being life world never down own long again see "
         "memory session context summary assistant question answer database latency request response server "
         "client cache connection timeout retry budget token model message history travel weather schedule "
         "meeting invoice customer order payment shipping refund password account project deadline report "
         "Paris London Tuesday March yesterday tomorrow quickly carefully probably exactly twenty hundred "
         "thanks please sorry great sure maybe around always another answer area available away based become "
         "begin behind believe better big black body book both bring build business call car case cause certain "
         "change child city close come company consider continue control cost country course create current "
         "day decide design detail develop different difficult direction doctor door during early easy economic "
         "effect either else end enough enter especially evening event every example experience explain face "
         "fact family far feel field figure fill final find fine fire follow food force form forward free friend "
         "full future game general give goal government group grow half hand happen hard head health hear heart "
         "help high hold home hope hospital hotel hour house however idea important include increase industry "
         "information instead interest issue job keep kind large last late later lead learn least leave left "
         "less letter level light likely line list listen little live local look lose lot love low main major "
         "manage many market matter mean measure medical member method middle might mind minute miss modern "
         "moment money month morning move music must name national nature near need network next night north "
         "note nothing notice number office often oil old once open option original others outside page paper "
         "part particular party pass past pay perhaps period person phone picture piece place plan player point "
         "policy political position possible power practice prepare present pressure pretty price private "
         "problem process produce product program provide public pull purpose put quality quite radio range "
         "rate rather reach read ready real reason receive recent recognize record reduce region remain remember "
         "remove repeat require research resource rest result return reveal right rise risk road rock role room "
         "rule run safe save scene school science season seat second section security seem sell send sense "
         "series serious service set several share short show side sign similar simple since single sister "
         "sit site situation size skill small social society someone something sometimes soon sort sound source "
         "south space speak special specific spend staff stage stand standard start state station stay step "
         "stock stop store story strategy street strong student study style subject success suddenly suggest "
         "support system table take talk task teacher team technology tell term test thing think though thought "
         "three throughout today together total tough toward town trade training treat tree trial trip true try "
         "turn type under understand unit until upon usually value various version view visit voice wait walk "
         "wall want watch water way week weight west whatever whether white whole whose why wide wife window "
         "wish within without woman wonder word worker write wrong year young").split()

# Zipf-like frequencies (the first words are the common ones), so that LZF finds
# about as much to compress as in real prose: RDB (LZF) keeps ~66% of 6 KB of
# this text and ~88% of 600 B; of 6 KB of the repo's docs 61-64%, of
# benches/message_600.txt 86%.
ZIPF = [1.0 / (rank + 4) for rank in range(len(WORDS))]


def text(n_bytes, seed):
    """Deterministic English-like ASCII prose of exactly n_bytes (sentences of
    varied words, so LZF and the tokenizer see text, not one repeated string)."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_bytes:
        words = rng.choices(WORDS, weights=ZIPF, k=rng.randint(5, 16))
        s = " ".join(words).capitalize() + rng.choice([". ", ". ", ", ", "? ", "! "])
        if rng.random() < 0.15:
            s += f"{rng.randint(2, 9999)} "
        out.append(s)
        size += len(s)
    t = "".join(out)[: n_bytes - 1].rstrip() + "."
    return t + " " * (n_bytes - len(t))


def messages(size, count=HISTORY, seed=0):
    out = []
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        out.append((role, text(size, seed * 100_003 + i), T0 + i * 1000))
    return out


def seed_document(msgs):
    history = [{"role": r, "content": c, "timestamp": iso(ts)} for r, c, ts in msgs]
    return json.dumps({"conversation_history": history, "user_profile": {}, "context": {}})


def key(i):
    # Same names in every store (the key's sds and dict entry cost the same).
    return f"s:{{{i:06d}}}"


class DServer(Server):
    """bench.Server with DEBUG enabled (for DEBUG RELOAD); fresh temp dir, no
    persistence config: `--save '' --appendonly no`, rdbcompression default (yes)."""

    def start(self):
        self.port = self.free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-density-", dir=self.workdir)
        self.logfile = os.path.join(self.dir, "redis.log")
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", self.dir, "--logfile", self.logfile, "--daemonize", "no",
               "--enable-debug-command", "yes", "--loadmodule", self.module]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        with open(os.path.join(self.workdir, "redis.pid"), "w") as f:
            f.write(str(self.proc.pid))
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start: " + self.tail_log())
            try:
                r = self.client(5)
                r.ping()
                r.close()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING")

    def stop(self):
        # SHUTDOWN NOSAVE over a raw socket: redis-py retries the dropped
        # connection with back-off (seconds per server).
        if self.proc is not None and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    s.sendall(resp("SHUTDOWN", "NOSAVE"))
                    s.recv(100)
            except OSError:
                pass
        super().stop()


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return b"".join(out)


def restore_all(port, payload, n, batch=500):
    """RESTORE key TTL_MS payload for n keys over one raw socket, pipelined in
    batches (redis-py would copy each 18 KB payload a few times more)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(300)
        f = s.makefile("rb")
        for start in range(0, n, batch):
            end = min(n, start + batch)
            s.sendall(b"".join(resp("RESTORE", key(i), TTL_MS, payload) for i in range(start, end)))
            for _ in range(end - start):
                line = f.readline()
                if line != b"+OK\r\n":
                    raise RuntimeError(f"RESTORE: {line[:200]!r}")


def build_by_writes(r, store, msgs, first, n):
    p = r.pipeline(transaction=False)
    doc = seed_document(msgs) if store == "json" else None
    for i in range(first, first + n):
        k = key(i)
        if store == "mem":
            for role, c, ts in msgs:
                p.execute_command("MEM.APPEND", k, role, c, "TS", ts)
        elif store == "list":
            for _, c, _ in msgs:
                p.rpush(k, c)
            p.pexpire(k, TTL_MS)
        else:
            p.set(k, doc, px=TTL_MS)
        if i % 50 == 49:
            for x in p.execute(raise_on_error=False):
                if isinstance(x, Exception):
                    raise x
    for x in p.execute(raise_on_error=False):
        if isinstance(x, Exception):
            raise x


def check_key(r, store, k, msgs):
    """The key holds the 30 messages (after RESTORE and after every reload)."""
    if store == "mem":
        got = r.execute_command("MEM.GET", k, "LAST", 1)
        ok = int(as_map(r.execute_command("MEM.INFO", k))["messages"]) == HISTORY and \
            as_map(got[-1])["content"].decode() == msgs[-1][1]
    elif store == "list":
        ok = r.llen(k) == HISTORY and r.lindex(k, -1).decode() == msgs[-1][1]
    else:
        ok = json.loads(r.get(k))["conversation_history"][-1]["content"] == msgs[-1][1]
    if not ok or r.pttl(k) <= 0:
        raise RuntimeError(f"{store}: key {k} does not hold the 30 messages with an expiry")


def used_memory(srv):
    # A new connection, once the writers' connections are gone (their buffers
    # count in used_memory).
    r = srv.client(300)
    deadline = time.time() + 5
    while int(r.info("clients")["connected_clients"]) > 2 and time.time() < deadline:
        time.sleep(0.01)
    v = int(r.info("memory")["used_memory"])
    r.close()
    return v


def cpu_s(pid):
    """The server process's CPU seconds (utime + stime of all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(r, pid, *cmd):
    """(wall s from the client, server CPU s) of one command. The CPU time
    does not grow when other work on the shared machine takes the core."""
    c, t = cpu_s(pid), time.perf_counter()
    r.execute_command(*cmd)
    return time.perf_counter() - t, cpu_s(pid) - c


def build_store(a, size, store, srv):
    """Fills a fresh server with one store's sessions; the memory figures."""
    msgs = messages(size)
    r = srv.client(600)
    r.ping()  # connected before the baseline: its client struct is not a session's
    # The module builds its default encoding in the background at start
    # (~35 MB): the baseline waits for it, or the sample would count it.
    deadline = time.time() + 60
    while time.time() < deadline and "o200k_base" not in str(r.info("mem").get("encodings_loaded", "")):
        time.sleep(0.05)
    base0 = used_memory(srv)
    # Sample built by the writes themselves, from a connection closed before
    # measuring (its query buffer would count in used_memory).
    w = srv.client(600)
    build_by_writes(w, store, msgs, 0, a.sample)
    w.close()
    check_key(r, store, key(a.sample - 1), msgs)
    written = (used_memory(srv) - base0) / a.sample
    written_mu = r.memory_usage(key(a.sample - 1), samples=0)
    # One template session, DUMPed, restored under N keys.
    payload = r.dump(key(0))
    r.flushall()
    base = used_memory(srv)
    t = time.perf_counter()
    restore_all(srv.port, payload, a.sessions)
    build_s = time.perf_counter() - t
    if r.dbsize() != a.sessions:
        raise RuntimeError(f"{store}: {r.dbsize()} keys after RESTORE, expected {a.sessions}")
    check_key(r, store, key(a.sessions - 1), msgs)
    grown = used_memory(srv) - base
    if a.rdbcompression == "no":
        r.config_set("rdbcompression", "no")
    mu = r.memory_usage(key(a.sessions // 2), samples=0)
    r.close()
    return {"store": store, "size": size, "n": a.sessions, "payload": len(payload),
            "used": grown / a.sessions, "mu": mu, "written": written, "written_mu": written_mu,
            "build_s": build_s, "base": base, "after": [],
            **{k: [] for k in ("save", "load", "direct", "save_cpu", "load_cpu", "direct_cpu")}}


def time_run(a, srv, v):
    """One run: SAVE, then DEBUG RELOAD NOSAVE. DEBUG RELOAD is rdbSave,
    emptyData, rdbLoad (Redis's debug.c): SAVE is the same rdbSave and NOSAVE
    the other two, so DEBUG RELOAD's time is their sum (a third less wall time
    than timing it too; --debug-reload times it as well)."""
    r = srv.client(600)
    pid = srv.proc.pid
    for name, cmd in (("save", ["SAVE"]), ("load", ["DEBUG", "RELOAD", "NOSAVE"]),
                      ("direct", ["DEBUG", "RELOAD"] if a.debug_reload else None)):
        if cmd:
            wall, cpu = timed(r, pid, *cmd)
            v[name].append(wall)
            v[name + "_cpu"].append(cpu)
    if r.dbsize() != a.sessions:
        raise RuntimeError(f"{v['store']}: {r.dbsize()} keys after DEBUG RELOAD")
    check_key(r, v["store"], key(a.sessions - 1), messages(v["size"]))
    v["after"].append(used_memory(srv) - v["base"])
    v["rdb"] = os.path.getsize(os.path.join(srv.dir, "dump.rdb"))
    r.close()


def measure_size(a, size, failures):
    """All stores of one message size: each on its own fresh server, built one
    after the other, then timed in interleaved runs (run 1 of every store, then
    run 2...), so load from elsewhere on the shared machine falls on all alike."""
    servers, out = {}, {}
    try:
        for store in a.stores:
            log(f"== memory: {size} B, {store}: build")
            try:
                servers[store] = DServer(a.module, a.workdir)
                servers[store].start()
                out[store] = build_store(a, size, store, servers[store])
            except Exception as e:  # reported, the run goes on
                failures.append(f"{size} B {store}: {type(e).__name__}: {e}")
                log("  FAILED: " + failures[-1])
                servers.pop(store).stop()
        for run in range(a.runs):
            for store in list(out):
                log(f"== memory: {size} B, {store}: run {run + 1}/{a.runs}")
                try:
                    time_run(a, servers[store], out[store])
                except Exception as e:
                    failures.append(f"{size} B {store} run {run + 1}: {type(e).__name__}: {e}")
                    log("  FAILED: " + failures[-1])
                    out.pop(store)
                    servers.pop(store).stop()
    finally:
        for srv in servers.values():
            srv.stop()
    for v in out.values():
        v["reload"] = [x + y for x, y in zip(v["save"], v["load"])]
        v["reload_cpu"] = [x + y for x, y in zip(v["save_cpu"], v["load_cpu"])]
        v["after_reload"] = statistics.median(v["after"]) / a.sessions
        log(f"  {size} B {v['store']}: " + json.dumps({k: (round(x, 3) if isinstance(x, float) else x)
                                                       for k, x in v.items() if not isinstance(x, list)})
            + f" save {fmt_runs(v['save'])} reload {fmt_runs(v['reload'])} load {fmt_runs(v['load'])}"
            + (f" DEBUG RELOAD itself {fmt_runs(v['direct'])}" if v["direct"] else ""))
    return {(size, s): v for s, v in out.items()}


# --------------------------------------------------------------------------- commands

def cmd_part(a):
    """Server CPU per call at each session size (one server, one key per size).
    Rounds interleave the sizes, so load from elsewhere on the shared machine
    falls on every size alike; the best batch of each is kept."""
    srv = DServer(a.module, a.workdir)
    srv.start()
    try:
        r = srv.client(600)
        r.config_set("mem.max-messages-limit", max(a.cmd_sizes) * 2)
        r.config_set("mem.max-tokens-limit", 1_000_000_000)
        r.config_set("mem.max-tokens", 1_000_000_000)
        pool = [text(600, 7_000 + i) for i in range(64)]
        counter = [0]

        def nxt():
            counter[0] += 1
            return counter[0]

        cases = []  # (label, commandstats name, size, fn(pipeline), calls)
        for n in a.cmd_sizes:
            k, tk, xk = f"c:{{{n}}}", f"t:{{{n}}}", f"x:{{{n}}}"
            r.config_set("mem.max-messages", n)
            p = r.pipeline(transaction=False)
            for i in range(n):
                role = "user" if i % 2 == 0 else "assistant"
                p.execute_command("MEM.APPEND", k, role, pool[i % 64], "TS", T0 + i)
                p.xadd(xk, {"role": role, "content": pool[i % 64]}, maxlen=n, approximate=False)
                if i % 500 == 499:
                    p.execute()
            p.execute()
            # A copy for the 16 B appends, which replace the oldest messages.
            r.restore(tk, 0, r.dump(k))
            for kk in (k, tk):
                if int(as_map(r.execute_command("MEM.INFO", kk))["messages"]) != n or r.xlen(xk) != n:
                    raise RuntimeError(f"session {kk}: not {n} messages")

            def bind(k=k, tk=tk, xk=xk, n=n):
                return [
                    ("MEM.APPEND 600 B (trims one)", "mem.append",
                     lambda p: p.execute_command("MEM.APPEND", k, "user", pool[nxt() % 64]), a.calls),
                    ("MEM.APPEND 16 B (trims one; counting ~0)", "mem.append",
                     lambda p: p.execute_command("MEM.APPEND", tk, "user", f"ok, noted {nxt():06d}"), a.calls),
                    ("MEM.GET LAST 10", "mem.get", lambda p: p.execute_command("MEM.GET", k, "LAST", 10), a.calls),
                    ("MEM.GET BUDGET 2000", "mem.get",
                     lambda p: p.execute_command("MEM.GET", k, "BUDGET", 2000), a.calls),
                    ("MEM.GET (all)", "mem.get", lambda p: p.execute_command("MEM.GET", k),
                     max(3, min(300, 30_000 // n))),
                    ("MEM.SUMMARIZE_CHECK", "mem.summarize_check",
                     lambda p: p.execute_command("MEM.SUMMARIZE_CHECK", k), a.calls),
                    ("MEM.INFO", "mem.info", lambda p: p.execute_command("MEM.INFO", k), a.calls),
                    ("XADD MAXLEN n 600 B (reference)", "xadd",
                     lambda p: p.xadd(xk, {"role": "user", "content": pool[nxt() % 64]}, maxlen=n,
                                      approximate=False), a.calls),
                ]
            cases += [(label, cmd, n, fn, calls) for label, cmd, fn, calls in bind()]
        results = {}
        for rep in range(a.reps):
            for label, cmd, n, fn, calls in cases:
                r.config_resetstat()
                for start in range(0, calls, 100):
                    p = r.pipeline(transaction=False)
                    for _ in range(min(100, calls - start)):
                        fn(p)
                    for x in p.execute(raise_on_error=False):
                        if isinstance(x, Exception):
                            raise RuntimeError(f"{label} at {n}: {x}")
                c, usec, failed = cmdstats(r).get(cmd, (0, 0.0, 0))
                if failed or c != calls:
                    raise RuntimeError(f"{label} at {n}: {c} calls, {failed} failed (expected {calls})")
                prev = results.get((label, n))
                results[(label, n)] = usec / c if prev is None else min(prev, usec / c)
            log(f"  round {rep + 1}/{a.reps} done")
        for label, _, n, _, _ in cases:
            log(f"  {n} msgs {label}: {results[(label, n)]:.2f} us/call")
        for n in a.cmd_sizes:  # every append trimmed one: the sessions kept their size
            for kk in (f"c:{{{n}}}", f"t:{{{n}}}"):
                held = int(as_map(r.execute_command("MEM.INFO", kk))["messages"])
                if held != n:
                    raise RuntimeError(f"session {kk} holds {held} after the appends, expected {n}")
        return results
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default=os.path.join(ROOT, "target/release/libredis_mem.so"))
    ap.add_argument("--workdir", default=os.path.join(ROOT, "target/bench"))
    ap.add_argument("--out", default=None, help="write the kept section into this file (docs/PERFORMANCE.md)")
    ap.add_argument("--memory-only", action="store_true", help="only the many-sessions part")
    ap.add_argument("--commands-only", action="store_true", help="only the per-command part")
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--sizes", default="200,600", help="message sizes in bytes")
    ap.add_argument("--stores", default="mem,list,json")
    ap.add_argument("--runs", type=int, default=3, help="SAVE / DEBUG RELOAD runs per store")
    ap.add_argument("--debug-reload", action="store_true", help="also time DEBUG RELOAD itself")
    ap.add_argument("--rdbcompression", choices=("yes", "no"), default="yes",
                    help="no: SAVE/load without LZF (the stores' own cost)")
    ap.add_argument("--sample", type=int, default=2000, help="sessions built by writes, per store")
    ap.add_argument("--cmd-sizes", default="30,1000,10000")
    ap.add_argument("--calls", type=int, default=2000, help="calls per batch of the per-command part")
    ap.add_argument("--reps", type=int, default=5, help="batches per command (best shown)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 20,000 sessions, sample 500, sizes 30,1000 for the commands")
    ap.add_argument("--command", default="make density")
    a = ap.parse_args()
    if a.quick:
        a.sessions, a.sample, a.cmd_sizes = min(a.sessions, 20_000), min(a.sample, 500), "30,1000"
    a.module = os.path.abspath(a.module)
    a.sizes = [int(x) for x in a.sizes.split(",") if x]
    a.stores = [s for s in a.stores.split(",") if s]
    a.cmd_sizes = [int(x) for x in a.cmd_sizes.split(",") if x]
    if not os.path.exists(a.module):
        sys.exit(f"module not found: {a.module} (cargo build --release)")
    if any(s not in STORES for s in a.stores) or a.runs < 1 or a.sample < 1 or a.sessions < 1:
        sys.exit("bad --stores / --runs / --sample / --sessions")
    os.makedirs(a.workdir, exist_ok=True)
    # SIGTERM (run_bench.sh's timeout) unwinds, so each server is stopped and its
    # temp dir (an RDB of up to 1.2 GB) removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    m0, t0 = machine(), time.time()
    mem, cmd, failures = {}, {}, []
    if not a.commands_only:
        for size in a.sizes:
            mem.update(measure_size(a, size, failures))
    if not a.memory_only:
        log("== commands")
        try:
            cmd = cmd_part(a)
        except Exception as e:
            failures.append(f"commands: {type(e).__name__}: {e}")
            log("  FAILED: " + failures[-1])
    elapsed, m1 = time.time() - t0, machine()
    parts = []
    if mem:
        parts.append(memory_tables(mem, a))
        if "mem" in a.stores and "list" in a.stores:
            parts.append(goals(mem, a))
    if cmd:
        parts.append(command_table(cmd, a))
    if failures:
        parts.append("Failed: " + "; ".join(failures))
    print("\n\n".join(parts))
    print("DENSITY_RESULT " + json.dumps({
        "memory": [{k: v for k, v in x.items()} for x in mem.values()],
        "commands": [{"command": l, "messages": n, "usec_per_call": v} for (l, n), v in cmd.items()],
        "failures": failures}))
    if a.out:
        write_section(a.out, render_doc(a, mem, cmd, failures, m0, m1, elapsed))
        print(f"wrote {os.path.relpath(a.out, ROOT)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
