"""A worker process of a process-isolated pool: its own compiler and RequestTable for the
pool's vocabulary, serving the pool's messages one at a time, in order.

Masks are written straight into the shared ring; the parent enforces deadlines (it kills a
worker that is late), so the worker's steps have none.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import traceback
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.shared_memory import SharedMemory
from typing import cast

from ..compiler import GrammarCompiler
from ..errors import GrammarMaskError
from ..vocabulary import Vocabulary
from .heap import HeapTrimmer
from .matchers import BackendFactory
from .messages import Add, Begun, Commit, Fill, Ready, Remove, StartFailed, StateQuery, ToWorker
from .requests import RequestTable
from .shared_ring import SharedRing
from .step_fill import StepEntries, StepFill
from .sync import StepSync

FILL_THREADS = 2
"""Fill threads per worker process: a hanging matcher holds up one, the other goes on."""
HANG_GRACE_S = 60.0
"""A worker that answers nothing this long past the compile timeout counts as hung."""


def load_vocabulary(memory_name: str, size: int) -> Vocabulary:
    """The pool's vocabulary, pickled by the parent into shared memory: handed over there
    rather than through the spawn pipe, whose write blocks the parent for good when a large
    payload meets a child that died before reading it."""
    memory = SharedMemory(name=memory_name)
    try:
        vocab: Vocabulary = pickle.loads(bytes(cast(memoryview, memory.buf)[:size]))
    finally:
        memory.close()
    return vocab


def worker_main(
    conn: multiprocessing.connection.Connection,
    vocab_memory: tuple[str, int],
    memory_name: str,
    shape: tuple[int, int, int],
    compile_timeout_s: float,
    backend_factory: BackendFactory | None,
    compile_memory_bytes: int | None = None,
) -> None:
    """Say `Ready` (or `StartFailed`, and exit 1), then serve messages until `Close` or the
    end of the pipe, and exit at once (without joining threads a hanging matcher may still
    hold)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        vocab = load_vocabulary(*vocab_memory)
        backends = backend_factory(vocab) if backend_factory is not None else None
        compiler = GrammarCompiler(
            vocab,
            timeout_s=compile_timeout_s,
            backends=backends,
            compile_memory_bytes=compile_memory_bytes,
        )
        table = RequestTable(vocab, compiler, compile_timeout_s)
        memory = SharedMemory(name=memory_name)
        host, progress = SharedRing.views(memory, shape)
    except BaseException as exc:  # the parent raises it, or fails the worker's requests
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        conn.send(StartFailed(error, traceback.format_exc()))
        os._exit(1)
    threads = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="grammarmask-fill")
    heap = HeapTrimmer()
    conn.send(Ready(os.getpid()))
    while True:
        try:
            message: ToWorker = conn.recv()
        except EOFError:
            break
        if isinstance(message, Fill):
            conn.send(Begun())
            entries = message.entries
            requests = table.lookup([e.request_id for e in entries])
            step = StepFill(table, StepEntries.of(entries), requests)
            result = step.run(
                host[message.slot],
                StepSync(None, fixed=True),
                threads,
                FILL_THREADS,
                progress[message.slot],
                batch_one_row=message.batch_one_row,
            )
            conn.send(result)
        elif isinstance(message, Commit):
            conn.send(table.commit(message.request_id, message.tokens))
        elif isinstance(message, StateQuery):
            conn.send(table.state(message.request_id))
        elif isinstance(message, Add):
            _add(table, message, compile_timeout_s)
        elif isinstance(message, Remove):
            table.remove(message.request_id)
            heap.maybe_trim()  # what the request's matcher (and an evicted grammar) freed
        else:
            break
    compiler.close()  # its compile processes end now, not at their next look at the pipe
    os._exit(0)


def _add(table: RequestTable, message: Add, compile_timeout_s: float) -> None:
    """Register the request (failed, if the table refuses it) and replay its commits."""
    timeout = compile_timeout_s + HANG_GRACE_S / 2 if message.replay else None
    request_id, backend = message.request_id, message.backend
    try:
        if message.grammar is None:
            raise GrammarMaskError("no grammar to replay")
        table.add(
            request_id,
            message.grammar,
            backend,
            timeout,
            allow_unenforced=message.allow_unenforced,
        )
    except GrammarMaskError as exc:
        table.add_failed(request_id, backend, str(exc))
    for tokens in message.commits:
        table.commit(request_id, tokens)
