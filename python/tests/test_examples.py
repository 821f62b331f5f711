"""The runnable examples in examples/ work against a real server (offline:
their stand-in models), twice in a row, as separate processes: the second
run continues the first one's conversation from the session."""

from __future__ import annotations

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
