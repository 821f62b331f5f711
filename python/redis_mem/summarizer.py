#!/usr/bin/env python3
"""Summarizer worker for redis-mem sessions.

The module publishes a keyspace notification `mem.threshold` (module class,
flag `d`) when an append makes a session meet its summarization threshold
(which sits `mem.summarize-headroom` below the caps, so there is time to
act before they evict anything). This worker subscribes to
`__keyevent@<db>__:mem.threshold`, and for each session it is told about:

1. MEM.SUMMARIZE_BEGIN key lease-ms [KEEP n] -> `upto` (every message but the
   newest `keep`, never splitting a tool call from its result) and a lease:
   every worker hears the event, one gets the lease, the others `lease 0`,
   so one LLM call is made per summary;
2. MEM.GET key -> the current summary and the messages with id <= upto;
3. summarizes them with a pluggable function (an OpenAI-compatible endpoint
   when OPENAI_BASE_URL / OPENAI_API_KEY are set, otherwise an offline
   extractive summary), bounded by `llm_timeout`;
4. MEM.SUMMARIZE key upto text LEASE token: the summary replaces exactly
   the messages it covers; anything appended meanwhile (greater ids) is
   untouched, and the lease ends.

When the LLM call fails or times out nothing is lost: the messages are
still in the session, the lease expires, and whichever worker comes first
then (this one retries at the lease's expiry; a worker told `lease 0`
looks again then too) takes over. A MEM.SUMMARIZE whose reply was lost is
recognised when resent (`duplicate`).

Usage:
    python summarizer_worker.py [--url redis://localhost:6379/0] [--keep 10]
        [--lease-ms 120000] [--max-events N] [--timeout SECONDS] [--once KEY]

Environment for the LLM summarizer: OPENAI_BASE_URL (e.g.
https://api.openai.com/v1), OPENAI_API_KEY, OPENAI_MODEL (default
gpt-4o-mini), OPENAI_TIMEOUT (seconds, default 60).
"""

from __future__ import annotations

import argparse
import heapq
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


class LLMTimeout(Exception):
    """The summarize function did not answer within `llm_timeout`."""


