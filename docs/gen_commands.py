#!/usr/bin/env python3
"""Regenerates docs/commands.md: every MEM.* command run for real through
redis-cli against a fresh redis-server with the module, output pasted as is.

    python3 docs/gen_commands.py        (after cargo build --release)
"""
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "target", "release", "libredis_mem.so")

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
        "MEM.SUMMARIZE mem:{carol} 2 'Trip to Rome, May 3-7.' LEASE 1",
        "MEM.SUMMARIZE mem:{carol} 2 'Trip to Rome, May 3-7.' LEASE 1",
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
    ("MEM.COUNT", "Count a text (or, with ROLE, a message) the way the module will, under any model's encoding.", [
        "MEM.COUNT gpt-4o '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT deepseek-chat '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT qwen-plus '我们在 Redis 里保存对话记忆'",
        "MEM.COUNT mistral-large 'Plan a trip to Rome.' ROLE user",
        "MEM.COUNT glm-4.5 ''",
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


def main():
    if not os.path.exists(MODULE):
        sys.exit(f"build the module first: {MODULE} is missing")
    port = free_port()
    workdir = tempfile.mkdtemp()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--dir", workdir,
         "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).stdout.strip() == b"PONG":
                break
            time.sleep(0.05)
        out = ["# MEM.* commands, by example", "",
               "Every block below is a real redis-cli session against redis-server with the module "
               "(regenerate with `python3 docs/gen_commands.py`). Paste the lines after `$` into a shell "
               "while `make run` is running.", ""]
        for title, text, commands in SECTIONS:
            out += [f"## {title}", "", text, "", "```"]
            for command in commands:
                shown = command.replace("redis-cli GET", f"redis-cli --raw -p {port} GET")
                result = subprocess.run(f"redis-cli --no-raw -p {port} {shown}", shell=True,
                                        capture_output=True, text=True)
                reply = (result.stdout + result.stderr).rstrip("\n")
                if title == "INFO mem":
                    reply = "\n".join(l for l in reply.splitlines() if "usec" not in l)
                out += [f"$ redis-cli {command}", reply]
            out += ["```", ""]
        with open(os.path.join(ROOT, "docs", "commands.md"), "w") as f:
            f.write("\n".join(out))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
