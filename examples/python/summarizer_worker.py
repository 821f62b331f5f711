#!/usr/bin/env python3
"""Summarizer worker for redis-mem sessions.

The module publishes a keyspace notification `mem.threshold` (module class,
flag `d`) when an append makes a session meet its summarization threshold.
This worker subscribes to `__keyevent@<db>__:mem.threshold`, and for each
session it is told about:

1. MEM.SUMMARIZE_CHECK key [KEEP n] -> `upto`: every message but the newest
   `keep` (never splitting a tool call from its result);
2. MEM.GET key -> the current summary and the messages with id <= upto;
3. summarizes them with a pluggable function (an OpenAI-compatible endpoint
   when OPENAI_BASE_URL / OPENAI_API_KEY are set, otherwise an offline
   extractive summary);
4. MEM.SUMMARIZE key upto text: the summary replaces exactly the messages
   it covers; anything appended meanwhile (greater ids) is untouched.

Usage:
    python summarizer_worker.py [--url redis://localhost:6379/0] [--keep 10]
        [--max-events N] [--timeout SECONDS] [--once KEY]

Environment for the LLM summarizer: OPENAI_BASE_URL (e.g.
https://api.openai.com/v1), OPENAI_API_KEY, OPENAI_MODEL (default
gpt-4o-mini), OPENAI_TIMEOUT (seconds, default 60).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from redis_mem.client import RedisMemClient, _text  # noqa: E402

log = logging.getLogger("redis_mem.summarizer")

#: summarize_fn(previous_summary or None, messages to fold in) -> summary text
SummarizeFn = Callable[[Optional[str], Sequence["Entry"]], str]

EVENT = "mem.threshold"


@dataclass(frozen=True)
class Entry:
    """A message handed to a summarize function."""

    id: int
    role: str
    content: str
    ts: int


# --------------------------------------------------------------------------
# Summarize functions
# --------------------------------------------------------------------------

def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for i, ch in enumerate(text):
        if ch in ".!?" and (i + 1 == len(text) or text[i + 1] == " ") and i >= 20:
            return text[: i + 1]
    return text


def extractive_summarize(
    previous: Optional[str],
    messages: Sequence[Entry],
    per_message: int = 160,
    max_chars: int = 4000,
) -> str:
    """Offline default: the previous summary plus the first sentence of each
    message (clipped), newest kept when the result gets too long."""
    lines = [f"- {m.role}: {_clip(_first_sentence(m.content), per_message)}"
             for m in messages if m.content.strip()]
    head = _clip(previous, max_chars // 2) if previous else ""
    # Room for the head, its newline and an "(N earlier messages omitted)" line.
    budget = max_chars - len(head) - 1 - 40
    kept: List[str] = []
    for line in reversed(lines):
        if budget - len(line) - 1 < 0:
            break
        kept.append(line)
        budget -= len(line) + 1
    kept.reverse()
    dropped = len(lines) - len(kept)
    parts = []
    if head:
        parts.append(head)
    if dropped:
        parts.append(f"({dropped} earlier messages omitted)")
    parts.extend(kept)
    return "\n".join(parts) if parts else "(empty conversation)"


SYSTEM_PROMPT = (
    "You maintain the running summary of a chat session. Merge the previous "
    "summary (if any) with the new messages into one concise summary that keeps "
    "facts, decisions, names, open questions and tool results needed to continue "
    "the conversation. Reply with the summary only."
)


def openai_summarizer(
    base_url: str,
    api_key: Optional[str] = None,
    model: str = "gpt-4o-mini",
    timeout: float = 60.0,
) -> SummarizeFn:
    """A summarize function calling an OpenAI-compatible
    `POST {base_url}/chat/completions` with the standard library only."""
    url = base_url.rstrip("/") + "/chat/completions"

    def summarize(previous: Optional[str], messages: Sequence[Entry]) -> str:
        transcript = "\n".join(f"{m.role}: {m.content}" for m in messages)
        user = (f"Previous summary:\n{previous}\n\n" if previous else "") + (
            f"New messages:\n{transcript}"
        )
        body = json.dumps(
            {
                "model": model,
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": user},
                ],
                "temperature": 0.2,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.load(resp)
        text = reply["choices"][0]["message"]["content"]
        if not isinstance(text, str) or not text.strip():
            raise ValueError("the endpoint returned an empty summary")
        return text.strip()

    return summarize


def default_summarizer() -> SummarizeFn:
    """OpenAI-compatible endpoint when OPENAI_BASE_URL or OPENAI_API_KEY is
    set, else the offline extractive summary."""
    base = os.environ.get("OPENAI_BASE_URL")
    key = os.environ.get("OPENAI_API_KEY")
    if base or key:
        return openai_summarizer(
            base or "https://api.openai.com/v1",
            key,
            model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
            timeout=float(os.environ.get("OPENAI_TIMEOUT", "60")),
        )
    return extractive_summarize


# --------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class SummaryDone:
    key: str
    upto: int
    summarized: int  # messages folded into the summary
    messages: int  # left in the session afterwards
    total_tokens: int


def ensure_notifications(r: "redis.Redis") -> str:
    """Makes sure `notify-keyspace-events` has `d` (module events) and `E`
    (keyevent channels, which this worker listens on), keeping the flags
    already set. Returns the value in force."""
    reply = r.config_get("notify-keyspace-events") or {}
    current = _text(next(iter(reply.values()), b"")) or ""
    flags = current
    if "d" not in flags and "A" not in flags:  # A = "g$lshzxetd", includes d
        flags += "d"
    if "E" not in flags:  # the worker listens on __keyevent@<db>__ channels
        flags += "E"
    if flags != current:
        r.config_set("notify-keyspace-events", flags)
    return flags


class SummarizerWorker:
    def __init__(
        self,
        client: "redis.Redis",
        summarize_fn: Optional[SummarizeFn] = None,
        keep: Optional[int] = None,
        db: Optional[int] = None,
        configure: bool = True,
    ):
        self.redis = client
        self.mem = RedisMemClient(client)
        self.summarize_fn = summarize_fn or default_summarizer()
        self.keep = keep
        self.db = client.connection_pool.connection_kwargs.get("db", 0) if db is None else db
        self.configure = configure
        #: Set once the subscription is live (tests wait on it).
        self.ready = threading.Event()
        self._stop = threading.Event()

    @property
    def channel(self) -> str:
        return f"__keyevent@{self.db}__:{EVENT}"

    def stop(self) -> None:
        self._stop.set()

    def run_once(self, key: str) -> Optional[SummaryDone]:
        """Summarizes `key` if MEM.SUMMARIZE_CHECK says so and there is
        something to cover; None otherwise (or when another worker won)."""
        check = self.mem.summarize_check(key, keep=self.keep)
        if not check.summarize or check.upto == 0:
            return None
        entries = self.mem.get(key)
        previous = None
        todo: List[Entry] = []
        for e in entries:
            if e.is_summary:
                previous = e.content
            elif e.id <= check.upto:
                todo.append(Entry(e.id, e.role, e.content, e.ts))
        if not todo:
            return None
        text = self.summarize_fn(previous, todo)
        try:
            result = self.mem.summarize(key, check.upto, text)
        except redis.ResponseError as err:
            # A concurrent summarizer or trim got there first: nothing lost,
            # the next threshold event retries.
            log.warning("MEM.SUMMARIZE %s %s refused: %s", key, check.upto, err)
            return None
        log.info("summarized %s up to id %s (%d messages)", key, check.upto, len(todo))
        return SummaryDone(key, check.upto, len(todo), result.messages, result.total_tokens)

    def run(
        self,
        max_events: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> List[SummaryDone]:
        """Handles mem.threshold events until `max_events` events were
        handled, `timeout` seconds passed, or stop() was called."""
        if self.configure:
            ensure_notifications(self.redis)
        deadline = None if timeout is None else time.monotonic() + timeout
        done: List[SummaryDone] = []
        handled = 0
        pubsub = self.redis.pubsub()
        try:
            pubsub.subscribe(self.channel)
            # Wait for the subscribe confirmation so no event is missed after
            # `ready` is set.
            while not self.ready.is_set():
                msg = pubsub.get_message(timeout=1.0)
                if msg and _text(msg.get("type")) == "subscribe":
                    self.ready.set()
                elif deadline is not None and time.monotonic() > deadline:
                    return done
            while not self._stop.is_set():
                if max_events is not None and handled >= max_events:
                    break
                wait = 1.0
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, left)
                msg = pubsub.get_message(timeout=wait)
                if not msg or _text(msg.get("type")) != "message":
                    continue
                key = _text(msg["data"])
                handled += 1
                try:
                    res = self.run_once(key)
                except Exception:  # keep serving other sessions
                    log.exception("summarizing %s failed", key)
                    continue
                if res is not None:
                    done.append(res)
        finally:
            pubsub.close()
        return done


def run_once(key: str, client: Optional["redis.Redis"] = None, **kwargs) -> Optional[SummaryDone]:
    """Module-level shortcut: one summarization pass on `key`."""
    client = client or redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return SummarizerWorker(client, **kwargs).run_once(key)


def run(
    client: Optional["redis.Redis"] = None,
    max_events: Optional[int] = None,
    timeout: Optional[float] = None,
    **kwargs,
) -> List[SummaryDone]:
    """Module-level shortcut: the event loop (bounded by max_events/timeout)."""
    client = client or redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return SummarizerWorker(client, **kwargs).run(max_events=max_events, timeout=timeout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    p.add_argument("--keep", type=int, default=None, help="messages left out of the summary")
    p.add_argument("--max-events", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, help="seconds to run")
    p.add_argument("--once", metavar="KEY", help="summarize one session and exit")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    worker = SummarizerWorker(redis.Redis.from_url(a.url), keep=a.keep)
    if a.once:
        res = worker.run_once(a.once)
        print(json.dumps(res.__dict__ if res else None))
        return 0
    try:
        for res in worker.run(max_events=a.max_events, timeout=a.timeout):
            print(json.dumps(res.__dict__))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
