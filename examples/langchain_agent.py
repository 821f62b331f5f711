"""A LangChain 1.x agent whose memory is a redis-mem session.

    REDIS_URL=redis://localhost:6379/0 python examples/langchain_agent.py
    OPENAI_API_KEY=... python examples/langchain_agent.py     # a real model

No checkpointer: the session `mem:{<thread_id>}` is the memory. Each run
continues the conversation of thread "demo". Without OPENAI_API_KEY a
scripted stand-in model is used, so the example runs offline.
"""

import os

import redis
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from redis_mem import RedisMemClient
from redis_mem.middleware import RedisMemMiddleware


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny, 24 C in {city}"


class OfflineModel(FakeMessagesListChatModel):
    """Calls the tool, then answers with its result (stands in for an LLM)."""

    def bind_tools(self, tools, **kwargs):
        return self


def model():
    if os.environ.get("OPENAI_API_KEY"):
        from langchain.chat_models import init_chat_model

        return init_chat_model("openai:gpt-4o-mini")
    return OfflineModel(responses=[
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Lisbon"}, "id": "call_1"}]),
        AIMessage("It is sunny and 24 C in Lisbon."),
    ])


def main():
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    memory = RedisMemMiddleware(
        r,
        budget=8000,           # tokens of context per model call (summary + newest messages)
        model="gpt-4o-mini",   # the session's tokenizer / context window
        ttl=24 * 3600,         # sliding expiry, as the stack it replaces
        # summary_model=init_chat_model("openai:gpt-4o-mini"),  # summarize inline;
        # by default the redis-mem-summarizer service does it
    )
    agent = create_agent(model(), [get_weather], middleware=[memory], system_prompt="You are a travel assistant.")
    config = {"configurable": {"thread_id": "demo"}}
    out = agent.invoke({"messages": [HumanMessage("What's the weather in Lisbon?")]}, config)
    print(out["messages"][-1].content)
    # RedisMemClient parses MEM.INFO's reply in either protocol (RESP2 array,
    # RESP3 map: redis-py 8 connects with RESP3 by default).
    info = RedisMemClient(r).info("mem:{demo}")
    print("session mem:{demo} holds", info.messages if info else 0, "messages")


if __name__ == "__main__":
    main()
