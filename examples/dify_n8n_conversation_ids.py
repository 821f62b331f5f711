"""Dify / n8n adapters: keep the orchestrator's conversation id with the
redis-mem session (MEM.EXTSET / MEM.EXTGET), no key of your own.

    REDIS_URL=redis://localhost:6379/0 python examples/dify_n8n_conversation_ids.py

Dify answers the first message of a conversation with a `conversation_id`
and wants it back on every later one; n8n's chat trigger takes a `sessionId`
the caller chooses. `dify_chat` below stands in for
`POST {DIFY_URL}/v1/chat-messages` so the example runs offline.
"""

import os
import uuid

import redis

from redis_mem import ConversationIds, RedisMemClient


def dify_chat(query: str, conversation_id: str) -> dict:
    """Stand-in for Dify's chat-messages API: a new id when given ""."""
    return {"answer": f"(dify) you said {query!r}", "conversation_id": conversation_id or f"dify-{uuid.uuid4().hex[:8]}"}


def main():
    r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379/0"), decode_responses=True)
    mem = RedisMemClient(r)
    dify = ConversationIds(r, "dify", ex=24 * 3600)
    n8n = ConversationIds(r, "n8n")
    user = "carol"
    for text in ("Hi", "Where is my order?"):
        reply = dify_chat(text, dify.get(user) or "")       # "" on the first message
        dify.remember(user, reply["conversation_id"])        # stored beside the session, expiring with it
        mem.append(f"mem:{{{user}}}", "user", text)
        mem.append(f"mem:{{{user}}}", "assistant", reply["answer"])
        print(reply["conversation_id"], reply["answer"])
    session_id = n8n.get_or_create(user, lambda: uuid.uuid4().hex)  # n8n's sessionId, chosen once
    print("n8n sessionId:", session_id, "| dify:", dify.get(user))


if __name__ == "__main__":
    main()
