"""What a summary is made from: one prompt shared by the summarizer service
and the middleware's inline summaries (OpenAI-style role/content dicts, which
an OpenAI-compatible endpoint and every LangChain chat model accept)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ._replies import Message

__all__ = ["SUMMARY_PROMPT", "summary_prompt", "split_for_summary"]

SUMMARY_PROMPT = (
    "You maintain the running summary of a chat session. Merge the previous "
    "summary (if any) with the new messages into one concise summary that keeps "
    "facts, decisions, names, open questions and tool results needed to continue "
    "the conversation. Reply with the summary only."
)


def split_for_summary(entries: Sequence[Message], upto: int) -> Tuple[Optional[str], List[Message]]:
    """(previous summary text or None, the messages with id <= upto)."""
    previous = None
    todo: List[Message] = []
    for e in entries:
        if e.is_summary:
            previous = e.content
        elif e.id <= upto:
            todo.append(e)
    return previous, todo


def transcript(previous: Optional[str], todo: Sequence[Message]) -> str:
    lines = "\n".join(f"{m.role}: {m.content}" for m in todo)
    return (f"Previous summary:\n{previous}\n\n" if previous else "") + f"New messages:\n{lines}"


def summary_prompt(entries: Sequence[Message], upto: int, instructions: str = SUMMARY_PROMPT) -> List[Dict[str, str]]:
    previous, todo = split_for_summary(entries, upto)
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": transcript(previous, todo)},
    ]
