"""redis-mem-summarizer: the service that summarizes sessions, run next to Redis.

The module publishes a keyspace notification `mem.threshold` (module class,
flag `d`) when an append makes a session meet its summarization threshold
(which sits `mem.summarize-headroom` below the caps, so there is time to
act before they evict anything). The service:

* subscribes to `__keyevent@<db>__:mem.threshold` on the server, or with
  `--cluster` on every master (keyspace events are node-local), and
  resubscribes after a connection loss;
* sweeps every `--sweep-interval` seconds with `SCAN ... TYPE redis-mem` on
  each master for sessions over their threshold (MEM.SUMMARIZE_CHECK), in
  case an event was missed (the service was down, a reconnect, a failover);
* per session: MEM.SUMMARIZE_BEGIN (a lease: of several services hearing the
  same event one makes the LLM call), MEM.GET, the summary (an
  OpenAI-compatible endpoint, any LangChain chat model, or, only with
  --extractive, offline extractive), MEM.SUMMARIZE ... LEASE; tool calls are
  shown to the LLM with their name and arguments. Messages appended
  meanwhile are kept; `--concurrency N` sessions at once;
* retries a failed LLM call with exponential backoff while its lease lasts,
  then looks at the session again after the lease (nothing is lost: the
  messages stay in the session);
* stops cleanly on SIGTERM/SIGINT (the summary in progress is finished);
* logs one line per summary: key, messages folded, latency, tokens.

Usage:
    redis-mem-summarizer [--url redis://localhost:6379/0] [--cluster] [--keep 10]
        [--lease-ms 120000] [--sweep-interval 60] [--once KEY]
        [--concurrency 4] [--openai-base-url URL --openai-model NAME |
         --langchain-model provider:model | --extractive]
With no LLM configured it refuses to start (exit 2) unless --extractive asks
for the offline extractive summary, which keeps only the first sentence of
each message.
Environment: REDIS_URL, OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL
(default gpt-4o-mini), OPENAI_TIMEOUT (seconds, default 60).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import redis

from ._replies import _text
from .client import RedisMemClient
from .summarizing import (  # noqa: F401  (re-exported: the service's API)
    NO_LLM,
    SYSTEM_PROMPT,
    Entry,
    NoSummarizer,
    SummarizeFn,
    Summary,
    checked_summary,
    default_summarizer,
    extractive_summarize,
    langchain_summarizer,
    openai_summarizer,
)

log = logging.getLogger("redis_mem.summarizer")

EVENT = "mem.threshold"
#: The module's data type name, for SCAN ... TYPE.
SESSION_TYPE = "redis-mem"
#: Default lease: long enough for a slow LLM call, short enough that a dead
#: worker's sessions are picked up again within minutes.
DEFAULT_LEASE_MS = 120_000


@dataclass(frozen=True)
class SummaryDone:
    key: str
    upto: int
    summarized: int  # messages folded into the summary
    messages: int  # left in the session afterwards
    total_tokens: int  # of the session afterwards
    tokens_before: int = 0  # of the session before
    summary_tokens: int = 0
    latency_ms: int = 0  # MEM.SUMMARIZE_BEGIN to MEM.SUMMARIZE, LLM call included
    llm_prompt_tokens: Optional[int] = None
    llm_completion_tokens: Optional[int] = None


class LLMTimeout(Exception):
    """The summarize function did not answer within `llm_timeout`."""


def ensure_notifications(r: "redis.Redis") -> str:
    """Makes sure `notify-keyspace-events` has `d` (module events) and `E`
    (keyevent channels, which the service listens on), keeping the flags
    already set. Returns the value in force."""
    reply = r.config_get("notify-keyspace-events") or {}
    current = _text(next(iter(reply.values()), b"")) or ""
    flags = current
    if "d" not in flags and "A" not in flags:  # A = "g$lshzxetd", includes d
        flags += "d"
    if "E" not in flags:
        flags += "E"
    if flags != current:
        r.config_set("notify-keyspace-events", flags)
    return flags


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


class SummarizerWorker:
    """``client``: a ``redis.Redis``, or a ``redis.cluster.RedisCluster``
    (then every master is listened to and swept). ``lease_ms``: how long a
    session is this worker's once granted. ``llm_timeout`` (seconds, default
    3/4 of the lease): a summarize call taking longer is abandoned.
    ``llm_retries``: further attempts after a failed call, ``backoff`` seconds
    apart, doubling, while the lease leaves time. ``sweep_interval``: seconds
    between SCAN sweeps in :meth:`run`, the first at its start (0, the
    default here: none; the console script sweeps every 60 s).
    ``concurrency``: sessions summarized at once (LLM calls in parallel; one
    session is never handled twice at a time). ``summarize_fn`` None: an
    OpenAI-compatible endpoint from the environment, else
    :class:`NoSummarizer` is raised unless ``allow_extractive``."""

    def __init__(
        self,
        client: Any,
        summarize_fn: Optional[SummarizeFn] = None,
        keep: Optional[int] = None,
        db: Optional[int] = None,
        configure: bool = True,
        lease_ms: int = DEFAULT_LEASE_MS,
        llm_timeout: Optional[float] = None,
        retry_jitter: float = 0.05,
        llm_retries: int = 2,
        backoff: float = 1.0,
        sweep_interval: float = 0.0,
        concurrency: int = 1,
        allow_extractive: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.redis = client
        self.mem = RedisMemClient(client)
        self.summarize_fn = summarize_fn or default_summarizer(allow_extractive)
        self.concurrency = int(concurrency)
        self._lock = threading.RLock()
        self._inflight: Set[str] = set()
        self.keep = keep
        if db is None:
            db = 0 if _is_cluster(client) else client.connection_pool.connection_kwargs.get("db", 0)
        self.db = db
        self.configure = configure
        self.lease_ms = int(lease_ms)
        self.llm_timeout = self.lease_ms * 0.75 / 1000 if llm_timeout is None else llm_timeout
        self.retry_jitter = retry_jitter
        self.llm_retries = int(llm_retries)
        self.backoff = float(backoff)
        self.sweep_interval = float(sweep_interval)
        #: Set once every subscription is live (tests wait on it).
        self.ready = threading.Event()
        self._stop = threading.Event()
        #: Sessions to look at again: a heap of (monotonic time, key), and the
        #: keys in it (each once, however many events came meanwhile).
        self._later: List[Tuple[float, str]] = []
        self._queued: Set[str] = set()
        self._events: "queue.Queue[str]" = queue.Queue()
        #: What happened, for monitoring.
        self.stats = {"llm_calls": 0, "llm_failures": 0, "committed": 0, "refused": 0, "busy": 0,
                      "sweeps": 0, "swept_due": 0, "reconnects": 0}

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    @property
    def channel(self) -> str:
        """The keyevent channel of mem.threshold in this worker's database."""
        return f"__keyevent@{self.db}__:{EVENT}"

    def stop(self) -> None:
        """Asks :meth:`run` to return after the summary in progress."""
        self._stop.set()

    def nodes(self) -> List["redis.Redis"]:
        """A plain client per master (one for a plain server)."""
        if not _is_cluster(self.redis):
            return [self.redis]
        kw = self.redis.get_connection_kwargs() if hasattr(self.redis, "get_connection_kwargs") else {}
        keep = {k: v for k, v in kw.items() if k in ("username", "password", "ssl", "socket_timeout")}
        return [redis.Redis(host=n.host, port=n.port, **keep) for n in self.redis.get_primaries()]

    # -- one session ---------------------------------------------------------

    def _look_again(self, key: str, lease_expires_ms: int, extra: float = 0.0) -> None:
        """Queues `key` for when the lease that expires at `lease_expires_ms`
        (server clock, Unix ms) has run out."""
        with self._lock:
            if key in self._queued:
                return
            wait = max(0.0, lease_expires_ms / 1000 - time.time())
            wait = min(wait, self.lease_ms / 1000) + self.retry_jitter + extra
            heapq.heappush(self._later, (time.monotonic() + wait, key))
            self._queued.add(key)

    def _due(self) -> List[str]:
        now = time.monotonic()
        keys = []
        with self._lock:
            while self._later and self._later[0][0] <= now:
                key = heapq.heappop(self._later)[1]
                self._queued.discard(key)
                keys.append(key)
        return keys

    def _call_once(self, previous: Optional[str], todo: Sequence[Entry], timeout: float) -> str:
        self._count("llm_calls")
        out: Dict[str, Any] = {}

        def call() -> None:
            try:
                out["text"] = self.summarize_fn(previous, todo)
            except BaseException as e:  # handed to the caller below
                out["error"] = e

        # A daemon thread: a call that does not answer in time is abandoned
        # (whatever it returns later is dropped).
        t = threading.Thread(target=call, daemon=True, name="summarize-llm")
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise LLMTimeout(f"no summary within {timeout:.1f} s")
        if "error" in out:
            raise out["error"]
        return checked_summary(out["text"])

    def _call_llm(self, previous: Optional[str], todo: Sequence[Entry]) -> str:
        """The summarize function, bounded by `llm_timeout` overall, retried
        with exponential backoff after a failure while time is left."""
        deadline = time.monotonic() + self.llm_timeout
        delay = self.backoff
        for attempt in range(self.llm_retries + 1):
            left = deadline - time.monotonic()
            try:
                return self._call_once(previous, todo, max(0.0, left))
            except LLMTimeout:
                raise
            except Exception as err:
                if attempt == self.llm_retries or time.monotonic() + delay >= deadline:
                    raise
                log.warning("summary call failed (%s); retrying in %.1f s", err, delay)
                if self._stop.wait(delay):
                    raise
                delay *= 2
        raise AssertionError("unreachable")

    def run_once(self, key: str) -> Optional[SummaryDone]:
        """Summarizes `key` if it is due and this worker gets its lease; None
        otherwise (nothing to do, another worker holds it, or the LLM call
        failed: then the session is looked at again when the lease expires)."""
        started = time.monotonic()
        begin = self.mem.summarize_begin(key, self.lease_ms, keep=self.keep)
        if not begin.lease:
            if begin.lease_expires and begin.summarize and begin.upto:
                # Another worker is on it; should it fail, take over.
                self._count("busy")
                self._look_again(key, begin.lease_expires)
            return None
        previous, todo = None, []
        for e in self.mem.get(key):
            if e.is_summary:
                previous = e.content
            elif e.id <= begin.upto:
                todo.append(Entry(e.id, e.role, e.content, e.ts, e.meta))
        if not todo:
            return None
        try:
            text = self._call_llm(previous, todo)
        except Exception as err:
            # Nothing is lost: the messages are still there. The lease runs
            # out; then this worker (or another) tries again.
            self._count("llm_failures")
            log.warning("summarizing %s failed (%s); retrying after the lease", key, err)
            self._look_again(key, begin.lease_expires, extra=self.backoff)
            return None
        try:
            result = self.mem.summarize(key, begin.upto, text, lease=begin.lease)
        except redis.ResponseError as err:
            # LEASED: this worker was too slow and another took over, or the
            # key was deleted or replaced meanwhile (the lease is not the
            # session's); or the session changed under the summary (trimmed).
            # The session may still be due: looked at again after the lease.
            self._count("refused")
            log.warning("MEM.SUMMARIZE %s %s refused: %s", key, begin.upto, err)
            if str(err).startswith("LEASED"):
                self._look_again(key, begin.lease_expires)
            return None
        self._count("committed")
        done = SummaryDone(
            key, begin.upto, len(todo), result.messages, result.total_tokens,
            tokens_before=begin.total_tokens, summary_tokens=result.tokens,
            latency_ms=int((time.monotonic() - started) * 1000),
            llm_prompt_tokens=getattr(text, "prompt_tokens", None),
            llm_completion_tokens=getattr(text, "completion_tokens", None),
        )
        llm = ""
        if done.llm_prompt_tokens is not None or done.llm_completion_tokens is not None:
            llm = f" llm_tokens={done.llm_prompt_tokens}+{done.llm_completion_tokens}"
        log.info("summarized key=%s upto=%d messages=%d latency_ms=%d tokens=%d->%d summary_tokens=%d%s",
                 key, done.upto, done.summarized, done.latency_ms, done.tokens_before, done.total_tokens,
                 done.summary_tokens, llm)
        return done

    # -- finding sessions ------------------------------------------------------

    def sweep(self) -> List[str]:
        """The sessions over their threshold, found by SCAN TYPE on every
        master (read-only: MEM.SUMMARIZE_CHECK)."""
        due = []
        for node in self.nodes():
            for key in node.scan_iter(count=1000, _type=SESSION_TYPE):
                key = _text(key)
                try:
                    if self.mem.summarize_check(key, keep=self.keep).summarize:
                        due.append(key)
                except redis.ResponseError:
                    continue  # gone or changed type meanwhile
        self._count("sweeps")
        self._count("swept_due", len(due))
        return due

    def _listen(self, node: "redis.Redis", subscribed: threading.Event) -> None:
        """One master's events onto the queue, resubscribing (with backoff)
        after a connection loss; a reconnect triggers a sweep."""
        delay = self.backoff
        first = True
        while not self._stop.is_set():
            pubsub = node.pubsub()
            try:
                if self.configure:
                    ensure_notifications(node)
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.5)
                    if not msg:
                        continue
                    kind = _text(msg.get("type"))
                    if kind == "subscribe":
                        subscribed.set()
                        delay = self.backoff
                        if not first:
                            self._events.put("")  # "" = sweep now: events may have been missed
                        first = False
                    elif kind == "message":
                        self._events.put(_text(msg["data"]))
            except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
                self._count("reconnects")
                log.warning("lost %s (%s); reconnecting in %.1f s", node, err, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
            finally:
                try:
                    pubsub.close()
                except Exception:
                    pass

    def run(self, max_events: Optional[int] = None, timeout: Optional[float] = None,
            collect: bool = True) -> List[SummaryDone]:
        """Handles mem.threshold events, sweeps and the sessions queued to look
        at again until `max_events` events were handled, `timeout` seconds
        passed, or stop() was called (SIGTERM in the console script).
        Returns the summaries made (none kept with ``collect=False``, as a
        long-running service wants: each is logged)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done: List[SummaryDone] = []
        handled = 0
        listeners = []
        for node in self.nodes():
            ev = threading.Event()
            t = threading.Thread(target=self._listen, args=(node, ev), daemon=True, name="summarizer-listen")
            t.start()
            listeners.append((t, ev))

        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="summarizer") if self.concurrency > 1 else None
        futures: List["Future[None]"] = []

        def work(key: str) -> None:
            try:
                res = self.run_once(key)
            except Exception:  # keep serving other sessions
                log.exception("summarizing %s failed", key)
                return
            finally:
                with self._lock:
                    self._inflight.discard(key)
            if res is not None and collect:
                done.append(res)

        def handle(key: str) -> None:
            with self._lock:
                if key in self._inflight:
                    return  # being summarized right now: that pass covers it
                self._inflight.add(key)
            if pool is None:
                work(key)
            else:
                futures[:] = [f for f in futures if not f.done()]
                futures.append(pool.submit(work, key))

        try:
            while not all(ev.is_set() for _, ev in listeners):
                if self._stop.wait(0.05) or (deadline is not None and time.monotonic() > deadline):
                    return done
            self.ready.set()
            # The first sweep at once: events sent while no service ran are lost.
            next_sweep = time.monotonic() if self.sweep_interval > 0 else None
            while not self._stop.is_set():
                if max_events is not None and handled >= max_events and not self._later:
                    break
                for key in self._due():
                    handle(key)
                if next_sweep is not None and time.monotonic() >= next_sweep:
                    for key in self.sweep():
                        handle(key)
                    next_sweep = time.monotonic() + self.sweep_interval
                wait = 0.5
                if self._later:
                    wait = min(wait, max(0.0, self._later[0][0] - time.monotonic()))
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, left)
                try:
                    key = self._events.get(timeout=wait)
                except queue.Empty:
                    continue
                if key == "":
                    next_sweep = time.monotonic()
                    continue
                handled += 1
                handle(key)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)  # the summaries in progress are finished
            self._stop.set()
            for t, _ in listeners:
                t.join(5)
            self._stop.clear()
        return done


def run_once(key: str, client: Optional["redis.Redis"] = None, **kwargs: Any) -> Optional[SummaryDone]:
    """Module-level shortcut: one summarization pass on `key`."""
    client = client or redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return SummarizerWorker(client, **kwargs).run_once(key)


def run(client: Optional["redis.Redis"] = None, max_events: Optional[int] = None,
        timeout: Optional[float] = None, **kwargs: Any) -> List[SummaryDone]:
    """Module-level shortcut: the event loop (bounded by max_events/timeout)."""
    client = client or redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    return SummarizerWorker(client, **kwargs).run(max_events=max_events, timeout=timeout)


def _summarizer_from_args(a: argparse.Namespace) -> SummarizeFn:
    if a.langchain_model:
        try:
            from langchain.chat_models import init_chat_model
        except ImportError as e:
            raise NoSummarizer("--langchain-model needs LangChain: pip install 'redis-mem[langchain]' "
                               f"(and the provider's package, e.g. langchain-openai): {e}") from e
        return langchain_summarizer(init_chat_model(a.langchain_model))
    if a.openai_base_url or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return openai_summarizer(
            a.openai_base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1",
            os.environ.get("OPENAI_API_KEY"),
            model=a.openai_model or os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
            timeout=float(os.environ.get("OPENAI_TIMEOUT", "60")),
        )
    if a.extractive:
        log.warning("--extractive: OFFLINE EXTRACTIVE summaries (the first sentence of each message; the rest "
                    "of what they fold in is lost)")
        return extractive_summarize
    raise NoSummarizer(NO_LLM)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``redis-mem-summarizer`` console script."""
    p = argparse.ArgumentParser(prog="redis-mem-summarizer", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    p.add_argument("--cluster", action="store_true", help="the URL is a cluster node: serve every master")
    p.add_argument("--keep", type=int, default=None, help="messages left out of the summary")
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS,
                   help="how long a session is this worker's once it starts on it")
    p.add_argument("--sweep-interval", type=float, default=60.0, help="seconds between SCAN sweeps (0: none)")
    p.add_argument("--llm-retries", type=int, default=2)
    p.add_argument("--openai-base-url", default=None)
    p.add_argument("--openai-model", default=None)
    p.add_argument("--langchain-model", default=None, help="e.g. openai:gpt-4o-mini (init_chat_model)")
    p.add_argument("--concurrency", type=int, default=4, help="sessions summarized at once (default 4)")
    p.add_argument("--extractive", action="store_true",
                   help="without an LLM, use offline extractive summaries (lossy: never used unasked)")
    p.add_argument("--max-events", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, help="seconds to run")
    p.add_argument("--once", metavar="KEY", help="summarize one session and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings only (no line per summary)")
    p.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)  # the default now
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if a.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    if a.cluster:
        from redis.cluster import RedisCluster

        client: Any = RedisCluster.from_url(a.url)
    else:
        client = redis.Redis.from_url(a.url)
    if a.concurrency < 1:
        p.error("--concurrency must be at least 1")
    try:
        fn = _summarizer_from_args(a)
    except NoSummarizer as e:
        print(f"redis-mem-summarizer: error: {e}", file=sys.stderr)
        return 2
    worker = SummarizerWorker(client, summarize_fn=fn, keep=a.keep, lease_ms=a.lease_ms,
                              llm_retries=a.llm_retries, sweep_interval=a.sweep_interval,
                              concurrency=a.concurrency)
    if a.once:
        try:
            res = worker.run_once(a.once)
        except redis.RedisError as e:  # WRONGTYPE (not a session), connection refused, ...
            print(f"redis-mem-summarizer: {a.once}: {e}", file=sys.stderr)
            return 2
        print(json.dumps(asdict(res) if res else None))
        return 0

    def on_signal(signum: int, _frame: Any) -> None:
        log.warning("signal %d: stopping after the summary in progress", signum)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    bounded = a.max_events is not None or a.timeout is not None
    for res in worker.run(max_events=a.max_events, timeout=a.timeout, collect=bounded):
        print(json.dumps(asdict(res)), flush=True)
    log.warning("stopped: %s", json.dumps(worker.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
