"""Test doubles that are not Redis: a chat model whose answers the test
scripts (it emits tool calls like a real one), and an OpenAI-compatible HTTP
endpoint served by the test itself."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult


class ScriptedModel(BaseChatModel):
    """``respond(messages) -> AIMessage``; every prompt it got is recorded
    in ``prompts`` (system prompt included, as create_agent sends it)."""

    respond: Callable[[List[BaseMessage]], AIMessage]
    prompts: list = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        self.prompts.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.respond(list(messages)))])


def calculator_script(messages: List[BaseMessage]) -> AIMessage:
    """Asked "add A B", calls the add tool; given its result, answers with it;
    anything else is echoed."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return AIMessage(f"The sum is {last.content}.")
    text = str(last.content)
    if isinstance(last, HumanMessage) and text.startswith("add "):
        _, a, b = text.split()
        n = sum(isinstance(m, HumanMessage) for m in messages)
        return AIMessage("", tool_calls=[{"name": "add", "args": {"a": int(a), "b": int(b)}, "id": f"call_{n}_{a}_{b}"}])
    return AIMessage(f"You said: {text}")


class OpenAIStub:
    """POST /v1/chat/completions answering ``reply(request_json) -> str`` with
    an OpenAI-shaped body (usage included); ``fail_first`` requests get 503."""

    def __init__(self, reply: Callable[[dict], str], fail_first: int = 0):
        self.requests: List[dict] = []
        self.fail_first = fail_first
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                if len(stub.requests) <= stub.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                text = reply(body)
                out = json.dumps({
                    "id": "cmpl-1", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class NamedModel(ScriptedModel):
    """A :class:`ScriptedModel` with the attributes a provider's chat model
    has: its model name (ChatOpenAI's ``model_name``) and the reply's
    maximum (``max_tokens``, None: unset)."""

    model_name: str = "scripted"
    max_tokens: Optional[int] = None


def with_usage(script: Callable[[List[BaseMessage]], AIMessage], input_tokens: Callable[[List[BaseMessage]], int],
               output_tokens: Callable[[AIMessage], int], reasoning: int = 0) -> Callable[[List[BaseMessage]], AIMessage]:
    """``script``'s answers, each with the ``usage_metadata`` a provider
    reports: ``input_tokens(prompt)``, ``output_tokens(answer)`` (and
    ``reasoning`` of those as reasoning tokens, when not 0)."""
    def respond(messages: List[BaseMessage]) -> AIMessage:
        answer = script(messages)
        out = output_tokens(answer)
        usage: dict = {"input_tokens": input_tokens(messages), "output_tokens": out,
                       "total_tokens": input_tokens(messages) + out}
        if reasoning:
            usage["output_token_details"] = {"reasoning": reasoning}
        return answer.model_copy(update={"usage_metadata": usage})
    return respond
