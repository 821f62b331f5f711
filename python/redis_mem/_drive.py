"""One core for sync and async: a generator that yields I/O requests (ops)
and receives their results, driven by a sync or an async executor. Used by
the agent middleware and the reply streams."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Tuple, TypeVar

T = TypeVar("T")
#: An I/O request a core yields: its kind, then its arguments.
Op = Tuple[Any, ...]
#: A core: yields ops, receives their results, returns a T.
Core = Generator[Op, Any, T]


def drive(core: Core[T], do: Callable[[Op], Any]) -> T:
    """Runs ``core``, answering each I/O request with ``do`` (exceptions are
    thrown into the core)."""
    try:
        op = next(core)
        while True:
            try:
                result = do(op)
            except Exception as err:
                op = core.throw(err)
                continue
            op = core.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(core: Core[T], do: Callable[[Op], Awaitable[Any]]) -> T:
    """:func:`drive` with an async ``do``."""
    try:
        op = next(core)
        while True:
            try:
                result = await do(op)
            except Exception as err:
                op = core.throw(err)
                continue
            op = core.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
