"""The redis-mem session as the memory of a LangChain 1.x agent.

    from langchain.agents import create_agent
    from redis_mem.middleware import RedisMemMiddleware

    memory = RedisMemMiddleware(redis.Redis(), budget=8000, model="gpt-4o")
    agent = create_agent(model, tools, middleware=[memory])
    agent.invoke({"messages": [HumanMessage("hi")]},
                 config={"configurable": {"thread_id": "alice"}})

What it does, per model call (no checkpointer needed: the session is the
memory):

* The session key comes from the LangGraph ``thread_id``
  (``key_template % thread_id``, default ``mem:{<thread_id>}``), or a fixed
  ``session_id``.
* ``wrap_model_call``: the messages of the state not stored yet (the
  user's input, or an AI message with tool calls together with their
  results) go in ``MEM.APPENDBATCH`` (atomic, so another writer never lands
  between a call and its results; no MULTI; at most 1000 messages a batch,
  split between tool groups), each with its message id as MSGID, so a
  retried step stores nothing twice. Then ``MEM.GET BUDGET`` gives the
  summary plus the newest messages that fit ``budget`` tokens, never a tool
  result without its call: that context is what the model is called with.
  The agent's state is not rewritten: streams (``stream_mode="messages"``
  or ``"values"``) show only this run's messages, never the stored history
  again, and no internal key.
* ``after_model`` / ``after_agent``: a final AI answer (no tool calls) is
  appended at once; an AI message with tool calls waits for its results.
* Counting what the model sees (the model: ``model=``, else the chat
  model's own name, else mem.default-model): an AI message of a model
  without a public tokenizer (Claude, Gemini, any model MEM.MODELS marks
  ``exact`` 0) is stored with ``TOKENS`` = its ``usage_metadata``
  output tokens (less reasoning tokens); exact models keep the module's
  count (``tokens_from_usage=`` decides instead). After each call the
  reported ``input_tokens`` is compared with the estimate (system prompt
  + tool schemas + the context's tokens): :attr:`usage_drift`, and a DEBUG
  log line. ``budget="auto"``: MEM.GET's budget is the context window
  (MEM.MODELS, or ``context_window=``) less the system prompt, the tool
  schemas (``convert_to_openai_tool`` JSON, MEM.COUNT) and
  ``reply_reserve`` (default: the model's ``max_tokens``, else 4096);
  :attr:`last_budget` says how it was made. A number is a fixed budget.
* Memory types (the seed's): ``memory="summarize"`` (summarize at the
  limit, the default) summarizes inline under a short lease
  (MEM.SUMMARIZE_BEGIN / MEM.SUMMARIZE ... LEASE) with ``summary_model``,
  else with the agent's own model; ``summary_service=True`` leaves it to
  ``redis-mem-summarizer``. A failed summary is retried by a later step
  once its lease (``lease_ms``, 15 s) ends. ``memory="window"``: no
  summary, the caps evict the oldest messages (the app's explicit choice).
  ``memory="none"``: no memory, the hooks do nothing. When a session is
  about to evict messages no summary covers and nothing can summarize
  them, one warning per session says so and how to fix it.
* Content the module would refuse never raises out of the agent: a
  message over ``mem.max-message-bytes`` (read once with CONFIG GET, or
  4 MB) is stored truncated with a marker (the model is given the full
  one while the state holds it), and so is one over ``max_message_tokens``
  (a quarter of the session's maxtokens: a larger one would evict the
  whole conversation), lone surrogates are replaced by U+FFFD (logged, and counted in META
  ``redis_mem_replaced_surrogates``),
  and a message the module still refuses is logged and left out.
* Message ids: each message's ``id`` is its MSGID. A message without one
  gets one derived from the run id, step and position, stable across a
  retried step; but an application that sends the same text again in a
  new run (after a provider error) without ``HumanMessage(id=...)`` stores
  it twice: give your input messages ids.
* Attributes: ``attributes=["user_profile", "context"]`` gives the model
  those session members (MEM.ATTRSET) in its system message, formatted by
  ``attributes_message`` (a function of the dict of present members).
* Redis unreachable: ``on_unavailable="local"`` (default) keeps working the
  way the old stack did, on process-local memory, with a loud warning
  (continuity is lost on restart). Once Redis answers again, every message
  the local memory holds that the session lacks is written, in order
  (MSGIDs make it idempotent). ``"fail"`` raises :class:`RedisMemUnavailable`.

Sync and async hooks: ``agent.invoke`` and ``agent.ainvoke`` both work
(the async ones use a ``redis.asyncio`` client when given one, else run the
sync calls in a thread); both run the same code (one core, two drivers).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import (
    Any,
    Awaitable,
    Callable,
    Container,
    Dict,
    List,
    Literal,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import redis
import redis.asyncio

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain.agents.middleware.types import ModelRequest, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.config import get_config
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "redis_mem.middleware needs LangChain 1.x and LangGraph: pip install 'redis-mem[langchain]'"
    ) from e

from ._drive import Core, Op, T
from ._drive import adrive as _adrive
from ._drive import drive as _drive
from ._replies import AppendResult, Message, ModelInfo, SummarizeBegin
from .client import AsyncRedisMemClient, RedisMemClient
from .messages import SUMMARY_SOURCE, message_from_mem, message_to_mem, msgid_of, summary_message
from .messages import clean_json as _clean_json
from .messages import clean_text as _clean_text
from .messages import lone_surrogates as _lone_surrogates
from .summarizing import SUMMARY_PROMPT, checked_summary, summary_prompt

__all__ = [
    "Budget",
    "BudgetBreakdown",
    "MemoryType",
    "OnUnavailable",
    "RedisMemMiddleware",
    "RedisMemState",
    "RedisMemUnavailable",
    "UsageDrift",
    "summary_message",
]

log = logging.getLogger("redis_mem.middleware")

#: What Redis being down looks like to redis-py.
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)

#: The memory types: summarize at the limit (default), a window the caps
#: evict (no summary), or no memory.
MemoryType = Literal["summarize", "window", "none"]
#: What to do while Redis cannot be reached.
OnUnavailable = Literal["local", "fail"]
#: The context budget: a fixed number of tokens, or ``"auto"``: the model's
#: context window minus the system prompt, the tool schemas and a reply reserve.
Budget = Union[int, Literal["auto"]]

#: mem.max-message-bytes when CONFIG GET is not allowed.
DEFAULT_MAX_MESSAGE_BYTES = 4194304
#: Messages in one MEM.APPENDBATCH at most (the module's limit).
MAX_BATCH = 1000
#: Marker appended to a truncated message ({kept} and {size} in bytes).
TRUNCATED_MARKER = "\n[redis-mem: truncated to {kept} of {size} bytes (over mem.max-message-bytes)]"
#: Marker appended to a message cut to ``max_message_tokens`` ({cap} tokens).
TOKEN_TRUNCATED_MARKER = "\n[redis-mem: truncated to {kept} of {size} bytes (over {cap} tokens a message)]"
#: mem.max-tokens when CONFIG GET is not allowed.
DEFAULT_MAX_TOKENS = 80_000
#: By default one stored message takes at most this share of the session's
#: token cap (1/4): a larger one would evict the whole conversation before it.
MESSAGE_TOKEN_SHARE = 4
#: The fixed budget (the default ``budget=``, and the auto budget's when the
#: model's context window is unknown).
DEFAULT_BUDGET = 8000
#: Tokens the auto budget leaves for the reply when the model sets no maximum.
DEFAULT_REPLY_RESERVE = 4096
#: Model settings / chat model attributes that hold the reply's maximum tokens.
MAX_OUTPUT_FIELDS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
#: Models whose tokenizer is not public (the module's count of their text is
#: an approximation, whatever the model table says): their replies are
#: stored with the provider's count.
NO_PUBLIC_TOKENIZER = re.compile(r"(^|[./:])(claude|gemini)", re.IGNORECASE)
#: Entries of the per-text token caches (system prompts, tool sets).
COUNT_CACHE_SIZE = 256




class RedisMemUnavailable(RuntimeError):
    """Redis could not be reached and ``on_unavailable="fail"``."""


class RedisMemState(AgentState):
    """The agent state (the middleware adds nothing to it: kept for code
    that names it)."""


@dataclass(frozen=True)
class UsageDrift:
    """For one model: the prompt tokens the provider reported
    (``usage_metadata["input_tokens"]``) against what the middleware
    estimated it sent (system prompt + tool schemas + the context's
    tokens as the session holds them). ``mean_ratio`` (reported /
    estimated, averaged over ``calls``) above 1: the provider counts more
    than the module (its own tokenizer, message framing the module does
    not see); an auto budget then leaves that much less room than planned."""

    calls: int
    last_estimated: int
    last_reported: int
    mean_ratio: float


@dataclass(frozen=True)
class BudgetBreakdown:
    """How an auto budget was computed: ``budget`` = ``context_window`` -
    ``system_tokens`` - ``tools_tokens`` - ``reply_reserve`` (at least 1)."""

    model: str
    context_window: int
    system_tokens: int
    tools_tokens: int
    reply_reserve: int
    budget: int


class _Loaded(NamedTuple):
    """What a model call is given: the context, the attributes, the tokens
    of each context message by id (MEM.GET's), the name of the model that
    sees it (None: served from local memory, nothing to estimate), and the
    budget the context was loaded with."""

    context: List[BaseMessage]
    attrs: Dict[str, Any]
    tokens: Dict[str, int]
    model: Optional[str]
    budget: int


class _ModelCall(NamedTuple):
    request: ModelRequest
    model: Optional[str]
    estimated: Optional[int]


def _chat_model_name(chat_model: Any) -> Optional[str]:
    """The model name a LangChain chat model calls (ChatOpenAI ``model_name``,
    ChatAnthropic / ChatGoogleGenerativeAI ``model``, Bedrock ``model_id``)."""
    for attr in ("model_name", "model", "model_id"):
        name = getattr(chat_model, attr, None)
        if isinstance(name, str) and name:
            return name.removeprefix("models/")  # Google's resource name
    return None


def _output_tokens(m: BaseMessage) -> Optional[int]:
    """The tokens of an AI message as the provider reported them: its
    ``output_tokens`` less reasoning tokens (the provider does not give
    those back to the model in later turns); None when not reported."""
    usage = m.usage_metadata if isinstance(m, AIMessage) else None
    if not usage:
        return None
    out = usage.get("output_tokens")
    if type(out) is not int or out < 0:
        return None
    reasoning = (usage.get("output_token_details") or {}).get("reasoning")
    return max(0, out - reasoning) if type(reasoning) is int else out


def _visible_bytes(item: Dict[str, Any]) -> int:
    """Bytes of what a reply gives the model back: its text and tool calls."""
    calls = (item.get("meta") or {}).get("tool_calls") or []
    text = item.get("content") or ""
    return len(text.encode("utf-8")) + (len(json.dumps(calls, ensure_ascii=False).encode("utf-8")) if calls else 0)


def _plausible_output_tokens(tokens: int, item: Dict[str, Any]) -> bool:
    """Whether a provider's output count can be that of the reply's visible
    text and calls: a token covers at least one byte (so at most the bytes,
    plus a few for the calls' framing) and rarely more than 64 (whitespace
    runs); a count beyond that holds what the model will not see again
    (thinking), or was summed over cumulative streamed chunks, and stored it
    would evict the conversation; 0 for a non-empty reply hides it from the
    caps and BUDGET."""
    visible = _visible_bytes(item)
    return visible // 64 <= tokens <= visible + 16 and (tokens > 0 or visible == 0)


def _reported_input_tokens(response: Any) -> Optional[int]:
    """``input_tokens`` of the model's reply (a ModelResponse or an AIMessage)."""
    msgs = response.result if isinstance(response, ModelResponse) else [response]
    for m in reversed(msgs):
        usage = m.usage_metadata if isinstance(m, AIMessage) else None
        if usage and type(usage.get("input_tokens")) is int:
            return int(usage["input_tokens"])
    return None


#: META members saying a message was stored other than the state holds it.
_ALTERED = ("redis_mem_truncated", "redis_mem_meta_dropped", "redis_mem_replaced_surrogates")


@dataclass
class _Sight:
    """What a first sight of a session read: the msgids it holds or let go
    last, and the held ones' texts (not those stored truncated)."""

    ids: Set[str]
    texts: Dict[str, str]


def _comparable(text: str) -> str:
    """A text as stored: a lone surrogate is U+FFFD there, and a checkpointer
    may give it back as "?" (hostile pass 60 F2); the three are one."""
    return re.sub("[\ud800-\udfff\ufffd?]", "?", text)


def _fingerprint(m: BaseMessage) -> str:
    """What a message says, for telling two messages under one id apart."""
    return hashlib.sha256(f"{m.type}\0{_comparable(_text_of(m))}".encode()).hexdigest()[:32]


def _text_of(m: BaseMessage) -> str:
    text: Any = m.text  # a str subclass in langchain-core 1.x, a method before
    return text if isinstance(text, str) else str(text())


#: The largest token figure the module takes (a model window, BUDGET): 2^53 - 1.
MAX_TOKEN_FIGURE = 2**53 - 1


def _positive(name: str, value: Optional[int], allow_zero: bool = False) -> Optional[int]:
    if value is None:
        return None
    if type(value) is not int or not (0 if allow_zero else 1) <= value <= MAX_TOKEN_FIGURE:
        raise ValueError(f"{name} must be {'a non-negative' if allow_zero else 'a positive'} integer up to "
                         f"{MAX_TOKEN_FIGURE}, or None, not {value!r}")
    return value


def _msgid(m: BaseMessage) -> Optional[str]:
    """The MSGID a message is stored with: its id, but a system message's
    text for one. An application without a checkpointer sends its
    instructions with every turn, each copy with a new id (LangGraph gives
    an id-less message a random one): named by its text, the session stores
    it once (the module answers a msgid it holds, or held recently, as a
    duplicate), not once per turn."""
    if isinstance(m, SystemMessage) and not _is_summary(m):
        text = m.content if isinstance(m.content, str) else json.dumps(m.content, sort_keys=True)
        return "lc:system:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return msgid_of(m)


def _is_summary(m: BaseMessage) -> bool:
    return m.additional_kwargs.get("lc_source") == SUMMARY_SOURCE


def _approx_tokens(m: BaseMessage) -> int:
    # Local memory only (Redis down): about 4 characters a token.
    return 3 + len(str(m.content)) // 4


def _truncate(text: str, limit: int, marker: str = TRUNCATED_MARKER) -> Tuple[str, int]:
    """(text cut to at most ``limit`` UTF-8 bytes with the marker, original
    size) or (text, 0) when it fits."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text, 0
    marker_room = len(marker.format(kept=len(raw), size=len(raw)).encode("utf-8"))
    keep = max(0, limit - marker_room)
    cut = raw[:keep].decode("utf-8", "ignore")
    kept = len(cut.encode("utf-8"))
    return cut + marker.format(kept=kept, size=len(raw)), len(raw)


class _LocalMemory:
    """Process-local memory while Redis is unreachable: per session, the last
    context loaded from Redis plus what came since, and the messages Redis
    has not got yet. At most ``max_sessions`` sessions are kept (least
    recently used go first), so a long-running process serving many threads
    stays bounded."""

    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self.context: "OrderedDict[str, List[BaseMessage]]" = OrderedDict()
        self.pending: Dict[str, List[BaseMessage]] = {}

    def keep(self, key: str, context: List[BaseMessage]) -> None:
        """The context just loaded from Redis (the newest state of the session)."""
        self.context[key] = list(context)
        self.context.move_to_end(key)
        while len(self.context) > self.max_sessions:
            old, _ = self.context.popitem(last=False)
            if self.pending.get(old):
                log.error("redis-mem: local memory full: %d messages of %s never reached Redis",
                          len(self.pending[old]), old)
            self.pending.pop(old, None)

    def add(self, key: str, msgs: Sequence[BaseMessage], pending: bool) -> None:
        """Messages of the session (``pending``: not in Redis yet)."""
        ctx = self.context.get(key, [])
        known = {m.id for m in ctx}
        pend = self.pending.setdefault(key, []) if pending else []
        for m in msgs:
            if m.id not in known:
                ctx.append(m)
                known.add(m.id)
                if pending:
                    pend.append(m)
        self.keep(key, ctx)

    def load(self, key: str, budget: int) -> List[BaseMessage]:
        """The newest messages within ``budget`` (estimated tokens)."""
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


def default_attributes_message(attributes: Mapping[str, Any]) -> str:
    """The default text of ``attributes`` for the system message."""
    lines = ["What is known about this user and conversation (kept with the session):"]
    for name, value in attributes.items():
        lines.append(f"{name}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines)


class RedisMemMiddleware(AgentMiddleware):
    """Agent middleware keeping the conversation in a redis-mem session.

    Connection: ``client`` (alias ``redis_client``), a ``redis.Redis``,
    and/or ``async_client``, a ``redis.asyncio.Redis``, or ``url`` (alias
    ``redis_url``) to make both. Session: ``session_id`` (one fixed session),
    else the thread id through ``key_template`` (``%s``) or ``session_key``
    (a function of the thread id). ``budget``: tokens of context the model
    is given (summary included), or ``"auto"``: ``context_window`` (None:
    MEM.MODELS's) less the system prompt, the tool schemas and
    ``reply_reserve`` (None: the model's ``max_tokens``, else 4096).
    ``tokens_from_usage``: store AI messages with the provider's output
    tokens (None: for Claude, Gemini and models MEM.MODELS marks inexact).
    ``model``, ``ttl``, ``maxtokens``,
    ``maxmsgs``, ``maxage``: session settings sent with each append (None:
    the session's own / the module's defaults). ``memory``: see
    :data:`MemoryType`. ``summary_model``: the chat model that summarizes
    (None: the agent's own); ``summary_service``: True when
    ``redis-mem-summarizer`` does it instead; ``keep``, ``lease_ms``,
    ``summary_prompt``: for the summary. ``attributes``: session members
    given to the model (``attributes_message`` formats them).
    ``on_unavailable``: ``"local"`` or ``"fail"`` when Redis cannot be
    reached; ``retry_interval``: seconds before Redis is tried again;
    ``local_sessions``: sessions the local memory keeps at most.
    ``max_message_bytes``: the module's limit (None: CONFIG GET once).
    ``max_message_tokens``: the tokens one stored message's content may take (None: a
    quarter of ``maxtokens`` or of mem.max-tokens; 0: no limit); a longer
    one is stored truncated with a marker (the model is given all of it).
    """

    state_schema = RedisMemState

    def __init__(
        self,
        client: Optional["redis.Redis"] = None,
        *,
        redis_client: Optional["redis.Redis"] = None,
        async_client: Optional["redis.asyncio.Redis"] = None,
        url: Optional[str] = None,
        redis_url: Optional[str] = None,
        session_id: Optional[str] = None,
        memory: MemoryType = "summarize",
        budget: Budget = DEFAULT_BUDGET,
        context_window: Optional[int] = None,
        reply_reserve: Optional[int] = None,
        tokens_from_usage: Optional[bool] = None,
        key_template: str = "mem:{%s}",
        session_key: Optional[Callable[[str], str]] = None,
        model: Optional[str] = None,
        ttl: Optional[int] = None,
        maxtokens: Optional[int] = None,
        maxmsgs: Optional[int] = None,
        maxage: Optional[int] = None,
        summary_model: Any = None,
        summary_service: bool = False,
        summary_prompt: str = SUMMARY_PROMPT,
        keep: Optional[int] = None,
        lease_ms: int = 15_000,
        attributes: Optional[Sequence[str]] = None,
        attributes_message: Callable[[Mapping[str, Any]], str] = default_attributes_message,
        on_unavailable: OnUnavailable = "local",
        retry_interval: float = 5.0,
        local_sessions: int = 1000,
        max_message_bytes: Optional[int] = None,
        max_message_tokens: Optional[int] = None,
    ) -> None:
        super().__init__()
        memory = {"summarize_at_limit": "summarize", "summarize at limit": "summarize"}.get(  # type: ignore[assignment]
            memory, memory)
        if memory not in ("summarize", "window", "none"):
            raise ValueError('memory must be "summarize" (summarize at the limit), "window" or "none"')
        if on_unavailable not in ("local", "fail"):
            raise ValueError('on_unavailable must be "local" or "fail"')
        client = client if client is not None else redis_client
        url = url if url is not None else redis_url
        if url is not None:
            client = client or redis.Redis.from_url(url)
            async_client = async_client or redis.asyncio.Redis.from_url(url)
        if memory != "none" and client is None and async_client is None:
            raise ValueError("give client=redis.Redis(...), async_client=redis.asyncio.Redis(...) or url=...")
        self.mem = RedisMemClient(client) if client is not None else None
        self.amem = AsyncRedisMemClient(async_client) if async_client is not None else None
        self.memory: MemoryType = memory
        if budget != "auto" and (type(budget) is not int or not 1 <= budget <= MAX_TOKEN_FIGURE):
            raise ValueError(f'budget must be a positive number of tokens or "auto", not {budget!r}')
        if tokens_from_usage not in (None, True, False):
            raise ValueError(f"tokens_from_usage must be True, False or None (automatic), not {tokens_from_usage!r}")
        self.budget: Budget = budget
        self.context_window = _positive("context_window", context_window)
        self.reply_reserve = _positive("reply_reserve", reply_reserve, allow_zero=True)
        self.tokens_from_usage = tokens_from_usage
        self.session_id = session_id
        self.key_template = key_template
        self.session_key = session_key
        self.settings: Dict[str, Any] = dict(model=model, ttl=ttl, maxtokens=maxtokens, maxmsgs=maxmsgs,
                                             maxage=maxage)
        self.summary_model = summary_model
        self.summary_service = bool(summary_service)
        self.summary_prompt = summary_prompt
        self.keep = keep
        self.lease_ms = int(lease_ms)
        self.attributes = list(attributes) if attributes else []
        self.attributes_message = attributes_message
        self.on_unavailable: OnUnavailable = on_unavailable
        #: While Redis is down, it is tried again at most this often (seconds),
        #: so a step does not wait for a dead server every time.
        self.retry_interval = float(retry_interval)
        self.max_message_bytes = max_message_bytes
        self.max_message_tokens = max_message_tokens
        self._count_model: Optional[str] = model
        self._skip_until = 0.0
        self.local = _LocalMemory(local_sessions)
        #: Sessions served from local memory right now (Redis was down).
        self.degraded: Set[str] = set()
        #: Sessions warned about evictions nothing summarizes.
        self.warned: Set[str] = set()
        #: The agent's own chat model (seen in wrap_model_call): the default summarizer.
        self.agent_model: Any = None
        self._lock = threading.Lock()
        #: Per session, the ids of the state's messages it holds, each with
        #: the fingerprint of what was sent under it ("" when it was not sent
        #: from here: loaded, or taken as stored on a first sight).
        self._synced: "OrderedDict[str, Dict[str, str]]" = OrderedDict()
        self._local_sessions = local_sessions
        #: Appends made (batches), duplicates, summaries committed, local steps,
        #: messages truncated or refused: for tests and metrics.
        self.stats = {"batches": 0, "duplicates": 0, "summaries": 0, "summary_failures": 0, "local": 0,
                      "truncated": 0, "refused": 0, "resent": 0, "provider_tokens": 0,
                      "provider_tokens_implausible": 0, "reused_ids": 0}
        #: The last auto budget computed (None: none yet, or a fixed budget).
        self.last_budget: Optional[BudgetBreakdown] = None
        self._drift: Dict[str, UsageDrift] = {}
        self._model_info: Dict[str, Optional[ModelInfo]] = {}
        self._text_tokens: "OrderedDict[Tuple[str, str], int]" = OrderedDict()
        self._tools_tokens: "OrderedDict[Tuple[str, Tuple[str, ...]], int]" = OrderedDict()
        self._tool_schemas: "OrderedDict[int, Tuple[Any, str]]" = OrderedDict()
        self._warned_models: Set[str] = set()

    @property
    def usage_drift(self) -> Dict[str, UsageDrift]:
        """Per model name: the provider's reported prompt tokens against the
        middleware's estimate (a snapshot; see :class:`UsageDrift`)."""
        with self._lock:
            return dict(self._drift)

    # -- keys, ids ------------------------------------------------------------

    def key_for(self, thread_id: str) -> str:
        """The session key of a thread."""
        return self.session_key(thread_id) if self.session_key else self.key_template % thread_id

    def _key(self) -> str:
        if self.session_id is not None:
            return self.key_for(self.session_id)
        try:
            thread_id = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            thread_id = None
        if not thread_id:
            raise ValueError(
                "RedisMemMiddleware needs a thread id: invoke the agent with "
                'config={"configurable": {"thread_id": "<session id>"}} (or give session_id=...)'
            )
        return self.key_for(str(thread_id))

    @staticmethod
    def _ensure_ids(msgs: Sequence[BaseMessage]) -> None:
        """Gives a message without an id one derived from the LangGraph task
        (its id is the same when the step is retried, new in every run), the
        step and its position; a random one outside a graph."""
        missing = [i for i, m in enumerate(msgs) if not m.id]
        if not missing:
            return
        try:
            conf = get_config()
        except RuntimeError:
            conf = {}
        meta = conf.get("metadata") or {}
        task = (conf.get("configurable") or {}).get("checkpoint_ns") or meta.get("langgraph_checkpoint_ns")
        run = conf.get("run_id")
        base = f"{task}:{meta.get('langgraph_step', 0)}" if task else (str(run) if run else None)
        for i in missing:
            msgs[i].id = f"lg:{base}:{i}" if base else f"lg:{uuid.uuid4().hex}"

    def _state_key(self, key: str) -> str:
        """Whose messages ``_synced`` holds: the agent state's. With a fixed
        ``session_id`` several threads share one session, each with its own
        state: a thread first seen after another one's turn skipped its
        first sight and stored its whole state again (hostile pass 59 F3)."""
        if self.session_id is None:
            return key
        try:
            thread_id = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            thread_id = None
        return f"{key}\0{thread_id}" if thread_id else key

    def _synced_of(self, key: str) -> Optional[Dict[str, str]]:
        state = self._state_key(key)
        with self._lock:
            return self._synced.get(state)

    def _mark(self, key: str, ids: Sequence[Optional[str]], prints: Optional[Sequence[str]] = None) -> None:
        state = self._state_key(key)
        with self._lock:
            s = self._synced.setdefault(state, {})
            self._synced.move_to_end(state)
            for n, i in enumerate(ids):
                if i:
                    s[i] = (prints[n] if prints else "") or s.get(i, "")
            while len(self._synced) > max(1, self._local_sessions):
                self._synced.popitem(last=False)

    def _mark_sent(self, key: str, msgs: Sequence[BaseMessage]) -> None:
        self._mark(key, [m.id for m in msgs], [_fingerprint(m) for m in msgs])

    def _reused(self, key: str, m: BaseMessage, synced: Dict[str, str]) -> bool:
        """Whether ``m`` is a new user message under the id of another one
        this process sent (an app's constant or restarted per-page id): it
        was dropped as stored, so the model was called without the user's
        question (hostile pass 58 F2). Given an id of its own, derived from
        the old one and its text, and said."""
        was = synced.get(m.id or "")
        if not was or not isinstance(m, HumanMessage) or was == _fingerprint(m):
            return False
        old = m.id or ""
        self._own_id(key, m, synced, again=True)
        # A retry is of the latest text sent under an id: A, B, then A again
        # is a new A (hostile pass 60 F3).
        synced[old] = _fingerprint(m)
        return True

    def _own_id(self, key: str, m: BaseMessage, known: Container[str], again: bool = False) -> bool:
        """Gives ``m``, a user message under an id stored with another text,
        an id of its own (the old one and its text's hash); whether that id
        is new (else it was stored under it before: a retry). Said once.
        ``again``: the text is not the latest sent under the id, so one
        stored under that id before makes this a new one (A, B, then A)."""
        old = m.id
        m.id = own = f"{old}~{_fingerprint(m)[:16]}"
        n = 1
        while again and (m.id in known or _msgid(m) in known):
            n += 1
            m.id = f"{own}.{n}"
        if m.id in known or _msgid(m) in known:
            return False
        self.stats["reused_ids"] += 1
        log.warning("redis-mem: session %s: the id %r is stored with another text; this user message is "
                    "stored as %r (give each message its own id)", key, old, m.id)
        return True

    def _unsynced(self, key: str, msgs: Sequence[BaseMessage], sight: Optional["_Sight"]) -> List[BaseMessage]:
        """Messages of the state not in the session yet. ``sight``: on the
        first sight of a session with a longer state (a checkpointer, a new
        process), the msgids the session holds or let go last: the state up
        to the newest message it holds or held is taken as stored, but for a
        user message held under its id with another text (an edit: LangGraph's
        ``update_state`` keeps the id), stored under an id of its own as a
        process that sent it would (hostile pass 59 F1)."""
        body = [m for m in msgs if not _is_summary(m)]
        if sight is not None:
            held = sight.ids
            edited: Set[int] = set()
            for m in body:
                mid = _msgid(m)
                stored = sight.texts.get(mid) if mid else None
                if (stored is None or not isinstance(m, HumanMessage)
                        or _comparable(stored) == _comparable(message_to_mem(m)[1])):
                    continue
                if self._own_id(key, m, held):
                    edited.add(id(m))
            last = -1
            for i, m in enumerate(body):
                if (m.id and m.id in held) or (_msgid(m) in held):
                    last = i
            kept = [m for m in body[: last + 1] if id(m) not in edited]
            self._mark(key, [m.id for m in kept], [_fingerprint(m) for m in kept])
        synced = self._synced_of(key) or {}
        return [m for m in body if m.id not in synced or (self._reused(key, m, synced) and m.id not in synced)]

    def _needs_sight(self, key: str, msgs: Sequence[BaseMessage]) -> bool:
        return self._synced_of(key) is None and sum(1 for m in msgs if not _is_summary(m)) > 1

    @staticmethod
    def _held(key: str, entries: Sequence[Message]) -> Set[str]:
        out: Set[str] = set()
        for e in entries:
            if e.is_summary:
                continue
            if e.msgid:
                out.add(e.msgid)
            out.add(f"redis-mem-{key}-{e.id}")
        return out

    @staticmethod
    def _waits(new: List[BaseMessage], final: bool) -> bool:
        # An AI message with tool calls is stored with its results (one batch),
        # so no reader ever sees calls without results, or results first.
        return not final and isinstance(new[-1], AIMessage) and bool(new[-1].tool_calls)

    # -- what is stored ----------------------------------------------------------

    def _item(self, m: BaseMessage, limit: int, minimal: bool = False, cut: Optional[int] = None,
              cap: int = 0) -> Dict[str, Any]:
        role, content, meta = message_to_mem(m)
        raw = m.content if isinstance(m.content, str) else json.dumps(m.content, ensure_ascii=False)
        replaced = _lone_surrogates(raw)
        if minimal:  # the module refused the full META: keep what rebuilds the message
            meta = {k: v for k, v in meta.items()
                    if k in ("lc_type", "id", "tool_calls", "tool_call_id", "name", "status")}
            meta = json.loads(json.dumps(meta, default=str))
        content = _clean_text(content)
        meta = _clean_json(meta)
        if cut is not None:  # over max_message_tokens: cut to ``cut`` bytes (logged by the caller)
            content, size = _truncate(content, min(limit, cut), TOKEN_TRUNCATED_MARKER.replace("{cap}", str(cap)))
        else:
            content, size = _truncate(content, limit)
        if replaced:
            # Not encodable as UTF-8: stored as U+FFFD, said and marked as a
            # truncation is (hostile pass 25, F6: it was silent).
            meta["redis_mem_replaced_surrogates"] = replaced
            log.warning("redis-mem: a %s message holds %d lone surrogate(s) (not valid UTF-8): stored as U+FFFD",
                        role, replaced)
        if size:
            meta["redis_mem_truncated"] = size
            meta.pop("lc_content", None)  # the blocks hold the same text
        if size and cut is None:
            self.stats["truncated"] += 1
            log.warning("redis-mem: a %s message of %d bytes is over mem.max-message-bytes (%d): stored "
                        "truncated (the model was given all of it)", role, size, limit)
        if len(json.dumps(meta, ensure_ascii=False).encode("utf-8")) > limit:
            # META over the limit (content blocks, huge tool arguments): keep
            # what rebuilds the message; tool calls stay (a result needs its
            # call), their largest arguments replaced by their size.
            calls = meta.get("tool_calls") or []
            room = limit // (2 * max(1, len(calls)))
            kept_calls = []
            for call in calls:
                size = len(json.dumps(call, ensure_ascii=False).encode("utf-8"))
                if size > room and isinstance(call, dict):
                    call = {k: v for k, v in call.items() if k in ("id", "name", "type")}
                    call["args"] = {"redis_mem_truncated": size}
                kept_calls.append(call)
            meta = {k: v for k, v in meta.items() if k in ("lc_type", "id", "tool_call_id", "name", "status")}
            if kept_calls:
                meta["tool_calls"] = kept_calls
            meta["redis_mem_meta_dropped"] = True
            self.stats["truncated"] += 1
            log.warning("redis-mem: the META of a %s message is over mem.max-message-bytes (%d): stored reduced",
                        role, limit)
        return {"role": _clean_text(role)[:64] or "user", "content": content, "meta": meta,
                "msgid": _msgid(m)}

    @staticmethod
    def _batches(items: List[Dict[str, Any]], limit: int) -> List[List[Dict[str, Any]]]:
        """At most MAX_BATCH items and about 3 x ``limit`` bytes a batch; a
        batch is cut before a message that is not a tool result when it can
        be (a call stays with its results)."""
        def size(item: Dict[str, Any]) -> int:
            return len(item["content"].encode("utf-8")) + len(json.dumps(item["meta"])) + 64

        out: List[List[Dict[str, Any]]] = []
        start, n, max_bytes = 0, len(items), 3 * limit
        while start < n:
            end, used = start, 0
            while end < n and end - start < MAX_BATCH and (end == start or used + size(items[end]) <= max_bytes):
                used += size(items[end])
                end += 1
            if end < n:
                cut = end
                while cut > start + 1 and items[cut]["role"] == "tool":
                    cut -= 1
                if items[cut]["role"] != "tool":
                    end = cut
            out.append(items[start:end])
            start = end
        return out

    # -- the core (one for sync and async: it yields its I/O) -------------------

    def _limit_core(self) -> Core[int]:
        if self.max_message_bytes is None:
            got = yield ("config", "mem.max-message-bytes")
            try:
                self.max_message_bytes = int(got) if got is not None else DEFAULT_MAX_MESSAGE_BYTES
            except (TypeError, ValueError):
                self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        return self.max_message_bytes

    def _token_cap_core(self) -> Core[int]:
        if self.max_message_tokens is None:
            cap = self.settings.get("maxtokens")
            if cap is None:
                got = yield ("config", "mem.max-tokens")
                try:
                    cap = int(got) if got is not None else DEFAULT_MAX_TOKENS
                except (TypeError, ValueError):
                    cap = DEFAULT_MAX_TOKENS
            self.max_message_tokens = max(1, int(cap) // MESSAGE_TOKEN_SHARE)
        return self.max_message_tokens

    def _count_model_core(self) -> Core[str]:
        if self._count_model is None:
            model = self.settings.get("model")
            if not model:
                got = yield ("config", "mem.default-model")
                model = got.decode() if isinstance(got, bytes) else got
            self._count_model = str(model or "gpt-4o")
        return self._count_model

    def _fit_tokens_core(self, msgs: List[BaseMessage], items: List[Dict[str, Any]],
                         limit: int) -> Core[None]:
        """Cuts (in place) every item over ``max_message_tokens``: a message
        larger than the session's token cap would evict every older message
        of the conversation, and then be evicted itself by the next one.
        Tokens never exceed bytes, so only a longer text is counted."""
        cap = yield from self._token_cap_core()
        if cap <= 0:
            return
        for i, item in enumerate(items):
            size = len(item["content"].encode("utf-8"))
            if size <= cap:
                continue
            model = yield from self._count_model_core()
            try:
                tokens = int((yield ("count", model, item["content"])))
            except redis.ResponseError as err:  # MEM.COUNT refused (an encoding mem.encodings leaves out)
                log.warning("redis-mem: could not count a %s message against max_message_tokens (%s): stored "
                            "as it is", item["role"], err)
                continue
            if tokens <= cap:
                continue
            full = len(_clean_text(message_to_mem(msgs[i])[1]).encode("utf-8"))
            cut = size
            for _attempt in range(6):
                cut = max(0, min(cut - 1, int(cut * cap / max(1, tokens) * 0.9)))
                new = self._item(msgs[i], limit, cut=cut, cap=cap)
                try:
                    tokens = int((yield ("count", model, new["content"])))
                except redis.ResponseError:
                    break  # cut proportionally: close enough
                if tokens <= cap:
                    break
            if "redis_mem_truncated" not in item["meta"]:  # else counted once already (bytes)
                self.stats["truncated"] += 1
            items[i] = new
            log.warning("redis-mem: a %s message of %d bytes is over %d tokens (max_message_tokens: a quarter of "
                        "the session's maxtokens by default; it would evict the whole conversation): stored "
                        "truncated to %d tokens (the model was given all of it)", item["role"], full, cap, tokens)

    def _provider_tokens_core(self, msgs: Sequence[BaseMessage]) -> Core[List[Optional[int]]]:
        """Per message, the provider's count to store with TOKENS (None: the
        module counts): an AI message's reported output tokens, for a model
        whose tokenizer the module does not have (see :meth:`_uses_usage_core`)."""
        counts = [_output_tokens(m) for m in msgs]
        if all(n is None for n in counts):
            return counts
        model = yield from self._model_name_core(self.agent_model)
        if not (yield from self._uses_usage_core(model)):
            return [None] * len(msgs)
        return counts

    def _given(self, item: Dict[str, Any], tokens: Optional[int]) -> Dict[str, Any]:
        # A message stored truncated is not the text the provider counted.
        if tokens is None or "redis_mem_truncated" in item["meta"]:
            return item
        if not _plausible_output_tokens(tokens, item):
            self.stats["provider_tokens_implausible"] += 1
            log.warning("redis-mem: a reply reported %d output tokens for %d bytes of text and tool calls: not "
                        "what the model will be given back (thinking tokens, or usage summed over streamed "
                        "chunks?); the module's count is stored instead", tokens, _visible_bytes(item))
            return item
        item["tokens"] = tokens
        return item

    def _append_core(self, key: str, msgs: List[BaseMessage], limit: int) -> Core[List[AppendResult]]:
        items = [self._item(m, limit) for m in msgs]
        yield from self._fit_tokens_core(msgs, items, limit)
        given = yield from self._provider_tokens_core(msgs)
        items = [self._given(item, n) for item, n in zip(items, given)]
        results: List[AppendResult] = []
        offset = 0
        for batch in self._batches(items, limit):
            first, offset = offset, offset + len(batch)
            try:
                results += yield ("append_batch", key, batch)
                self.stats["provider_tokens"] += sum("tokens" in item for item in batch)
                continue
            except redis.ResponseError as err:
                log.warning("redis-mem: %s: the module refused a batch (%s); retrying message by message", key, err)
            for item, m, n in zip(batch, msgs[first:offset], given[first:offset]):
                last: Optional[Exception] = None
                attempts = [item, self._given(self._item(m, limit, minimal=True), n)]
                if "tokens" in item:  # the provider's count refused (over mem.max-tokens-limit): the module's
                    attempts.append(self._item(m, limit, minimal=True))
                for attempt in attempts:
                    try:
                        results += yield ("append_batch", key, [attempt])
                        self.stats["provider_tokens"] += "tokens" in attempt
                        last = None
                        break
                    except redis.ResponseError as err:
                        last = err
                if last is not None:
                    self.stats["refused"] += 1
                    log.error("redis-mem: %s: a %s message was refused by the module and NOT stored: %s",
                              key, item["role"], last)
        return results

    def _store_core(self, key: str, msgs: List[BaseMessage]) -> Core[None]:
        recovering = key in self.degraded or bool(self.local.pending.get(key))
        if not msgs and not recovering:
            return
        if self._skipping():
            self.local.add(key, msgs, pending=True)
            return
        try:
            limit = yield from self._limit_core()
            send = list(msgs)
            if recovering:
                # Redis answers again: every message the local memory holds
                # that the session lacks (it may have restarted empty).
                held = self._held(key, (yield ("get", key, None)))
                ids = {m.id for m in send}
                lacking = [m for m in self.local.context.get(key, [])
                           if not _is_summary(m) and m.id not in ids
                           and m.id not in held and _msgid(m) not in held]
                self.stats["resent"] += len(lacking)
                send = lacking + send
            results = yield from self._append_core(key, send, limit)
        except UNAVAILABLE as err:
            self._down(key, err)
            self.local.add(key, msgs, pending=True)
            return
        self._up(key)
        self.local.add(key, send, pending=False)
        self.local.pending.pop(key, None)
        self._mark_sent(key, send)
        self.stats["batches"] += 1
        self.stats["duplicates"] += sum(r.duplicate for r in results)
        yield from self._after_append_core(key, results)

    def _summarizer(self) -> Any:
        if self.summary_model is not None:
            return self.summary_model
        if self.summary_service:
            return None
        return self.agent_model

    def _after_append_core(self, key: str, results: List[AppendResult]) -> Core[None]:
        if self.memory != "summarize" or not results:
            return
        due = any(r.summarize for r in results)
        trimmed = sum(r.trimmed for r in results)
        model = self._summarizer()
        unsummarized = model is None and not self.summary_service
        # Said before summarizing: a write that brought more than the caps
        # hold evicted messages that no summary will ever cover, whatever the
        # summary made of the rest.
        if (trimmed or (due and unsummarized)) and key not in self.warned:
            self.warned.add(key)
            if unsummarized:
                log.warning(
                    "redis-mem: session %s is at its limit and nothing summarizes it: its oldest messages %s "
                    "evicted by the caps and LOST. Fix: give RedisMemMiddleware(summary_model=<chat model>), run "
                    "redis-mem-summarizer and pass summary_service=True, or memory='window' to accept it.",
                    key, f"are being ({trimmed} so far)" if trimmed else "will be")
            else:
                log.warning(
                    "redis-mem: session %s: %d messages were evicted before a summary covered them (%s)",
                    key, trimmed, "is redis-mem-summarizer running?" if model is None
                    else "one write brought more than the caps hold, or the summary failed or is late")
        if due and model is not None:
            yield from self._summarize_core(key, model)

    def _summarize_core(self, key: str, model: Any) -> Core[None]:
        started = time.monotonic()
        try:
            begin: SummarizeBegin = yield ("begin", key, self.lease_ms, self.keep)
            if not begin.lease:
                return  # not due, or another worker holds the session
            entries = yield ("get", key, None)
            prompt = summary_prompt(entries, begin.upto, self.summary_prompt)
            text = yield ("llm", model, prompt)
            text = checked_summary(text).strip()  # blank or not a str: a failed summary
            result = yield ("summarize", key, begin.upto, text, begin.lease)
        except UNAVAILABLE as err:
            self._down(key, err)  # the next step finds out whether Redis is back
            return
        except Exception as err:
            # The lease is short (lease_ms): the next step after it tries again.
            self.stats["summary_failures"] += 1
            log.warning("redis-mem: inline summary of %s failed (retried after %d ms): %s",
                        key, self.lease_ms, err)
            return
        self.stats["summaries"] += 1
        log.info("redis-mem: summarized %s up to %d in %.0f ms (%d tokens left)",
                 key, begin.upto, (time.monotonic() - started) * 1000, result.total_tokens)

    # -- what the model sees: model, budget, estimate ------------------------------

    def _model_name_core(self, chat_model: Any) -> Core[str]:
        """The name of the model that sees the context: ``model=``, else the
        agent's chat model's own name, else mem.default-model."""
        name = self.settings.get("model") or _chat_model_name(chat_model)
        if name:
            return str(name)
        return (yield from self._count_model_core())

    def _model_info_core(self, model: str) -> Core[Optional[ModelInfo]]:
        """MEM.MODELS model, once per model (None: the module refused it)."""
        if model not in self._model_info:
            try:
                self._model_info[model] = yield ("models", model)
            except redis.ResponseError as err:  # a module without MEM.MODELS
                log.warning("redis-mem: MEM.MODELS %s refused (%s): its window and exactness are unknown", model, err)
                self._model_info[model] = None
        return self._model_info[model]

    def _uses_usage_core(self, model: str) -> Core[bool]:
        """Whether replies are stored with the provider's count: Claude and
        Gemini (no public tokenizer) and any model the module counts with a
        stand-in encoding (MEM.MODELS ``exact`` 0); ``tokens_from_usage``
        True / False decides instead."""
        if self.tokens_from_usage is not None:
            return self.tokens_from_usage
        info = yield from self._model_info_core(model)
        if info is None:
            return False  # a module that old may not take TOKENS either
        return bool(NO_PUBLIC_TOKENIZER.search(model)) or not info.exact

    def _text_tokens_core(self, model: str, text: str, role: Optional[str] = None) -> Core[int]:
        """MEM.COUNT model text, cached per (model, text) (a system prompt is
        the same call after call)."""
        if not text and role is None:
            return 0
        cache_key = (model if role is None else f"{model}\0{role}", text)
        cached = self._text_tokens.get(cache_key)
        if cached is not None:
            return cached
        try:
            n = int((yield ("count", model, text, role)))
        except redis.ResponseError as err:  # an encoding mem.encodings leaves out
            if model not in self._warned_models:
                self._warned_models.add(model)
                log.warning("redis-mem: MEM.COUNT %s refused (%s): its texts are estimated at 4 bytes a token",
                            model, err)
            return len(text.encode("utf-8")) // 4 + 1
        with self._lock:
            self._text_tokens[cache_key] = n
            while len(self._text_tokens) > COUNT_CACHE_SIZE:
                self._text_tokens.popitem(last=False)
        return n

    def _tool_schema(self, tool: Any) -> str:
        """A tool as the model is sent it: its OpenAI function schema as JSON
        (cached per tool object; a provider's built-in tool, a dict, as it is)."""
        if isinstance(tool, dict):
            return json.dumps(tool, ensure_ascii=False, default=str)
        with self._lock:
            cached = self._tool_schemas.get(id(tool))
        if cached is not None and cached[0] is tool:
            return cached[1]
        try:
            text = json.dumps(convert_to_openai_tool(tool), ensure_ascii=False, default=str)
        except Exception as err:  # not a tool LangChain can describe: its name is what is sent
            log.debug("redis-mem: tool %r has no OpenAI schema (%s): counted by its name", tool, err)
            text = str(getattr(tool, "name", tool))
        with self._lock:  # the tool is kept with its schema, so its id is not reused meanwhile
            self._tool_schemas[id(tool)] = (tool, text)
            while len(self._tool_schemas) > COUNT_CACHE_SIZE:
                self._tool_schemas.popitem(last=False)
        return text

    def _tools_tokens_core(self, model: str, tools: Sequence[Any]) -> Core[int]:
        """The tools' schemas' tokens: each tool's JSON counted with MEM.COUNT,
        summed; cached per tool set."""
        if not tools:
            return 0
        schemas = tuple(self._tool_schema(t) for t in tools)
        cached = self._tools_tokens.get((model, schemas))
        if cached is not None:
            return cached
        total = 0
        for text in schemas:
            total += yield from self._text_tokens_core(model, text)
        with self._lock:
            self._tools_tokens[(model, schemas)] = total
            while len(self._tools_tokens) > COUNT_CACHE_SIZE:
                self._tools_tokens.popitem(last=False)
        return total

    def _reserve(self, request: Optional[ModelRequest]) -> int:
        """Tokens left for the reply: ``reply_reserve``, else the reply's
        maximum the call or the chat model sets, else DEFAULT_REPLY_RESERVE."""
        if self.reply_reserve is not None:
            return self.reply_reserve
        settings = request.model_settings if request is not None else {}
        chat_model = request.model if request is not None else self.agent_model
        # The call's own settings first, then the chat model's.
        for value in [settings.get(n) for n in MAX_OUTPUT_FIELDS] + [getattr(chat_model, n, None)
                                                                     for n in MAX_OUTPUT_FIELDS]:
            if type(value) is int and value > 0:
                return value
        return DEFAULT_REPLY_RESERVE

    def _local_budget(self) -> int:
        if self.budget != "auto":
            return self.budget
        return self.last_budget.budget if self.last_budget is not None else DEFAULT_BUDGET

    def _budget_core(self, model: str, request: Optional[ModelRequest],
                     system: Optional[SystemMessage]) -> Core[int]:
        """The tokens of context to ask MEM.GET for: a fixed ``budget``, or
        (``"auto"``) the window less the system prompt, the tool schemas and
        the reply reserve."""
        if self.budget != "auto":
            return self.budget
        window = self.context_window
        if window is None:
            info = yield from self._model_info_core(model)
            window = info.context_window if info is not None else 0
        if not window:
            if model not in self._warned_models:
                self._warned_models.add(model)
                log.warning("redis-mem: budget='auto' but the context window of %s is unknown (MEM.MODELS says 0): "
                            "budget %d used; give context_window=, or add the model to mem.models",
                            model, DEFAULT_BUDGET)
            return DEFAULT_BUDGET
        system_tokens = (yield from self._text_tokens_core(model, _text_of(system))) if system is not None else 0
        tools_tokens = (yield from self._tools_tokens_core(model, request.tools)) if request is not None else 0
        reserve = self._reserve(request)
        budget = window - system_tokens - tools_tokens - reserve
        if budget < 1:
            log.warning("redis-mem: %s: a window of %d tokens leaves no context once the system prompt (%d), tools "
                        "(%d) and reply reserve (%d) are taken: budget 1 (lower reply_reserve=?)",
                        model, window, system_tokens, tools_tokens, reserve)
            budget = 1
        self.last_budget = BudgetBreakdown(model, window, system_tokens, tools_tokens, reserve, budget)
        return budget

    def _estimate_core(self, model: str, request: ModelRequest, tokens: Mapping[str, int]) -> Core[Optional[int]]:
        """The prompt tokens of the call as the module counts them: system
        prompt, tool schemas, and each message (a context message by its
        MEM.GET tokens, any other counted as MEM.APPEND would)."""
        try:
            total = (yield from self._text_tokens_core(model, _text_of(request.system_message))
                     ) if request.system_message is not None else 0
            total += yield from self._tools_tokens_core(model, request.tools)
            for m in request.messages:
                n = tokens.get(m.id) if m.id else None
                if n is None:
                    role, content, _meta = message_to_mem(m)
                    n = yield from self._text_tokens_core(model, _clean_text(content), _clean_text(role)[:64] or "user")
                total += n
        except (redis.ResponseError, *UNAVAILABLE) as err:  # the estimate is not worth failing a call over
            log.debug("redis-mem: no prompt estimate for %s: %s", model, err)
            return None
        return total

    def _reconcile(self, call: _ModelCall, response: Any) -> None:
        """Compares the provider's reported prompt tokens with the estimate."""
        reported = _reported_input_tokens(response)
        if call.model is None or not call.estimated or reported is None:
            return
        ratio = reported / call.estimated
        with self._lock:
            old = self._drift.get(call.model)
            calls = old.calls + 1 if old else 1
            mean = old.mean_ratio + (ratio - old.mean_ratio) / calls if old else ratio
            self._drift[call.model] = UsageDrift(calls, call.estimated, reported, mean)
        log.debug("redis-mem: %s prompt: %d tokens reported by the provider, %d estimated (ratio %.3f; mean %.3f "
                  "over %d calls)", call.model, reported, call.estimated, ratio, mean, calls)

    def _load_core(self, key: str, request: Optional[ModelRequest] = None) -> Core[_Loaded]:
        if self._skipping():
            budget = self._local_budget()
            return _Loaded(self.local.load(key, budget), {}, {}, None, budget)
        try:
            model = yield from self._model_name_core(request.model if request is not None else self.agent_model)
            attrs: Dict[str, Any] = {}
            if self.attributes:
                every = (yield ("attrget", key)) or {}
                attrs = {n: every[n] for n in self.attributes if n in every}
            system = self._system_message(request, attrs) if request is not None else None
            budget = yield from self._budget_core(model, request, system)
            entries = yield ("get", key, budget)
        except UNAVAILABLE as err:
            self._down(key, err)
            budget = self._local_budget()
            return _Loaded(self.local.load(key, budget), {}, {}, None, budget)
        context, tokens = self._context(key, entries)
        self.local.keep(key, context)
        self._mark(key, [m.id for m in context if not _is_summary(m)])
        return _Loaded(context, attrs, tokens, model, budget)

    @staticmethod
    def _held_or_departed(key: str, doc: Optional[Mapping[str, Any]]) -> "_Sight":
        """The msgids of the session's messages (as :meth:`_held`) and of the
        last ones that left it (MAXAGE, the caps, a summary: the module keeps
        128, in ``FORMAT JSON``'s ``departed_msgids``). A first sight that
        knew only the held ones took a state whose stored messages had all
        aged out as never stored, and sent it again: every message older
        than the last 128 came back as new, stamped now (hostile pass 58 F1)."""
        out = _Sight(set(), {})
        if not doc:
            return out
        for e in doc.get("conversation_history") or []:
            if e.get("msgid"):
                out.ids.add(str(e["msgid"]))
                # A message stored truncated, reduced or with lone surrogates
                # replaced has lost the text to compare with (hostile pass 60 F1).
                meta = e.get("meta") or {}
                if isinstance(e.get("content"), str) and not any(k in meta for k in _ALTERED):
                    out.texts[str(e["msgid"])] = e["content"]
            out.ids.add(f"redis-mem-{key}-{e.get('id')}")
        for d in (doc.get("redis_mem") or {}).get("departed_msgids") or []:
            if d.get("msgid"):
                out.ids.add(str(d["msgid"]))
        return out

    def _sight_core(self, key: str, msgs: Sequence[BaseMessage]) -> Core[Optional["_Sight"]]:
        if not self._needs_sight(key, msgs) or self._skipping():
            return None
        try:
            return self._held_or_departed(key, (yield ("get_json", key)))
        except UNAVAILABLE:
            return None

    def _model_call_core(self, request: ModelRequest) -> Core[_ModelCall]:
        key = self._key()
        if self.agent_model is None:
            self.agent_model = request.model
        msgs = list(request.state.get("messages") or request.messages)
        self._ensure_ids(msgs)
        held = yield from self._sight_core(key, msgs)
        yield from self._store_core(key, self._unsynced(key, msgs, held))
        loaded = yield from self._load_core(key, request)
        out = self._request(request, msgs, loaded)
        if loaded.model is None:  # local memory: no estimate
            return _ModelCall(out, None, None)
        estimated = yield from self._estimate_core(loaded.model, out, loaded.tokens)
        return _ModelCall(out, loaded.model, estimated)

    def _after_core(self, state: Mapping[str, Any], final: bool) -> Core[None]:
        msgs = list(state.get("messages") or [])
        if not msgs:
            return
        key = self._key()
        self._ensure_ids(msgs)
        held = yield from self._sight_core(key, msgs)
        new = self._unsynced(key, msgs, held)
        if not new or self._waits(new, final):
            return
        yield from self._store_core(key, new)

    def _state_core(self, state: Mapping[str, Any]) -> Core[Dict[str, Any]]:
        """For the LangGraph nodes: store, then the state update that
        replaces the messages by the context."""
        key = self._key()
        msgs = list(state.get("messages") or [])
        self._ensure_ids(msgs)
        held = yield from self._sight_core(key, msgs)
        yield from self._store_core(key, self._unsynced(key, msgs, held))
        loaded = yield from self._load_core(key)
        ctx = self._merge(msgs, loaded.context, loaded.budget)
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *ctx]}

    def _input_core(self, state: Mapping[str, Any]) -> Core[List[BaseMessage]]:
        """For a graph's own model node: store, then the messages to call
        the model with (the state is left as it is)."""
        key = self._key()
        msgs = list(state.get("messages") or [])
        self._ensure_ids(msgs)
        held = yield from self._sight_core(key, msgs)
        yield from self._store_core(key, self._unsynced(key, msgs, held))
        loaded = yield from self._load_core(key)
        return self._merge(msgs, loaded.context, loaded.budget)

    # -- the context the model gets ---------------------------------------------

    def _context(self, key: str, entries: List[Message]) -> Tuple[List[BaseMessage], Dict[str, int]]:
        """The entries as messages, and each one's tokens by message id."""
        out: List[BaseMessage] = []
        tokens: Dict[str, int] = {}
        for e in entries:
            m: BaseMessage
            if e.is_summary:
                m = summary_message(e)
            else:
                m = message_from_mem(e)
                if not m.id:  # written by another client: a stable id all the same
                    m.id = e.msgid or f"redis-mem-{key}-{e.id}"
            out.append(m)
            if m.id:
                tokens[m.id] = e.tokens
        return out, tokens

    def _merge(self, state_msgs: Sequence[BaseMessage], context: List[BaseMessage],
               budget: int) -> List[BaseMessage]:
        # The state's own copy of a message (e.g. a tool result stored
        # truncated: the model is given all of it); the newest state messages
        # the budget left out (one huge message) are sent as they are.
        by_id = {m.id: m for m in state_msgs if m.id}
        ctx = [by_id.get(m.id, m) if m.id else m for m in context]
        ids = {m.id for m in ctx}
        # Instructions the state gives that the context lacks (evicted by the
        # caps, or not stored again: a copy's msgid is its text's, and the
        # module answers one it recently held as a duplicate) lead the prompt.
        held = ids | {_msgid(m) for m in ctx if isinstance(m, SystemMessage)}
        lead = [m for m in state_msgs if isinstance(m, SystemMessage) and not _is_summary(m)
                and m.id not in held and _msgid(m) not in held]
        ids.update(m.id for m in lead)
        tail = []
        for m in reversed(state_msgs):
            if m.id in ids or _is_summary(m):
                break
            tail.append(m)
        tail.reverse()
        if tail:
            log.warning("redis-mem: the newest messages do not fit budget %d; sent as they are", budget)
        out = [*lead, *ctx, *tail]
        # Never open the conversation with an assistant turn cut loose from
        # its question (providers refuse it): start at the first user turn.
        if out and isinstance(out[0], AIMessage):
            first = next((i for i, m in enumerate(out) if isinstance(m, HumanMessage)), None)
            if first:
                out = out[first:]
        return out

    def _system_message(self, request: ModelRequest, attrs: Dict[str, Any]) -> Optional[SystemMessage]:
        """The system message the model is given: the agent's, with the
        attributes at its end."""
        sm = request.system_message
        if not attrs:
            return sm
        text = self.attributes_message(attrs)
        if sm is None:
            return SystemMessage(text)
        if isinstance(sm.content, str):
            return SystemMessage(sm.content + "\n\n" + text)
        return SystemMessage([*sm.content, {"type": "text", "text": text}])

    def _request(self, request: ModelRequest, msgs: Sequence[BaseMessage], loaded: _Loaded) -> ModelRequest:
        changes: Dict[str, Any] = {"messages": self._merge(msgs, loaded.context, loaded.budget)}
        if loaded.attrs:
            changes["system_message"] = self._system_message(request, loaded.attrs)
        return request.override(**changes)

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

    # -- drivers ---------------------------------------------------------------

    def _sync_mem(self) -> RedisMemClient:
        if self.mem is None:
            raise ValueError("the sync hooks (agent.invoke) need client=redis.Redis(...) or url=...")
        return self.mem

    @staticmethod
    def _llm_config() -> Dict[str, Any]:
        # The summary call is the middleware's own: never streamed to the
        # agent's caller as messages of the step.
        return {"callbacks": [], "tags": ["nostream"], "run_name": "redis-mem-summary"}

    def _do(self, op: Op) -> Any:
        mem = self._sync_mem()
        kind = op[0]
        if kind == "get":
            return mem.get(op[1], budget=op[2])
        if kind == "get_json":
            return mem.get_json(op[1])
        if kind == "append_batch":
            return mem.append_batch(op[1], op[2], **self.settings)
        if kind == "attrget":
            return mem.attrget(op[1])
        if kind == "config":
            try:
                got = mem.redis.config_get(op[1])
            except redis.ResponseError:
                return None
            return next(iter(got.values()), None) if got else None
        if kind == "count":
            return mem.count(*op[1:])
        if kind == "models":
            return mem.models(op[1])
        if kind == "begin":
            return mem.summarize_begin(op[1], op[2], keep=op[3])
        if kind == "summarize":
            return mem.summarize(op[1], op[2], op[3], lease=op[4])
        if kind == "llm":
            reply = op[1].invoke(op[2], config=self._llm_config())
            return reply.text if isinstance(reply.text, str) else reply.text()
        raise AssertionError(kind)

    async def _ado(self, op: Op) -> Any:
        mem = self.amem
        kind = op[0]
        if kind == "llm":
            reply = await op[1].ainvoke(op[2], config=self._llm_config())
            return reply.text if isinstance(reply.text, str) else reply.text()
        if mem is None:
            return await asyncio.to_thread(self._do, op)
        if kind == "get":
            return await mem.get(op[1], budget=op[2])
        if kind == "get_json":
            return await mem.get_json(op[1])
        if kind == "append_batch":
            return await mem.append_batch(op[1], op[2], **self.settings)
        if kind == "attrget":
            return await mem.attrget(op[1])
        if kind == "config":
            try:
                got = await mem.redis.config_get(op[1])
            except redis.ResponseError:
                return None
            return next(iter(got.values()), None) if got else None
        if kind == "count":
            return await mem.count(*op[1:])
        if kind == "models":
            return await mem.models(op[1])
        if kind == "begin":
            return await mem.summarize_begin(op[1], op[2], keep=op[3])
        if kind == "summarize":
            return await mem.summarize(op[1], op[2], op[3], lease=op[4])
        raise AssertionError(kind)

    def _drive(self, core: Core[T]) -> T:
        return _drive(core, self._do)

    async def _adrive(self, core: Core[T]) -> T:
        return await _adrive(core, self._ado)

    # -- hooks -----------------------------------------------------------------

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        """Stores the new messages, then calls the model with the session's context."""
        if self.memory == "none":
            return handler(request)
        call = self._drive(self._model_call_core(request))
        response = handler(call.request)
        self._reconcile(call, response)
        return response

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        """Async :meth:`wrap_model_call`."""
        if self.memory == "none":
            return await handler(request)
        call = await self._adrive(self._model_call_core(request))
        response = await handler(call.request)
        self._reconcile(call, response)
        return response

    def after_model(self, state: AgentState[Any], runtime: Any) -> None:
        """Stores a final answer at once (a tool call waits for its results)."""
        if self.memory != "none":
            self._drive(self._after_core(state, final=False))

    def after_agent(self, state: AgentState[Any], runtime: Any) -> None:
        """Stores whatever the run added and is not stored yet."""
        if self.memory != "none":
            self._drive(self._after_core(state, final=True))

    async def aafter_model(self, state: AgentState[Any], runtime: Any) -> None:
        """Async :meth:`after_model`."""
        if self.memory != "none":
            await self._adrive(self._after_core(state, final=False))

    async def aafter_agent(self, state: AgentState[Any], runtime: Any) -> None:
        """Async :meth:`after_agent`."""
        if self.memory != "none":
            await self._adrive(self._after_core(state, final=True))

    # -- the LangGraph nodes (redis_mem.langgraph) -------------------------------

    def load_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Stores the state's new messages; the update replacing them by the
        session's context (for a plain StateGraph node)."""
        if self.memory == "none":
            return {}
        return self._drive(self._state_core(state))

    async def aload_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Async :meth:`load_state`."""
        if self.memory == "none":
            return {}
        return await self._adrive(self._state_core(state))

    def model_input(self, state: Dict[str, Any]) -> List[BaseMessage]:
        """Stores the state's new messages; the session's context to call the
        model with, the state left unchanged (nothing replayed into streams)."""
        if self.memory == "none":
            return list(state.get("messages") or [])
        return self._drive(self._input_core(state))

    async def amodel_input(self, state: Dict[str, Any]) -> List[BaseMessage]:
        """Async :meth:`model_input`."""
        if self.memory == "none":
            return list(state.get("messages") or [])
        return await self._adrive(self._input_core(state))

    def store_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Stores what the state holds and the session lacks."""
        if self.memory != "none":
            self._drive(self._after_core(state, final=True))
        return {}

    async def astore_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Async :meth:`store_state`."""
        if self.memory != "none":
            await self._adrive(self._after_core(state, final=True))
        return {}
