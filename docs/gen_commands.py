#!/usr/bin/env python3
"""Regenerates the redis-cli sessions of the docs: every MEM.* command run
for real through redis-cli against a fresh redis-server with the module,
output pasted as is.

    python3 docs/gen_commands.py                  (after cargo build --release)
    python3 docs/gen_commands.py --module /tmp/x/libredis_mem.so

It rewrites only what lies between generated-block markers:

- docs/commands.md: one block per entry of SECTIONS, between
  `<!-- BEGIN gen_commands.py: NAME -->` and `<!-- END gen_commands.py: NAME -->`
  (the reference prose around the blocks is hand-written and kept);
- README.md: the quick-start session (QUICKSTART, on a server of its own),
  between `<!-- BEGIN gen_commands.py: quickstart -->` and its END marker.

A marker without its entry, or an entry without its markers, is an error
(nothing is written). `--check` writes nothing and exits 1 when a file would
change in anything but the lines that vary by run (timestamps, lease
tokens: the comparison is of the commands and the reply shapes).

Environment: REDIS_MEM_MODULE (the .so, default target/release/libredis_mem.so;
`--module` wins), REDIS_SERVER / REDIS_CLI (default redis-server / redis-cli
on PATH), as for the tests.
"""
import argparse
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get("REDIS_MEM_MODULE") or os.path.join(ROOT, "target", "release", "libredis_mem.so")
REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
REDIS_CLI = os.environ.get("REDIS_CLI", "redis-cli")

# The README's quick start: a few calls as a user types them after `make run`,
# RESP3 (`redis-cli -3`) so each map field is one line.
QUICKSTART = [
    "-3 MEM.APPEND mem:{alice} user 'What is the capital of France?' MAXMSGS 3",
    "-3 MEM.APPEND mem:{alice} assistant 'Paris.'",
    "-3 MEM.APPEND mem:{alice} user 'And of Italy?'",
    "-3 MEM.SUMMARIZE_CHECK mem:{alice} KEEP 1",
    "-3 MEM.SUMMARIZE mem:{alice} 2 'The user asked for the capital of France (Paris).'",
    "-3 MEM.GET mem:{alice}",
    "-3 MEM.INFO mem:{alice}",
]

