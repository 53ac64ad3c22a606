"""Map over an iterable with a pool, in order, holding at most `window` pending results."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def bounded_map(pool: Executor, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
    """Like `pool.map`, but reads `items` lazily so a large dataset is never all in memory."""
    pending: deque[Future[R]] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
