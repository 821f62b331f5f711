"""LangChain callbacks that feed a model's or an agent's streamed tokens into a
:class:`redis_mem.ReplyStream` (the seed's stream buffer), and end it when
the run ends.

    from redis_mem import ReplyStream
    from redis_mem.stream_callbacks import ReplyStreamCallback

    stream = ReplyStream(redis.Redis(), "mem:{alice}")        # stream.reply_id to the front end
    agent = create_agent(model, tools)
    for _ in agent.stream({"messages": [HumanMessage("hi")]}, {"callbacks": [ReplyStreamCallback(stream)]},
                          stream_mode="messages"):
        pass
    # every text token of every model call went to the stream; when the run
    # ended, stream.finish() stored the reply (one MEM.APPEND, MSGID = reply id)

The run the callback first sees start without a parent (the agent's graph,
or a lone chat model) is the reply: its end finishes the stream, its error
ends it with an error event. Tokens of runs tagged ``nostream`` (LangGraph's
convention) are left out. A model streams its tokens to callbacks when it is
streamed: ``agent.stream(..., stream_mode="messages")`` / ``astream``,
``model.stream(...)``, or a model made with ``streaming=True``.

With :class:`redis_mem.middleware.RedisMemMiddleware`, which stores the
agent's messages itself, give the stream ``store=False``: the middleware
stores the answer, the stream only carries it to the front end.

Needs the ``langchain`` extra.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional
from uuid import UUID

try:
    from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("redis_mem.stream_callbacks needs langchain-core: pip install 'redis-mem[langchain]'") from e

from .reply_stream import AsyncReplyStream, ReplyStream

__all__ = ["AsyncReplyStreamCallback", "ReplyStreamCallback"]


class _Tracker:
    """Which run is the reply (the first one without a parent)."""

    def __init__(self) -> None:
        self.root: Optional[UUID] = None

    def started(self, run_id: UUID, parent_run_id: Optional[UUID]) -> None:
        if self.root is None and parent_run_id is None:
            self.root = run_id

    def is_root(self, run_id: UUID) -> bool:
        return self.root is not None and run_id == self.root


def _token_text(token: Any, tags: Optional[List[str]]) -> str:
    """The text of a streamed token: a str, or (content blocks: Anthropic,
    ``output_version="v1"``) the text of its ``text`` blocks; "" for a tool
    call's chunk, a reasoning block, or a run tagged ``nostream``."""
    if tags and "nostream" in tags:
        return ""
    if isinstance(token, str):
        return token
    if isinstance(token, list):
        parts = []
        for block in token:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "".join(parts)
    return ""


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class ReplyStreamCallback(BaseCallbackHandler):
    """Writes each text token (``on_llm_new_token``) to ``stream``; when the
    reply's run ends, ``stream.finish(meta)`` (``finish=False``: left to the
    caller); when it fails, ``stream.error(...)``. Runs inline, so tokens
    reach the stream in order even in an async run."""

    run_inline = True

    def __init__(self, stream: ReplyStream, *, finish: bool = True, meta: Optional[Mapping[str, Any]] = None):
        self.stream = stream
        self.auto_finish = finish
        self.meta: Optional[Dict[str, Any]] = dict(meta) if meta else None
        self._runs = _Tracker()

    def on_chain_start(self, serialized: Optional[Dict[str, Any]], inputs: Any, *, run_id: UUID,
                       parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (the first one without a parent)."""
        self._runs.started(run_id, parent_run_id)

    def on_chat_model_start(self, serialized: Optional[Dict[str, Any]], messages: Any, *, run_id: UUID,
                            parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (a lone chat model's)."""
        self._runs.started(run_id, parent_run_id)

    def on_llm_start(self, serialized: Optional[Dict[str, Any]], prompts: List[str], *, run_id: UUID,
                     parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (a lone LLM's)."""
        self._runs.started(run_id, parent_run_id)

    def on_llm_new_token(self, token: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                         tags: Optional[List[str]] = None, **kwargs: Any) -> None:
        """Writes the token's text to the stream."""
        text = _token_text(token, tags)
        if text and self.stream.finished is None:
            self.stream.write(text)

    def _ended(self, run_id: UUID) -> None:
        if self._runs.is_root(run_id) and self.auto_finish and self.stream.finished is None:
            self.stream.finish(self.meta)

    def _failed(self, error: BaseException, run_id: UUID) -> None:
        if self._runs.is_root(run_id) and self.stream.finished is None:
            self.stream.error(_error_text(error))

    def on_llm_end(self, response: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                   **kwargs: Any) -> None:
        """Finishes the stream when the reply's run ended."""
        self._ended(run_id)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                     **kwargs: Any) -> None:
        """Finishes the stream when the reply's run ended."""
        self._ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                     **kwargs: Any) -> None:
        """Ends the stream with an error event when the reply's run failed."""
        self._failed(error, run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                       **kwargs: Any) -> None:
        """Ends the stream with an error event when the reply's run failed."""
        self._failed(error, run_id)


class AsyncReplyStreamCallback(AsyncCallbackHandler):
    """:class:`ReplyStreamCallback` for asyncio runs (``agent.astream``,
    ``model.astream``), writing to an :class:`AsyncReplyStream`."""

    def __init__(self, stream: AsyncReplyStream, *, finish: bool = True, meta: Optional[Mapping[str, Any]] = None):
        self.stream = stream
        self.auto_finish = finish
        self.meta: Optional[Dict[str, Any]] = dict(meta) if meta else None
        self._runs = _Tracker()

    async def on_chain_start(self, serialized: Optional[Dict[str, Any]], inputs: Any, *, run_id: UUID,
                             parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (the first one without a parent)."""
        self._runs.started(run_id, parent_run_id)

    async def on_chat_model_start(self, serialized: Optional[Dict[str, Any]], messages: Any, *, run_id: UUID,
                                  parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (a lone chat model's)."""
        self._runs.started(run_id, parent_run_id)

    async def on_llm_start(self, serialized: Optional[Dict[str, Any]], prompts: List[str], *, run_id: UUID,
                           parent_run_id: Optional[UUID] = None, **kwargs: Any) -> None:
        """Notes the reply's run (a lone LLM's)."""
        self._runs.started(run_id, parent_run_id)

    async def on_llm_new_token(self, token: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                               tags: Optional[List[str]] = None, **kwargs: Any) -> None:
        """Writes the token's text to the stream."""
        text = _token_text(token, tags)
        if text and self.stream.finished is None:
            await self.stream.write(text)

    async def _ended(self, run_id: UUID) -> None:
        if self._runs.is_root(run_id) and self.auto_finish and self.stream.finished is None:
            await self.stream.finish(self.meta)

    async def _failed(self, error: BaseException, run_id: UUID) -> None:
        if self._runs.is_root(run_id) and self.stream.finished is None:
            await self.stream.error(_error_text(error))

    async def on_llm_end(self, response: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                         **kwargs: Any) -> None:
        """Finishes the stream when the reply's run ended."""
        await self._ended(run_id)

    async def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                           **kwargs: Any) -> None:
        """Finishes the stream when the reply's run ended."""
        await self._ended(run_id)

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                           **kwargs: Any) -> None:
        """Ends the stream with an error event when the reply's run failed."""
        await self._failed(error, run_id)

    async def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: Optional[UUID] = None,
                             **kwargs: Any) -> None:
        """Ends the stream with an error event when the reply's run failed."""
        await self._failed(error, run_id)
