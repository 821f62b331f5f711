"""What makes a summary: the prompt shared by the summarizer service and the
middleware's inline summaries (OpenAI-style role/content dicts, which an
OpenAI-compatible endpoint and every LangChain chat model accept), and the
summarize functions the service can use: an OpenAI-compatible endpoint
(standard library only), any LangChain chat model, or an offline extractive
summary."""

from __future__ import annotations

import json
import os
import unicodedata
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._replies import Message

__all__ = [
    "SUMMARY_PROMPT",
    "Entry",
    "Summary",
    "SummarizeFn",
    "checked_summary",
    "NoSummarizer",
    "transcript",
    "default_summarizer",
    "extractive_summarize",
    "langchain_summarizer",
    "openai_summarizer",
    "split_for_summary",
    "summary_prompt",
]

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


def _tool_calls(meta: Any) -> List[str]:
    """The tool calls of a message's META (LangChain's or OpenAI's shape) as
    ``name(arguments)``."""
    calls = (meta or {}).get("tool_calls") if isinstance(meta, dict) else None
    out = []
    for c in calls or []:
        if not isinstance(c, dict):
            continue
        fn = c.get("function") if isinstance(c.get("function"), dict) else None
        name = (fn or c).get("name") or "?"
        args: Any = fn.get("arguments") if fn else c.get("args")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False, sort_keys=True)
        out.append(f"{name}({args})")
    return out


def _line(m: Any) -> str:
    meta = getattr(m, "meta", None)
    calls = _tool_calls(meta)
    if calls:
        text = f"{m.role}: {m.content}\n" if m.content else f"{m.role}: "
        return text + "[called " + "; ".join(calls) + "]"
    if m.role == "tool" and isinstance(meta, dict):
        name = meta.get("name") or meta.get("tool_call_id") or "tool"
        return f"tool {name} returned: {m.content}"
    return f"{m.role}: {m.content}"


def transcript(previous: Optional[str], todo: Sequence[Any]) -> str:
    """The user turn of the summary prompt: the previous summary and the
    messages to fold in, tool calls shown with their name and arguments."""
    lines = "\n".join(_line(m) for m in todo)
    return (f"Previous summary:\n{previous}\n\n" if previous else "") + f"New messages:\n{lines}"


def summary_prompt(entries: Sequence[Message], upto: int, instructions: str = SUMMARY_PROMPT) -> List[Dict[str, str]]:
    """The chat prompt (system instructions, then the previous summary and
    the messages with id <= ``upto``) as OpenAI-style role/content dicts."""
    previous, todo = split_for_summary(entries, upto)
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": transcript(previous, todo)},
    ]


class Summary(str):
    """A summary text that knows what the LLM call cost, when the endpoint
    said (``usage``): for the service's log line."""

    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]

    def __new__(cls, text: str, prompt_tokens: Optional[int] = None,
                completion_tokens: Optional[int] = None) -> "Summary":
        obj = super().__new__(cls, text)
        obj.prompt_tokens = prompt_tokens
        obj.completion_tokens = completion_tokens
        return obj


#: Blank fillers: letters by category that show nothing.
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
#: Categories that show nothing alone: controls, format, unassigned, white
#: space, marks without a base (combining accents, variation selectors).
_INVISIBLE = frozenset(("Cc", "Cf", "Cn", "Zs", "Zl", "Zp", "Mn", "Mc", "Me"))


def _shows_nothing(text: str) -> bool:
    """The module's rule (MEM.SUMMARIZE refuses such a summary): only white
    space, control, format and unassigned characters, marks without a base
    and blank fillers."""
    return all(c.isspace() or c in _FILLERS or unicodedata.category(c) in _INVISIBLE for c in text)


