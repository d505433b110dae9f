"""An outlines-core index build in a process of its own, which its parent can end at any
moment (a timeout, a request that left, a memory bound) by killing it.

Run by path (`python -I _index_child.py PARENT_PID`), never imported by grammarmask: it
starts in a fraction of a second because it loads outlines-core alone, not torch or the
package. Frames on stdin/stdout: an 8-byte little-endian length, then a pickle. The first
frame in is the vocabulary, `(eos_id, {token_bytes: [ids]})`; the child answers
`("ready", None)`. Then each frame in is a regex, answered by `("index", pickled_index)` or
`("error", message)`. It ends at the end of stdin, and dies with the thread that started it
(Linux PR_SET_PDEATHSIG), so a killed worker leaves no index build behind.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("<Q")


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    """`size` bytes, or None at the end of the stream first (a raw stream's read may return
    less than it was asked for)."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = stream.read(size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def read_frame(stream: IO[bytes]) -> Any:
    """The next frame's object; None at the end of the stream."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _read_exactly(stream, size)
    return None if payload is None else pickle.loads(payload)


def write_frame(stream: IO[bytes], value: Any) -> None:
    """One frame; all of it, also on a raw stream whose write may take less."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    frame = memoryview(_HEADER.pack(len(payload)) + payload)
    while frame:
        frame = frame[stream.write(frame) or 0 :]
    stream.flush()


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it went before the line above took effect
        os._exit(0)


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    import outlines_core

    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    first = read_frame(inbox)
    if first is None:
        return
    eos_id, by_bytes = first
    vocabulary = outlines_core.Vocabulary(eos_id, by_bytes)
    write_frame(outbox, ("ready", None))
    while (regex := read_frame(inbox)) is not None:
        try:
            index = outlines_core.Index(regex, vocabulary)
        except (ValueError, TypeError, RuntimeError) as exc:
            write_frame(outbox, ("error", str(exc) or type(exc).__name__))
            continue
        write_frame(outbox, ("index", pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)))


if __name__ == "__main__":
    main()
