"""The matcher pool: requests' matchers on threads or worker processes, and the step's
mask fill (see docs/design.md)."""

from .future import MaskFuture
from .pool import MatcherPool
from .requests import Readiness, RequestState, Status

__all__ = ["MaskFuture", "MatcherPool", "Readiness", "RequestState", "Status"]
