"""Every exception class of grammarmask: one family per kind of bad input, so callers can
catch precisely."""

from __future__ import annotations


class GrammarMaskError(Exception):
    """Base of every error grammarmask raises on purpose."""


class VocabularyError(GrammarMaskError, ValueError):
    """A tokenizer or logits width that cannot be turned into a sound vocabulary."""


class GrammarError(GrammarMaskError, ValueError):
    """A grammar spec that cannot be served; the message names the problem."""


class InvalidJSONError(GrammarError):
    """Schema text that is not JSON at all."""


class InvalidSchemaError(GrammarError):
    """A JSON document that is not a valid JSON Schema; `pointer` locates the offending part."""

    def __init__(self, message: str, pointer: str = "") -> None:
        super().__init__(f"{message} (at {pointer or '/'})")
        self.pointer = pointer


class InvalidRegexError(GrammarError):
    """A regular expression that does not parse."""


class InvalidEBNFError(GrammarError):
    """An EBNF grammar that does not parse."""


class InvalidChoiceError(GrammarError):
    """A choice list that is empty or holds something other than non-empty strings."""


class UnsupportedGrammarError(GrammarError):
    """A valid spec that a backend refuses to compile (a feature it does not implement)."""


class CompileError(GrammarError):
    """A backend failed while compiling a spec it should support."""


class CompileMemoryError(CompileError):
    """A compile that went past its memory bound (`compile_memory_bytes`) and was ended."""


class CompileTimeoutError(GrammarError):
    """Compilation did not finish within the allowed time; `limit_s` is that time where the
    compile was ended at it."""

    def __init__(self, message: str, limit_s: float | None = None) -> None:
        super().__init__(message)
        self.limit_s = limit_s

    def __reduce__(self) -> tuple[type[CompileTimeoutError], tuple[str, float | None]]:
        return type(self), (str(self), self.limit_s)


class CompileAbandonedError(CompileTimeoutError):
    """Internal: a compile ended because no request waits for it any more; never kept as
    any request's reason."""


class UnreadablePatternError(GrammarMaskError, ValueError):
    """Internal: a pattern outside the constructs the lowering's regex reader reads, or an
    automaton past its size limits; the lowering then keeps the pattern as written or refuses."""


class GrammarTooLargeError(GrammarError):
    """A spec over a size or nesting limit (`GrammarLimits`): bounded before any backend
    spends memory, threads or Python's recursion limit on it."""


class NotFullyEnforcedError(GrammarError):
    """backend="auto" found no installed backend that enforces all of a grammar; `reasons`
    maps each backend to what it leaves out or why it refused."""

    def __init__(self, message: str, reasons: dict[str, tuple[str, ...]]) -> None:
        super().__init__(message)
        self.reasons = reasons


class BatchError(GrammarMaskError, ValueError):
    """A batch whose layout is inconsistent: the engine's mistake, not one request's."""


class ApplyError(GrammarMaskError, ValueError):
    """Logits that do not fit the masks: the engine's mistake, raised at once."""


class SettingsError(GrammarMaskError, ValueError):
    """Plugin settings (vLLM's `additional_config["grammarmask"]`) that cannot be used; the
    engine does not start."""


class RequestSpecError(GrammarError):
    """A request's grammarmask entry (vLLM's `extra_args`) that cannot be served; the message
    says what to change."""


class WorkerStartError(GrammarMaskError, RuntimeError):
    """A process-isolated pool's worker process could not start (it died, failed or hung
    before it was ready); the message says what happened and what to do."""


class ServerStartError(GrammarMaskError, RuntimeError):
    """vLLM's server (started by grammarmask's tools) exited or did not answer /health in
    time; the message holds the end of its log."""


class RequestFault(GrammarMaskError):
    """A problem that fails one request. Internal: caught where it is raised and kept as the
    request's reason, never raised to the engine."""


class WorkerGone(GrammarMaskError):
    """Internal: a worker process died or hung during a call; its requests have been
    failed, and it has been replaced."""


class SchemaJudgeError(GrammarMaskError):
    """jsonschema cannot judge instances of a schema (an unresolvable $ref, a pattern
    Python's re cannot read): such a verdict is neither a pass nor a fail."""


class Counterexample(AssertionError):
    """A fuzzing property failed; the message shows the shrunk example."""