SECTIONS = [
    ("MEM.APPEND", "Append a message; the reply says what happened and whether to summarize.", [
        "MEM.APPEND mem:{alice} system 'You are a helpful travel assistant.' TS 1735689600000",
        "MEM.APPEND mem:{alice} user 'What is the capital of France?' TS 1735689601000",
        "MEM.APPEND mem:{alice} assistant 'Paris.' TS 1735689602000 META '{\"model_used\":\"gpt-4o\"}'",
        "MEM.APPEND mem:{alice} user 'And of Italy?' TS 1735689603000 MAXMSGS 50 TTL 3600 MSGID turn-2/user",
        "TTL mem:{alice}",
        "MEM.APPEND mem:{alice} user 'And of Italy?' MSGID turn-2/user",
        "MEM.APPEND mem:{alice} user 'x' TS -1",
        "MEM.APPEND mem:{alice} user 'x' META '[1,2]'",
        "MEM.APPEND mem:{alice} user 'x' FOO 1",
    ]),
    ("MEM.GET", "Read the session: all, the newest, after an id, within a budget, or as JSON.", [
        "MEM.GET mem:{alice} LAST 2",
        "MEM.GET mem:{alice} AFTER 3",
        "MEM.GET mem:{alice} BUDGET 30",
        "MEM.GET mem:{alice} LAST 1 FORMAT JSON",
        "MEM.GET mem:{nobody}",
    ]),
    ("MEM.SUMMARIZE_CHECK", "Is it time to summarize, and up to which message?", [
        "MEM.SUMMARIZE_CHECK mem:{alice} KEEP 2",
        "MEM.SUMMARIZE_CHECK mem:{alice} MODEL claude-3-5-sonnet",
        "MEM.SUMMARIZE_CHECK mem:{alice} CONTEXT 100",
    ]),
    ("MEM.SUMMARIZE_BEGIN", "A summarizer worker's start: one worker gets the lease, the others `lease 0`.", [
        "MEM.APPEND mem:{carol} user 'Plan a trip to Rome.' MAXMSGS 5",
        "MEM.APPEND mem:{carol} assistant 'Which dates?'",
        "MEM.APPEND mem:{carol} user 'May 3 to 7.'",
        "MEM.APPEND mem:{carol} assistant 'Three flights found.'",
        "MEM.SUMMARIZE_BEGIN mem:{carol} 60000 KEEP 2",
        "MEM.SUMMARIZE_BEGIN mem:{carol} 60000 KEEP 2",
        "MEM.SUMMARIZE mem:{carol} 2 'Trip to Rome, May 3-7.'",
        "MEM.SUMMARIZE mem:{carol} 2 'Trip to Rome, May 3-7.' LEASE $LEASE",
        "MEM.SUMMARIZE mem:{carol} 2 'Trip to Rome, May 3-7.' LEASE $LEASE",
    ]),
    ("MEM.SUMMARIZE", "Replace the messages up to an id with a summary; later messages stay.", [
        "MEM.SUMMARIZE mem:{alice} 2 'The user is planning a trip and asked about France.'",
        "MEM.GET mem:{alice}",
        "MEM.SUMMARIZE mem:{alice} 1 'stale'",
    ]),
    ("MEM.EXTSET / MEM.EXTGET", "An orchestrator's own conversation id, with its own expiry.", [
        "MEM.EXTSET mem:{alice} dify 5f1c2a9e-conv EX 86400",
        "MEM.EXTGET mem:{alice} dify",
        "MEM.EXTGET mem:{alice} n8n",
    ]),
    ("MEM.IMPORT", "Move a client-side user_memory_* document into a session.", [
        "SET user_memory_bob '{\"conversation_history\":[{\"role\":\"user\",\"content\":\"Hi, I am Bob\",\"timestamp\":\"2025-01-01T10:00:00\"},{\"role\":\"assistant\",\"content\":\"Hello Bob!\",\"timestamp\":\"2025-01-01T10:00:02\"}],\"user_profile\":{\"name\":\"Bob\"},\"context\":{\"topic\":\"greeting\"}}'",
        "MEM.IMPORT mem:{bob} \"$(redis-cli GET user_memory_bob)\"",
        "MEM.GET mem:{bob} FORMAT JSON",
        "MEM.IMPORT mem:{bob} '{\"conversation_history\":[]}'",
    ]),
    ("MEM.ATTRSET / MEM.ATTRGET / MEM.ATTRDEL", "The document's other members, edited one by one.", [
        "MEM.ATTRSET mem:{bob} user_profile '{\"name\":\"Bob\",\"lang\":\"fr\"}'",
        "MEM.ATTRGET mem:{bob} user_profile",
        "MEM.ATTRSET mem:{bob} context '{\"step\":2}' EX 3600",
        "MEM.ATTRGET mem:{bob}",
        "MEM.ATTRDEL mem:{bob} context",
        "MEM.GET mem:{bob} LAST 1 FORMAT JSON",
        "MEM.ATTRSET mem:{bob} model '\"x\"'",
    ]),
    ("MAXAGE", "Keep only the last N days: older messages leave on every write.", [
        "MEM.APPEND mem:{carol} user 'Hello, long ago' TS 1735689600000 MAXAGE 604800",
        "MEM.APPEND mem:{carol} user 'Hello today'",
        "MEM.GET mem:{carol}",
    ]),
    ("TOKENS", "The provider's reported count (Claude, Gemini: no public tokenizer), stored as given.", [
        "MEM.APPEND mem:{dave} assistant 'Here is the plan.' MODEL claude-sonnet-4-5 TOKENS 412",
        "MEM.APPEND mem:{dave} user 'thanks' TOKENS -1",
        "MEM.APPENDBATCH mem:{dave} '[{\"role\":\"user\",\"content\":\"ok\",\"tokens\":9}]'",
    ]),
    ("MEM.APPENDBATCH", "An agent step (a tool call and its result) in one atomic command; a bad item refuses the whole batch.", [
        "MEM.APPENDBATCH mem:{erin} '[{\"role\":\"assistant\",\"content\":\"\",\"meta\":{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_weather\",\"args\":{\"city\":\"Rome\"}}]}},{\"role\":\"tool\",\"content\":\"21 C\",\"meta\":{\"tool_call_id\":\"c1\"}}]'",
        "MEM.APPENDBATCH mem:{erin} '[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\"}]'",
        "MEM.INFO mem:{erin}",
    ]),
    ("MEM.COUNT", "Count a text (or, with ROLE, a message) the way the module will, under any model's encoding.", [
        "MEM.COUNT gpt-4o '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT deepseek-chat '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT qwen-plus '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT mistral-large 'Plan a trip to Rome.' ROLE user",
        "MEM.COUNT glm-4.5 ''",
        "MEM.COUNT gpt-4o '' ROLE assistant META '{\"tool_calls\":[{\"id\":\"call_1\",\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\"}}]}'",
        "MEM.COUNT qwen3-32b '' ROLE assistant META '{\"tool_calls\":[{\"id\":\"call_1\",\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\"}}]}'",
    ]),
    ("MEM.MODELS", "The model table: what a model resolves to, and operator entries (mem.models).", [
        "MEM.MODELS gpt-4-turbo",
        "MEM.MODELS claude-opus-4-5",
        "MEM.MODELS meta-llama/Llama-3.3-70B-Instruct",
        "CONFIG SET mem.models 'acme-llm-*=qwen2:131072 claude-sonnet-4-5*=default:1000000'",
        "MEM.MODELS acme-llm-7b",
        "CONFIG SET mem.models 'acme=nope:1'",
        "CONFIG GET mem.models",
    ]),
    ("MEM.INFO", "Counts, settings and ids of a session.", [
        "MEM.INFO mem:{alice}",
        "MEM.INFO mem:{nobody}",
    ]),
    ("INFO mem", "What the module has done since the server started.", [
        "INFO mem",
    ]),
    ("COMMAND DOCS", "Every command carries its documentation and key specs.", [
        "COMMAND DOCS mem.extget",
        "COMMAND DOCS mem.attrdel",
        "COMMAND DOCS mem.count",
    ]),
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A fresh redis-server with the module on a free port, no persistence."""

    def __enter__(self):
        self.lease = 0
        self.port = free_port()
        self.workdir = tempfile.mkdtemp()
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--save", "", "--dir", self.workdir,
             "--loadmodule", MODULE],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if subprocess.run([REDIS_CLI, "-p", str(self.port), "PING"],
                              capture_output=True).stdout.strip() == b"PONG":
                return self
            time.sleep(0.05)
        self.__exit__()
        sys.exit(f"{REDIS_SERVER} with {MODULE} did not answer PING")

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()

    def session(self, commands, title=""):
        """The commands run one by one, as `$ redis-cli ...` lines and replies."""
        out = []
        cli = shlex.quote(REDIS_CLI)
        for command in commands:
            # $LEASE: the token the last granted MEM.SUMMARIZE_BEGIN returned,
            # shown as the number it is (a worker passes its own token).
            command = command.replace("$LEASE", str(self.lease))
            shown = command.replace("redis-cli GET", f"{cli} --raw -p {self.port} GET")
            result = subprocess.run(f"{cli} --no-raw -p {self.port} {shown}", shell=True,
                                    capture_output=True, text=True)
            reply = (result.stdout + result.stderr).rstrip("\n")
            if title == "INFO mem":
                reply = "\n".join(l for l in reply.splitlines() if "usec" not in l)
            granted = re.search(r'"lease"\n\s*\d+\) \(integer\) ([1-9]\d*)', reply)
            if granted:
                self.lease = int(granted.group(1))
            out += [f"$ redis-cli {command}", reply]
        return out


def block(lines):
    return ["```", *lines, "```"]


MARKER = re.compile(r"^<!-- (BEGIN|END) gen_commands\.py: (.+?) -->$")


def splice(path, blocks):
    """`path` with the text between each pair of markers replaced by its
    block. Every marker must have its block and every block its markers."""
    with open(path) as f:
        lines = f.read().split("\n")
    out, inside, seen = [], None, []
    for line in lines:
        m = MARKER.match(line)
        if m and m.group(1) == "BEGIN":
            if inside is not None:
                sys.exit(f"{path}: BEGIN {m.group(2)} inside BEGIN {inside}")
            inside = m.group(2)
            if inside not in blocks:
                sys.exit(f"{path}: no generated block named {inside!r}")
            out += [line, *blocks[inside]]
            seen.append(inside)
        elif m:
            if m.group(2) != inside:
                sys.exit(f"{path}: END {m.group(2)} without its BEGIN")
            inside = None
            out.append(line)
        elif inside is None:
            out.append(line)
    if inside is not None:
        sys.exit(f"{path}: BEGIN {inside} without its END")
    missing = [name for name in blocks if name not in seen]
    if missing:
        sys.exit(f"{path}: no markers for {', '.join(missing)}")
    return "\n".join(out)


def shape(text):
    """What --check compares: the text with every number blanked (numbers
    vary by run: timestamps, lease tokens, ports, times), and INFO's
    mem_build (a hash of the sources: it changes with every edit of src/)."""
    return re.sub(r"\d+", "0", re.sub(r"mem_build:\w+", "mem_build:", text))


def main():
    global MODULE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", help="the module's .so (default $REDIS_MEM_MODULE or target/release)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a file would change beyond run-varying numbers")
    args = ap.parse_args()
    if args.module:
        MODULE = os.path.abspath(args.module)
    if not os.path.exists(MODULE):
        sys.exit(f"build the module first: {MODULE} is missing")
    with Server() as server:
        sections = {title: [text, "", *block(server.session(commands, title))]
                    for title, text, commands in SECTIONS}
    with Server() as server:
        quickstart = block(server.session(QUICKSTART))
    files = {
        os.path.join(ROOT, "docs", "commands.md"): sections,
        os.path.join(ROOT, "README.md"): {"quickstart": quickstart},
    }
    new = {path: splice(path, blocks) for path, blocks in files.items()}
    changed = []
    for path, text in new.items():
        with open(path) as f:
            old = f.read()
        if args.check:
            if shape(old) != shape(text):
                changed.append(path)
        elif old != text:
            with open(path, "w") as f:
                f.write(text)
            changed.append(path)
    for path in changed:
        print(("would change: " if args.check else "wrote ") + os.path.relpath(path, ROOT))
    if args.check and changed:
        sys.exit(1)


if __name__ == "__main__":
    main()
