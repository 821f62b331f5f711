"""Issue 19 findings 10 and 12: the package as a type checker, an IDE and a
user without the extra meet it."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
import subprocess
import sys
import typing

import pytest

import redis_mem


def public_modules():
    for m in pkgutil.iter_modules(redis_mem.__path__):
        if not m.name.startswith("_"):
            yield importlib.import_module("redis_mem." + m.name)


def test_every_public_name_has_a_docstring():
    missing = []
    for mod in [redis_mem, *public_modules()]:
        if not mod.__doc__:
            missing.append(mod.__name__)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__doc__:
                missing.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj) and obj.__module__.startswith("redis_mem"):
                for attr, v in vars(obj).items():
                    f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
                    if not attr.startswith("_") and inspect.isfunction(f) and not f.__doc__:
                        missing.append(f"{mod.__name__}.{name}.{attr}")
    assert missing == []


def test_memory_and_on_unavailable_are_literal_types_and_signatures_are_real():
    from redis_mem.langgraph import SessionMemory
    from redis_mem.middleware import RedisMemMiddleware

    for cls in (RedisMemMiddleware, SessionMemory):
        hints = typing.get_type_hints(cls.__init__)
        assert typing.get_args(hints["memory"]) == ("summarize", "window", "none")
        assert typing.get_args(hints["on_unavailable"]) == ("local", "fail")
        params = inspect.signature(cls.__init__).parameters
        assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
        assert {"session_id", "redis_url", "redis_client"} <= set(params)
    assert set(inspect.signature(SessionMemory.__init__).parameters) == set(
        inspect.signature(RedisMemMiddleware.__init__).parameters)


def test_redis_py_5_to_8_is_allowed_and_the_suite_runs_on_8():
    import redis

    reqs = importlib.metadata.requires("redis-mem") or []
    pin = next(r for r in reqs if r.startswith("redis") and "extra" not in r)
    assert "<9" in pin and ">=5" in pin
    assert int(redis.__version__.split(".")[0]) >= 8  # the newest release, as pip gives it


@pytest.mark.parametrize("module", ["redis_mem.middleware", "redis_mem.langgraph", "redis_mem.langchain",
                                    "redis_mem.messages"])
def test_a_missing_extra_says_which_to_install(module):
    code = ("import sys\n"
            "for m in ('langchain', 'langchain_core', 'langgraph'): sys.modules[m] = None\n"
            f"import {module}\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "pip install 'redis-mem[langchain]'" in out.stderr, out.stderr
    # The core needs no extra.
    core = ("import sys\n"
            "for m in ('langchain', 'langchain_core', 'langgraph'): sys.modules[m] = None\n"
            "import redis_mem, redis_mem.migrate, redis_mem.summarizer, redis_mem.conversation_ids\n")
    assert subprocess.run([sys.executable, "-c", core], capture_output=True, timeout=60).returncode == 0


def test_summarizer_langchain_model_without_the_extra_says_which_to_install(clean):
    code = ("import sys\n"
            "for m in ('langchain', 'langchain.chat_models'): sys.modules[m] = None\n"
            "from redis_mem.summarizer import main\n"
            f"sys.exit(main(['--url', '{clean.url}', '--langchain-model', 'openai:gpt-4o-mini', '--once', 'k']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "pip install 'redis-mem[langchain]'" in out.stderr, out.stderr