def checked_summary(text: object) -> str:
    """What a summarize function returned, if it is a summary: a str (a
    subclass may carry token usage) that is not blank and is valid UTF-8.
    Anything else is a failed call (retried, counted, looked at again): a
    blank summary would replace the messages with nothing."""
    if not isinstance(text, str):
        raise TypeError(f"the summarize function returned {type(text).__name__}, not str")
    if _shows_nothing(text):
        raise ValueError("the summarize function returned an empty summary (only white space or invisible "
                         "characters)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"the summary is not valid UTF-8: {err.reason}") from None
    return text


#: summarize_fn(previous_summary or None, messages to fold in) -> summary text
SummarizeFn = Callable[[Optional[str], Sequence["Entry"]], str]


@dataclass(frozen=True)
class Entry:
    """A message handed to a summarize function (``meta``: its META, where
    tool calls and tool names are)."""

    id: int
    role: str
    content: str
    ts: int
    meta: Optional[Dict[str, Any]] = None


# --------------------------------------------------------------------------
# Summarize functions
# --------------------------------------------------------------------------

def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for i, ch in enumerate(text):
        if ch in ".!?" and (i + 1 == len(text) or text[i + 1] == " ") and i >= 20:
            return text[: i + 1]
    return text


def extractive_summarize(
    previous: Optional[str],
    messages: Sequence[Entry],
    per_message: int = 160,
    max_chars: int = 4000,
) -> str:
    """Offline default: the previous summary plus the first sentence of each
    message (clipped), newest kept when the result gets too long."""
    lines = [f"- {m.role}: {_clip(_first_sentence(m.content), per_message)}"
             for m in messages if m.content.strip()]
    head = _clip(previous, max_chars // 2) if previous else ""
    # Room for the head, its newline and an "(N earlier messages omitted)" line.
    budget = max_chars - len(head) - 1 - 40
    kept: List[str] = []
    for line in reversed(lines):
        if budget - len(line) - 1 < 0:
            break
        kept.append(line)
        budget -= len(line) + 1
    kept.reverse()
    dropped = len(lines) - len(kept)
    parts = []
    if head:
        parts.append(head)
    if dropped:
        parts.append(f"({dropped} earlier messages omitted)")
    parts.extend(kept)
    return "\n".join(parts) if parts else "(empty conversation)"


SYSTEM_PROMPT = SUMMARY_PROMPT


def openai_summarizer(
    base_url: str,
    api_key: Optional[str] = None,
    model: str = "gpt-4o-mini",
    timeout: float = 60.0,
) -> SummarizeFn:
    """A summarize function calling an OpenAI-compatible
    `POST {base_url}/chat/completions` with the standard library only."""
    url = base_url.rstrip("/") + "/chat/completions"

    def summarize(previous: Optional[str], messages: Sequence[Entry]) -> str:
        user = transcript(previous, messages)
        body = json.dumps(
            {
                "model": model,
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": user},
                ],
                "temperature": 0.2,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.load(resp)
        text = reply["choices"][0]["message"]["content"]
        if not isinstance(text, str) or not text.strip():
            raise ValueError("the endpoint returned an empty summary")
        usage = reply.get("usage") or {}
        return Summary(text.strip(), usage.get("prompt_tokens"), usage.get("completion_tokens"))

    return summarize


def langchain_summarizer(model: Any, instructions: str = SUMMARY_PROMPT) -> SummarizeFn:
    """A summarize function calling any LangChain chat model
    (``init_chat_model("openai:gpt-4o-mini")``, ``ChatAnthropic(...)``, ...)."""

    def summarize(previous: Optional[str], messages: Sequence[Entry]) -> str:
        reply = model.invoke([
            {"role": "system", "content": instructions},
            {"role": "user", "content": transcript(previous, messages)},
        ])
        text = reply.text if isinstance(reply.text, str) else reply.text()
        if not text.strip():
            raise ValueError("the model returned an empty summary")
        usage = getattr(reply, "usage_metadata", None) or {}
        return Summary(text.strip(), usage.get("input_tokens"), usage.get("output_tokens"))

    return summarize


class NoSummarizer(RuntimeError):
    """No LLM is configured and the extractive fallback was not asked for."""


NO_LLM = ("no LLM configured for summaries: set OPENAI_BASE_URL and/or OPENAI_API_KEY (an OpenAI-compatible "
          "endpoint), or give --langchain-model provider:model; --extractive (allow_extractive=True) uses an "
          "offline extractive summary instead, which keeps only the first sentence of each message and loses "
          "the rest")


def default_summarizer(allow_extractive: bool = False) -> SummarizeFn:
    """An OpenAI-compatible endpoint when OPENAI_BASE_URL or OPENAI_API_KEY
    is set. Otherwise the offline extractive summary if
    ``allow_extractive``, else :class:`NoSummarizer` (an extractive summary
    drops most of what it folds in: it is never used unasked)."""
    base = os.environ.get("OPENAI_BASE_URL")
    key = os.environ.get("OPENAI_API_KEY")
    if base or key:
        return openai_summarizer(
            base or "https://api.openai.com/v1",
            key,
            model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
            timeout=float(os.environ.get("OPENAI_TIMEOUT", "60")),
        )
    if allow_extractive:
        return extractive_summarize
    raise NoSummarizer(NO_LLM)
