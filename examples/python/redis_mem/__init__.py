"""Python side of redis-mem: a typed client, a LangChain chat history, and
helpers for the summarizer worker and the migration script."""

from .client import (
    SUMMARY_ROLE,
    AppendResult,
    Message,
    RedisMemClient,
    SessionInfo,
    SummarizeBegin,
    SummarizeCheck,
)

__all__ = [
    "SUMMARY_ROLE",
    "AppendResult",
    "Message",
    "RedisMemClient",
    "SessionInfo",
    "SummarizeBegin",
    "SummarizeCheck",
]
