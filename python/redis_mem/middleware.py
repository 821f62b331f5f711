"""The redis-mem session as the memory of a LangChain 1.x agent.

    from langchain.agents import create_agent
    from redis_mem.middleware import RedisMemMiddleware

    memory = RedisMemMiddleware(redis.Redis(), budget=8000, model="gpt-4o")
    agent = create_agent(model, tools, middleware=[memory])
    agent.invoke({"messages": [HumanMessage("hi")]},
                 config={"configurable": {"thread_id": "alice"}})

What it does, per agent step (no checkpointer needed: the session is the
memory; with one, the checkpoint stays as small as the context):

* The session key comes from the LangGraph ``thread_id``
  (``key_template % thread_id``, default ``mem:{<thread_id>}``).
* ``before_model``: the messages of the state not stored yet (the user's
  input, or an AI message with tool calls together with their results) go
  in ONE ``MEM.APPENDBATCH`` (atomic, so another writer never lands between
  a call and its results; no MULTI), each with its message id as MSGID, so
  a retried step stores nothing twice. Then ``MEM.GET BUDGET`` gives the
  summary plus the newest messages that fit ``budget`` tokens, never a tool
  result without its call, and that context replaces the state's messages
  (as LangChain's SummarizationMiddleware replaces them with its summary).
* ``after_model``: a final AI answer (no tool calls) is appended at once; an
  AI message with tool calls waits for its results (next ``before_model``).
* When an append says ``summarize``: with ``summary_model`` (any LangChain
  chat model) the summary is made inline under a lease (MEM.SUMMARIZE_BEGIN
  / MEM.SUMMARIZE ... LEASE); without, it is left to ``redis-mem-summarizer``.
* Memory types (the seed's): ``memory="summarize"`` (summarize at the limit,
  the default) and ``memory="none"`` (no memory: the hooks do nothing).
* Redis unreachable: ``on_unavailable="local"`` (default) keeps working the
  way the old stack did, on process-local memory, with a loud warning
  (continuity is lost on restart; what was kept locally is written to the
  session once Redis answers again); ``"fail"`` raises
  :class:`RedisMemUnavailable`.

Sync and async hooks: ``agent.invoke`` and ``agent.ainvoke`` both work
(the async ones use a ``redis.asyncio`` client when given one, else run the
sync calls in a thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import redis
import redis.asyncio

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("redis_mem.middleware needs LangChain 1.x: pip install 'redis-mem[langchain]'") from e
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from typing_extensions import Annotated, NotRequired

from ._replies import AppendResult, Message
from .client import AsyncRedisMemClient, RedisMemClient
from .messages import message_from_mem, message_to_mem, msgid_of
from .summarizing import SUMMARY_PROMPT, summary_prompt

__all__ = ["RedisMemMiddleware", "RedisMemState", "RedisMemUnavailable", "summary_message"]

log = logging.getLogger("redis_mem.middleware")

#: What Redis being down looks like to redis-py.
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)

#: additional_kwargs marker of the summary message (LangChain's own middleware
#: marks its summary with lc_source "summarization" too).
SUMMARY_SOURCE = "summarization"


class RedisMemUnavailable(RuntimeError):
    """Redis could not be reached and ``on_unavailable="fail"``."""


class RedisMemState(AgentState):
    """The agent state plus the ids of the messages already in the session
    (private: not part of the agent's input or output)."""

    redis_mem_synced: NotRequired[Annotated[List[str], PrivateStateAttr]]


def summary_message(entry: Message) -> HumanMessage:
    """The session summary as the model sees it (LangChain's wording)."""
    return HumanMessage(
        content=f"Here is a summary of the conversation to date:\n\n{entry.content}",
        id=f"redis-mem-summary-{entry.id}",
        additional_kwargs={"lc_source": SUMMARY_SOURCE, "redis_mem": {"summary_upto": entry.id}},
    )


def _is_summary(m: BaseMessage) -> bool:
    return isinstance(m, HumanMessage) and m.additional_kwargs.get("lc_source") == SUMMARY_SOURCE


def _approx_tokens(m: BaseMessage) -> int:
    # Local memory only (Redis down): about 4 characters a token.
    return 3 + len(str(m.content)) // 4


class _LocalMemory:
    """Process-local memory while Redis is unreachable: per session, the last
    context loaded from Redis plus what came since, and the messages Redis
    has not got yet (written first when it answers again). At most
    ``max_sessions`` sessions are kept (least recently used go first), so a
    long-running process serving many threads stays bounded."""

    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self.context: "OrderedDict[str, List[BaseMessage]]" = OrderedDict()
        self.pending: Dict[str, List[BaseMessage]] = {}

    def keep(self, key: str, context: List[BaseMessage]) -> None:
        self.context[key] = list(context)
        self.context.move_to_end(key)
        while len(self.context) > self.max_sessions:
            old, _ = self.context.popitem(last=False)
            if self.pending.get(old):
                log.error("redis-mem: local memory full: %d messages of %s never reached Redis",
                          len(self.pending[old]), old)
            self.pending.pop(old, None)

    def add(self, key: str, msgs: Sequence[BaseMessage]) -> None:
        ctx = self.context.get(key, [])
        known = {m.id for m in ctx}
        pend = self.pending.setdefault(key, [])
        for m in msgs:
            if m.id not in known:
                ctx.append(m)
                pend.append(m)
                known.add(m.id)
        self.keep(key, ctx)

    def load(self, key: str, budget: int) -> List[BaseMessage]:
        ctx = self.context.get(key, [])
        head = [m for m in ctx[:1] if _is_summary(m)]
        rest = ctx[len(head):]
        used = sum(_approx_tokens(m) for m in head)
        start = len(rest)
        while start > 0 and used + _approx_tokens(rest[start - 1]) <= budget:
            start -= 1
            used += _approx_tokens(rest[start])
        while start < len(rest) and isinstance(rest[start], ToolMessage):
            start += 1  # never a tool result without its call
        return head + rest[start:]


class RedisMemMiddleware(AgentMiddleware):
    """Agent middleware keeping the conversation in a redis-mem session.

    ``client``: a ``redis.Redis`` and/or ``async_client``: a
    ``redis.asyncio.Redis`` (or ``url`` to make both). ``budget``: tokens of
    context the model is given (summary included). ``key_template``: the
    session key of a thread (``%s`` is the thread id), or ``session_key``, a
    function of the thread id. ``model``, ``ttl``, ``maxtokens``,
    ``maxmsgs``, ``maxage``: session settings sent with each append (None:
    the session's own / the module's defaults). ``summary_model``: a
    LangChain chat model that summarizes inline (else the summarizer
    service does); ``keep``, ``lease_ms``: for that summary.
    ``on_unavailable``: ``"local"`` or ``"fail"`` when Redis cannot be
    reached; ``retry_interval``: seconds before Redis is tried again;
    ``local_sessions``: sessions the local memory keeps at most.
    """

    state_schema = RedisMemState

    def __init__(
        self,
        client: Optional["redis.Redis"] = None,
        *,
        async_client: Optional["redis.asyncio.Redis"] = None,
        url: Optional[str] = None,
        memory: str = "summarize",
        budget: int = 8000,
        key_template: str = "mem:{%s}",
        session_key: Optional[Callable[[str], str]] = None,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
        summary_model: Any = None,
        summary_prompt: str = SUMMARY_PROMPT,
        keep: Optional[int] = None,
        lease_ms: int = 120_000,
        on_unavailable: str = "local",
        retry_interval: float = 5.0,
        local_sessions: int = 1000,
    ):
        super().__init__()
        memory = {"summarize_at_limit": "summarize", "summarize at limit": "summarize"}.get(memory, memory)
        if memory not in ("summarize", "none"):
            raise ValueError('memory must be "summarize" (summarize at the limit) or "none"')
        if on_unavailable not in ("local", "fail"):
            raise ValueError('on_unavailable must be "local" or "fail"')
        if url is not None:
            client = client or redis.Redis.from_url(url)
            async_client = async_client or redis.asyncio.Redis.from_url(url)
        if memory != "none" and client is None and async_client is None:
            raise ValueError("give client=redis.Redis(...), async_client=redis.asyncio.Redis(...) or url=...")
        self.mem = RedisMemClient(client) if client is not None else None
        self.amem = AsyncRedisMemClient(async_client) if async_client is not None else None
        self.memory = memory
        self.budget = int(budget)
        self.key_template = key_template
        self.session_key = session_key
        self.settings = dict(model=model, ttl=ttl, maxtokens=maxtokens, maxmsgs=maxmsgs, maxage=maxage)
        self.summary_model = summary_model
        self.summary_prompt = summary_prompt
        self.keep = keep
        self.lease_ms = int(lease_ms)
        self.on_unavailable = on_unavailable
        #: While Redis is down, it is tried again at most this often (seconds),
        #: so a step does not wait for a dead server every time.
        self.retry_interval = float(retry_interval)
        self._skip_until = 0.0
        self.local = _LocalMemory(local_sessions)
        #: Sessions served from local memory right now (Redis was down).
        self.degraded: set = set()
        #: Appends made (replies), summaries committed: for tests and metrics.
        self.stats = {"batches": 0, "duplicates": 0, "summaries": 0, "local": 0}

    # -- keys, messages --------------------------------------------------------

    def key_for(self, thread_id: str) -> str:
        return self.session_key(thread_id) if self.session_key else self.key_template % thread_id

    def _key(self) -> str:
        try:
            thread_id = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            thread_id = None
        if not thread_id:
            raise ValueError(
                "RedisMemMiddleware needs a thread id: invoke the agent with "
                'config={"configurable": {"thread_id": "<session id>"}}'
            )
        return self.key_for(str(thread_id))

    @staticmethod
    def _unsynced(state: Dict[str, Any]) -> List[BaseMessage]:
        """Messages of the state not in the session yet."""
        synced = set(state.get("redis_mem_synced") or [])
        return [m for m in state["messages"] if m.id not in synced and not _is_summary(m)]

    @staticmethod
    def _waits(new: List[BaseMessage], final: bool) -> bool:
        # An AI message with tool calls is stored with its results (one batch),
        # so no reader ever sees calls without results, or results first.
        return not final and isinstance(new[-1], AIMessage) and bool(new[-1].tool_calls)

    def _items(self, msgs: Sequence[BaseMessage]) -> List[Dict[str, Any]]:
        items = []
        for m in msgs:
            role, content, meta = message_to_mem(m)
            items.append({"role": role, "content": content, "meta": meta, "msgid": msgid_of(m)})
        return items

    def _context(self, key: str, entries: List[Message]) -> List[BaseMessage]:
        out: List[BaseMessage] = []
        for e in entries:
            if e.is_summary:
                out.append(summary_message(e))
                continue
            m = message_from_mem(e)
            if not m.id:  # written by another client: a stable id all the same
                m.id = e.msgid or f"redis-mem-{key}-{e.id}"
            out.append(m)
        return out

    def _update(self, key: str, context: List[BaseMessage], state: Dict[str, Any]) -> Dict[str, Any]:
        # The context replaces the state's messages; a state message the
        # budget left out although it is the newest (one huge message) is kept.
        ids = {m.id for m in context}
        tail = []
        for m in reversed(state["messages"]):
            if m.id in ids or _is_summary(m):
                break
            tail.append(m)
        tail.reverse()
        if tail:
            log.warning("redis-mem: %s: the newest messages do not fit budget %d; sent as they are", key, self.budget)
        msgs = [*context, *tail]
        return {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *msgs],
            "redis_mem_synced": [m.id for m in msgs],
        }

    # -- unavailable Redis ------------------------------------------------------

    def _skipping(self) -> bool:
        return self.on_unavailable == "local" and time.monotonic() < self._skip_until

    def _down(self, key: str, err: Exception) -> None:
        self._skip_until = time.monotonic() + self.retry_interval
        if self.on_unavailable == "fail":
            raise RedisMemUnavailable(f"redis-mem: Redis unreachable for session {key}: {err}") from err
        if key not in self.degraded:
            self.degraded.add(key)
            text = (f"redis-mem: REDIS UNREACHABLE ({err}); session {key} continues on PROCESS-LOCAL memory: "
                    "not shared with other processes and LOST ON RESTART until Redis answers again")
            log.error(text)
            warnings.warn(text, RuntimeWarning, stacklevel=3)
        self.stats["local"] += 1

    def _up(self, key: str) -> None:
        if key in self.degraded:
            self.degraded.discard(key)
            log.warning("redis-mem: Redis reachable again; session %s is back in Redis", key)

    def _with_pending(self, key: str, msgs: Sequence[BaseMessage]) -> List[BaseMessage]:
        pend = self.local.pending.get(key, [])
        seen = {m.id for m in pend}
        return [*pend, *(m for m in msgs if m.id not in seen)]

    def _stored(self, key: str, results: List[AppendResult]) -> bool:
        self.local.pending.pop(key, None)
        self.stats["batches"] += 1
        self.stats["duplicates"] += sum(r.duplicate for r in results)
        return any(r.summarize for r in results)

    # -- sync ----------------------------------------------------------------

    def _sync_mem(self) -> RedisMemClient:
        if self.mem is None:
            raise ValueError("the sync hooks (agent.invoke) need client=redis.Redis(...) or url=...")
        return self.mem

    def _store(self, key: str, msgs: Sequence[BaseMessage]) -> None:
        msgs = self._with_pending(key, msgs)
        if not msgs:
            return
        if self._skipping():
            self.local.add(key, msgs)
            return
        try:
            results = self._sync_mem().append_batch(key, self._items(msgs), **self.settings)
        except UNAVAILABLE as err:
            self._down(key, err)
            self.local.add(key, msgs)
            return
        self._up(key)
        self.local.add(key, msgs)
        self.local.pending.pop(key, None)
        if self._stored(key, results) and self.summary_model is not None:
            self._summarize(key)

    def _load(self, key: str) -> List[BaseMessage]:
        if self._skipping():
            return self.local.load(key, self.budget)
        try:
            entries = self._sync_mem().get(key, budget=self.budget)
        except UNAVAILABLE as err:
            self._down(key, err)
            return self.local.load(key, self.budget)
        context = self._context(key, entries)
        self.local.keep(key, context)
        return context

    def _summarize(self, key: str) -> None:
        mem = self._sync_mem()
        begin = mem.summarize_begin(key, self.lease_ms, keep=self.keep)
        if not begin.lease:
            return  # not due, or another worker holds the session
        started = time.monotonic()
        try:
            entries = mem.get(key)
            prompt = summary_prompt(entries, begin.upto, self.summary_prompt)
            text = self.summary_model.invoke(prompt).text
            result = mem.summarize(key, begin.upto, text.strip(), lease=begin.lease)
        except Exception as err:  # the lease runs out; the service or a later step retries
            log.warning("redis-mem: inline summary of %s failed: %s", key, err)
            return
        self.stats["summaries"] += 1
        log.info("redis-mem: summarized %s up to %d in %.0f ms (%d tokens left)",
                 key, begin.upto, (time.monotonic() - started) * 1000, result.total_tokens)

    def before_model(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        if self.memory == "none":
            return None
        key = self._key()
        self._store(key, self._unsynced(state))
        return self._update(key, self._load(key), state)

    def after_model(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        return self._after(state, final=False)

    def after_agent(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        return self._after(state, final=True)

    def _after(self, state: Dict[str, Any], final: bool) -> Optional[Dict[str, Any]]:
        if self.memory == "none":
            return None
        new = self._unsynced(state)
        if not new or self._waits(new, final):
            return None
        key = self._key()
        self._store(key, new)
        return {"redis_mem_synced": [*(state.get("redis_mem_synced") or []), *(m.id for m in new)]}

    # -- async ----------------------------------------------------------------

    async def _astore(self, key: str, msgs: Sequence[BaseMessage]) -> None:
        if self.amem is None:
            return await asyncio.to_thread(self._store, key, msgs)
        msgs = self._with_pending(key, msgs)
        if not msgs:
            return
        if self._skipping():
            self.local.add(key, msgs)
            return
        try:
            results = await self.amem.append_batch(key, self._items(msgs), **self.settings)
        except UNAVAILABLE as err:
            self._down(key, err)
            self.local.add(key, msgs)
            return
        self._up(key)
        self.local.add(key, msgs)
        self.local.pending.pop(key, None)
        if self._stored(key, results) and self.summary_model is not None:
            await self._asummarize(key)

    async def _aload(self, key: str) -> List[BaseMessage]:
        if self.amem is None:
            return await asyncio.to_thread(self._load, key)
        if self._skipping():
            return self.local.load(key, self.budget)
        try:
            entries = await self.amem.get(key, budget=self.budget)
        except UNAVAILABLE as err:
            self._down(key, err)
            return self.local.load(key, self.budget)
        context = self._context(key, entries)
        self.local.keep(key, context)
        return context

    async def _asummarize(self, key: str) -> None:
        mem = self.amem
        assert mem is not None
        begin = await mem.summarize_begin(key, self.lease_ms, keep=self.keep)
        if not begin.lease:
            return
        try:
            entries = await mem.get(key)
            prompt = summary_prompt(entries, begin.upto, self.summary_prompt)
            text = (await self.summary_model.ainvoke(prompt)).text
            await mem.summarize(key, begin.upto, text.strip(), lease=begin.lease)
        except Exception as err:
            log.warning("redis-mem: inline summary of %s failed: %s", key, err)
            return
        self.stats["summaries"] += 1

    async def abefore_model(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        if self.memory == "none":
            return None
        key = self._key()
        await self._astore(key, self._unsynced(state))
        return self._update(key, await self._aload(key), state)

    async def aafter_model(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        return await self._aafter(state, final=False)

    async def aafter_agent(self, state: Dict[str, Any], runtime: Any) -> Optional[Dict[str, Any]]:
        return await self._aafter(state, final=True)

    async def _aafter(self, state: Dict[str, Any], final: bool) -> Optional[Dict[str, Any]]:
        if self.memory == "none":
            return None
        new = self._unsynced(state)
        if not new or self._waits(new, final):
            return None
        key = self._key()
        await self._astore(key, new)
        return {"redis_mem_synced": [*(state.get("redis_mem_synced") or []), *(m.id for m in new)]}