#: Default lease: long enough for a slow LLM call, short enough that a dead
#: worker's sessions are picked up again within minutes.
DEFAULT_LEASE_MS = 120_000


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
    """``lease_ms``: how long a session is this worker's once granted.
    ``llm_timeout`` (seconds, default 3/4 of the lease): a summarize call
    taking longer is abandoned (its summary would come after the lease), the
    lease runs out and the session is retried. ``retry_jitter``: seconds
    added to a lease's expiry before looking at the session again."""

    def __init__(
        self,
        client: "redis.Redis",
        summarize_fn: Optional[SummarizeFn] = None,
        keep: Optional[int] = None,
        db: Optional[int] = None,
        configure: bool = True,
        lease_ms: int = DEFAULT_LEASE_MS,
        llm_timeout: Optional[float] = None,
        retry_jitter: float = 0.05,
    ):
        self.redis = client
        self.mem = RedisMemClient(client)
        self.summarize_fn = summarize_fn or default_summarizer()
        self.keep = keep
        self.db = client.connection_pool.connection_kwargs.get("db", 0) if db is None else db
        self.configure = configure
        self.lease_ms = int(lease_ms)
        self.llm_timeout = self.lease_ms * 0.75 / 1000 if llm_timeout is None else llm_timeout
        self.retry_jitter = retry_jitter
        #: Set once the subscription is live (tests wait on it).
        self.ready = threading.Event()
        self._stop = threading.Event()
        #: Sessions to look at again: (monotonic time, key), a heap, and the
        #: keys in it (each once, however many events came meanwhile).
        self._later: List = []
        self._queued: set = set()
        #: What happened, for monitoring: LLM calls made, failed (error or
        #: timeout), summaries committed, commits refused, sessions skipped
        #: because another worker held them.
        self.stats = {"llm_calls": 0, "llm_failures": 0, "committed": 0, "refused": 0, "busy": 0}

    @property
    def channel(self) -> str:
        return f"__keyevent@{self.db}__:{EVENT}"

    def stop(self) -> None:
        self._stop.set()

    def _look_again(self, key: str, lease_expires_ms: int) -> None:
        """Queues `key` for when the lease that expires at `lease_expires_ms`
        (server clock, Unix ms) has run out."""
        if key in self._queued:
            return
        wait = max(0.0, lease_expires_ms / 1000 - time.time())
        wait = min(wait, self.lease_ms / 1000) + self.retry_jitter
        heapq.heappush(self._later, (time.monotonic() + wait, key))
        self._queued.add(key)

    def _due(self) -> List[str]:
        now = time.monotonic()
        keys = []
        while self._later and self._later[0][0] <= now:
            key = heapq.heappop(self._later)[1]
            self._queued.discard(key)
            keys.append(key)
        return keys

    def _next_due_in(self) -> Optional[float]:
        return max(0.0, self._later[0][0] - time.monotonic()) if self._later else None

    def _call_llm(self, previous: Optional[str], todo: Sequence[Entry]) -> str:
        """The summarize function, bounded by `llm_timeout`: a call that does
        not answer in time is abandoned (its thread is a daemon; whatever it
        returns later is dropped)."""
        self.stats["llm_calls"] += 1
        out: dict = {}

        def call():
            try:
                out["text"] = self.summarize_fn(previous, todo)
            except BaseException as e:  # handed to the caller below
                out["error"] = e

        t = threading.Thread(target=call, daemon=True, name="summarize-llm")
        t.start()
        t.join(self.llm_timeout)
        if t.is_alive():
            raise LLMTimeout(f"no summary within {self.llm_timeout:.1f} s")
        if "error" in out:
            raise out["error"]
        return out["text"]

    def run_once(self, key: str) -> Optional[SummaryDone]:
        """Summarizes `key` if it is due and this worker gets its lease; None
        otherwise (nothing to do, another worker holds it, or the LLM call
        failed: then the session is looked at again when the lease expires)."""
        begin = self.mem.summarize_begin(key, self.lease_ms, keep=self.keep)
        if not begin.lease:
            if begin.lease_expires and begin.summarize and begin.upto:
                # Another worker is on it; should it fail, take over.
                self.stats["busy"] += 1
                self._look_again(key, begin.lease_expires)
            return None
        entries = self.mem.get(key)
        previous = None
        todo: List[Entry] = []
        for e in entries:
            if e.is_summary:
                previous = e.content
            elif e.id <= begin.upto:
                todo.append(Entry(e.id, e.role, e.content, e.ts))
        if not todo:
            return None
        try:
            text = self._call_llm(previous, todo)
        except Exception as err:
            # Nothing is lost: the messages are still there. The lease runs
            # out; then this worker (or another) tries again.
            self.stats["llm_failures"] += 1
            log.warning("summarizing %s failed (%s); retrying after the lease", key, err)
            self._look_again(key, begin.lease_expires)
            return None
        try:
            result = self.mem.summarize(key, begin.upto, text, lease=begin.lease)
        except redis.ResponseError as err:
            # LEASED: this worker was too slow, its lease expired and another
            # took over. Otherwise the session changed under the summary
            # (trimmed, replaced): the next threshold event starts again.
            self.stats["refused"] += 1
            log.warning("MEM.SUMMARIZE %s %s refused: %s", key, begin.upto, err)
            return None
        self.stats["committed"] += 1
        log.info("summarized %s up to id %s (%d messages)", key, begin.upto, len(todo))
        return SummaryDone(key, begin.upto, len(todo), result.messages, result.total_tokens)

    def run(
        self,
        max_events: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> List[SummaryDone]:
        """Handles mem.threshold events (and the sessions queued to look at
        again) until `max_events` events were handled, `timeout` seconds
        passed, or stop() was called."""
        if self.configure:
            ensure_notifications(self.redis)
        deadline = None if timeout is None else time.monotonic() + timeout
        done: List[SummaryDone] = []
        handled = 0
        pubsub = self.redis.pubsub()

        def handle(key: str) -> None:
            try:
                res = self.run_once(key)
            except Exception:  # keep serving other sessions
                log.exception("summarizing %s failed", key)
                return
            if res is not None:
                done.append(res)

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
                if max_events is not None and handled >= max_events and not self._later:
                    break
                for key in self._due():
                    handle(key)
                wait = 1.0
                due_in = self._next_due_in()
                if due_in is not None:
                    wait = min(wait, due_in)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, left)
                msg = pubsub.get_message(timeout=wait)
                if not msg or _text(msg.get("type")) != "message":
                    continue
                handled += 1
                handle(_text(msg["data"]))
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
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS,
                   help="how long a session is this worker's once it starts on it")
    p.add_argument("--max-events", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, help="seconds to run")
    p.add_argument("--once", metavar="KEY", help="summarize one session and exit")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    worker = SummarizerWorker(redis.Redis.from_url(a.url), keep=a.keep, lease_ms=a.lease_ms)
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
