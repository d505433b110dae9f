"""A reference engine loop to copy: grammar masks, drafts, verification, streaming text;
with the sampling and detokenizing it uses."""

from .detokenize import IncrementalDetokenizer
from .engine import (
    CausalModel,
    GenerationRequest,
    GenerationResult,
    ReferenceEngine,
    propose_ngram,
)
from .sampling import SamplingParams, verify_drafts

__all__ = [
    "CausalModel",
    "GenerationRequest",
    "GenerationResult",
    "IncrementalDetokenizer",
    "ReferenceEngine",
    "SamplingParams",
    "propose_ngram",
    "verify_drafts",
]
