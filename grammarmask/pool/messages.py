"""The messages between a pool and its worker processes, one record type each.

A worker answers every `Commit` and `StateQuery` with a RequestState and every `Fill` with
`Begun` then a FillResult; it announces itself with `Ready` once it can take requests, or
says `StartFailed` and exits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..grammars import Grammar
from ..masks import RequestId
from .requests import RequestState
from .step_fill import FillEntry, FillResult


@dataclass(frozen=True, slots=True)
class Add:
    """Register a request, then replay `commits` (a replacement worker's replay)."""

    request_id: RequestId
    grammar: Grammar | None
    backend: str
    allow_unenforced: bool
    commits: Sequence[tuple[int, ...]] = ()
    replay: bool = False
    """The grammar compiled before: no tight compile timeout for it in a cold cache."""


@dataclass(frozen=True, slots=True)
class _AboutRequest:
    request_id: RequestId


class Remove(_AboutRequest):
    """Forget the request."""

    __slots__ = ()


class StateQuery(_AboutRequest):
    """Answer with the request's RequestState."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Commit(_AboutRequest):
    """Advance the request by `tokens`; answer with its RequestState."""

    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Fill:
    """Fill these entries' rows into host slot `slot` of the shared ring."""

    slot: int
    entries: Sequence[FillEntry]
    batch_one_row: bool
    """Batch calls for one-row requests are allowed (the step has no deadline)."""


@dataclass(frozen=True, slots=True)
class Close:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker's greeting: it has built its compiler and table."""

    pid: int


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The worker could not build its compiler or table; it exits after sending this."""

    error: str
    """The exception, in one line (`RuntimeError: ...`)."""
    traceback: str


@dataclass(frozen=True, slots=True)
class Begun:
    """The worker took a Fill up (its deadline counts from here)."""


ToWorker = Add | Remove | Commit | StateQuery | Fill | Close
FromWorker = Ready | StartFailed | Begun | FillResult | RequestState
