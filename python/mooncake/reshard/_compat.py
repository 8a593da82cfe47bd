"""Helpers for the oldest supported Python."""

from __future__ import annotations

from typing import Iterable, Iterator

_END = object()


def _strict_zip(*iterables: Iterable[object]) -> Iterator[tuple[object, ...]]:
    """``zip(..., strict=True)``, which Python 3.9 lacks."""

    iterators = [iter(item) for item in iterables]
    if not iterators:
        return
    while True:
        values = tuple(next(it, _END) for it in iterators)
        done = [value is _END for value in values]
        if all(done):
            return
        if any(done):
            raise ValueError("zip() arguments have different lengths")
        yield values
