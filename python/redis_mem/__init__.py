"""redis-mem for Python: typed sync and asyncio clients of the redis-mem Redis
module, a LangChain 1.x agent middleware, LangGraph nodes, a summarizer
service, migration from other stores, orchestrator (Dify/n8n)
conversation ids, session context with its own lifetime (``SessionContext``),
resumable reply streams (``ReplyStream``) and a doctor (``redis-mem doctor``).

The LangChain/LangGraph parts need the ``langchain`` extra
(``pip install 'redis-mem[langchain]'``); the rest needs only redis-py.
"""

from ._commands import MAX_MSGID_BYTES, new_msgid
from .client import (
    SUMMARY_ROLE,
    AppendResult,
    AsyncRedisMemClient,
    Message,
    ModelInfo,
    RedisMemClient,
    SessionInfo,
    SummarizeBegin,
    SummarizeCheck,
)
from .conversation_ids import AsyncConversationIds, ConversationIds
from .reply_stream import (
    AsyncReplyStream,
    ReplyEvent,
    ReplyStream,
    ReplyStreamError,
    ReplyStreamGap,
    ReplyStreamTimeout,
    check_reply_id,
    reply_stream_key,
    valid_event_id,
)
from .session_context import AsyncSessionContext, SessionContext

__version__ = "0.2.0"

__all__ = [
    "MAX_MSGID_BYTES",
    "SUMMARY_ROLE",
    "AppendResult",
    "AsyncConversationIds",
    "AsyncRedisMemClient",
    "AsyncReplyStream",
    "AsyncSessionContext",
    "ConversationIds",
    "Message",
    "ModelInfo",
    "RedisMemClient",
    "ReplyEvent",
    "ReplyStream",
    "ReplyStreamError",
    "ReplyStreamGap",
    "ReplyStreamTimeout",
    "SessionContext",
    "SessionInfo",
    "SummarizeBegin",
    "SummarizeCheck",
    "new_msgid",
    "reply_stream_key",
    "check_reply_id",
    "valid_event_id",
]
