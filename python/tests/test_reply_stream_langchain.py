"""ReplyStreamCallback / AsyncReplyStreamCallback: a LangChain 1.x agent
(create_agent) streamed with the callback writes its answer's tokens to a
ReplyStream that a reader on another connection follows, and the run's end
stores the reply once; with RedisMemMiddleware (store=False) the middleware
stores it and nothing twice. Real server, a streaming scripted model."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator, List

import pytest
import redis
import redis.asyncio
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool

from redis_mem import AsyncReplyStream, RedisMemClient, ReplyStream
from redis_mem.middleware import RedisMemMiddleware
from redis_mem.stream_callbacks import AsyncReplyStreamCallback, ReplyStreamCallback

ANSWER = "The sum of 2 and 3 is 5, as the add tool says."


@tool
def add(a: int, b: int) -> int:
    """Adds a and b."""
    return a + b


def _words(text: str) -> List[str]:
    out = []
    for i, w in enumerate(text.split(" ")):
        out.append(w if i == 0 else " " + w)
    return out


class StreamingCalculator(BaseChatModel):
    """Asked anything, calls add(2, 3) first; given the result, streams
    ANSWER word by word (or fails midway with ``fail=True``)."""

    fail: bool = False

    @property
    def _llm_type(self) -> str:
        return "streaming-calculator"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "StreamingCalculator":
        return self

    def _reply(self, messages: List[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage(ANSWER)
        n = sum(isinstance(m, HumanMessage) for m in messages)
        return AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": f"call_{n}"}])

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(list(messages)))])

    def _stream(self, messages, stop=None, run_manager=None, **kwargs) -> Iterator[ChatGenerationChunk]:
        reply = self._reply(list(messages))
        if reply.tool_calls:
            call = reply.tool_calls[0]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[
                {"name": call["name"], "args": '{"a": 2, "b": 3}', "id": call["id"], "index": 0}]))
            return
        for i, w in enumerate(_words(reply.text)):
            if self.fail and i == 4:
                raise RuntimeError("provider connection reset")
            yield ChatGenerationChunk(message=AIMessageChunk(content=w))


def follow(port: int, key: str, reply_id: str, out: list) -> threading.Thread:
    """A reader on its own connection, as the SSE endpoint of another process."""
    def run():
        r = redis.Redis(port=port, decode_responses=True)
        out.extend(ReplyStream(r, key, reply_id).events(block=100, idle_timeout=20))
        r.close()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_agent_stream_feeds_the_reply_stream_and_stores_once(r, clean):
    stream = ReplyStream(r, "mem:{alice}")
    seen: list = []
    reader = follow(clean.port, "mem:{alice}", stream.reply_id, seen)
    agent = create_agent(StreamingCalculator(), [add])
    cb = ReplyStreamCallback(stream, meta={"model": "streaming-calculator"})
    list(agent.stream({"messages": [HumanMessage("add 2 3")]}, {"callbacks": [cb]}, stream_mode="messages"))
    reader.join(timeout=20)
    assert not reader.is_alive()
    assert [e.text for e in seen if e.type == "chunk"] == _words(ANSWER)
    assert seen[-1].type == "end" and [e.type for e in seen].count("end") == 1
    stored = [m for m in RedisMemClient(r).get("mem:{alice}") if m.role == "assistant"]
    assert [(m.content, m.msgid, m.meta) for m in stored] == [(ANSWER, stream.reply_id,
                                                              {"model": "streaming-calculator"})]


def test_with_the_middleware_the_stream_only_carries_the_reply(r):
    stream = ReplyStream(r, "mem:{alice}", store=False)
    memory = RedisMemMiddleware(r)
    agent = create_agent(StreamingCalculator(), [add], middleware=[memory])
    list(agent.stream({"messages": [HumanMessage("add 2 3", id="h1")]},
                      {"configurable": {"thread_id": "alice"}, "callbacks": [ReplyStreamCallback(stream)]},
                      stream_mode="messages"))
    assert "".join(stream.chunks(idle_timeout=5)) == ANSWER
    entries = RedisMemClient(r).get("mem:{alice}")
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert entries[-1].content == ANSWER
    assert [e.content for e in entries].count(ANSWER) == 1


def test_a_failing_model_ends_the_stream_with_an_error(r):
    stream = ReplyStream(r, "mem:{alice}")
    agent = create_agent(StreamingCalculator(fail=True), [add])
    with pytest.raises(RuntimeError, match="connection reset"):
        list(agent.stream({"messages": [HumanMessage("add 2 3")]}, {"callbacks": [ReplyStreamCallback(stream)]},
                          stream_mode="messages"))
    events = stream.read()
    assert [e.text for e in events if e.type == "chunk"] == _words(ANSWER)[:4]
    assert events[-1].type == "error" and "connection reset" in events[-1].text
    assert RedisMemClient(r).get("mem:{alice}") == []


def test_a_lone_model_stream_finishes_on_its_end(r):
    stream = ReplyStream(r, "mem:{alice}")
    model = StreamingCalculator()
    text = "".join(c.text for c in model.stream([HumanMessage("x"), ToolMessage("5", tool_call_id="c")],
                                                config={"callbacks": [ReplyStreamCallback(stream)]}))
    assert text == ANSWER
    assert stream.finished is not None and stream.finished.type == "end"
    assert [m.content for m in RedisMemClient(r).get("mem:{alice}")] == [ANSWER]


def test_content_block_tokens_are_streamed_as_text(r):
    stream = ReplyStream(r, "mem:{alice}", store=False)
    cb = ReplyStreamCallback(stream, finish=False)
    import uuid
    run = uuid.uuid4()
    cb.on_chat_model_start({}, [], run_id=run)
    cb.on_llm_new_token([{"type": "text", "text": "Hi", "index": 0}], run_id=run)  # type: ignore[arg-type]
    cb.on_llm_new_token([{"type": "reasoning", "reasoning": "hmm"}], run_id=run)  # type: ignore[arg-type]
    cb.on_llm_new_token("", run_id=run)
    cb.on_llm_new_token(" there", run_id=run, tags=["nostream"])
    cb.on_llm_new_token(" you", run_id=run)
    cb.on_llm_end(None, run_id=run)
    assert [e.text for e in stream.read()] == ["Hi", " you"]
    assert stream.finished is None  # finish=False: the caller ends it


def test_async_agent_astream_with_the_async_callback(clean):
    async def main():
        ar = redis.asyncio.Redis(port=clean.port, decode_responses=True)
        try:
            stream = AsyncReplyStream(ar, "mem:{bob}")
            reader = AsyncReplyStream(ar, "mem:{bob}", stream.reply_id)

            async def read_all():
                return [e async for e in reader.events(block=100, idle_timeout=20)]

            task = asyncio.create_task(read_all())
            agent = create_agent(StreamingCalculator(), [add])
            async for _ in agent.astream({"messages": [HumanMessage("add 2 3")]},
                                         {"callbacks": [AsyncReplyStreamCallback(stream)]}, stream_mode="messages"):
                pass
            events = await task
            assert [e.text for e in events if e.type == "chunk"] == _words(ANSWER)
            assert events[-1].type == "end"
        finally:
            await ar.aclose()

    asyncio.run(main())
    stored = [m.content for m in RedisMemClient(clean.client()).get("mem:{bob}") if m.role == "assistant"]
    assert stored == [ANSWER]
