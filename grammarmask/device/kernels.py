"""Applying packed int32 bitmasks to logits rows, in place."""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

import torch

from ..backends.base import words_per_row
from ..errors import ApplyError
from ..masks import StepMasks

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_native: ModuleType | None
try:
    _native = importlib.import_module(f"{__package__}._maskkernel")
except ImportError:  # built at install when a C compiler is there (setup.py)
    _native = None
    logging.getLogger(__name__).warning(
        "grammarmask.device._maskkernel is not built (no C compiler at install?): apply_bitmask on "
        "CPU runs its tensor-op path, several times slower; reinstall with gcc or clang"
    )


def check_dtype(logits: torch.Tensor, name: str) -> None:
    """Logits in a dtype the kernels mask (`name`: what the caller calls them)."""
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ApplyError(
            f"{name} dtype {logits.dtype} is not supported; use float32, bfloat16 or float16"
        )


def _check(logits: torch.Tensor, masks: StepMasks) -> None:
    if not isinstance(masks, StepMasks):
        raise ApplyError(
            f"masks must be the StepMasks of a fill, not {type(masks).__name__}; "
            "pass future.wait() or pool.fill(...)"
        )
    if not isinstance(logits, torch.Tensor):
        raise ApplyError(f"logits must be a torch.Tensor, not {type(logits).__name__}")
    bitmask = masks.bitmask
    if bitmask.dtype != torch.int32 or bitmask.shape[1:] != (words_per_row(masks.vocab_size),):
        raise ApplyError(
            f"the bitmask is {bitmask.dtype} {tuple(bitmask.shape)}; masks for a vocabulary "
            f"of {masks.vocab_size} need int32 [rows, {words_per_row(masks.vocab_size)}]"
        )
    if logits.dim() != 2:
        raise ApplyError(f"logits must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
    check_dtype(logits, "logits")
    if logits.shape[0] != masks.num_rows:
        raise ApplyError(f"logits have {logits.shape[0]} rows, the step's masks {masks.num_rows}")
    if logits.shape[1] != masks.vocab_size:
        raise ApplyError(
            f"logits width {logits.shape[1]} differs from the vocabulary width {masks.vocab_size}"
        )
    if logits.device != masks.bitmask.device:
        raise ApplyError(f"logits are on {logits.device}, the masks on {masks.bitmask.device}")
    if not logits.is_contiguous():
        raise ApplyError("logits must be contiguous")


def unpack_rows(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 rows -> bool [rows, vocab_size] (True = allowed)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


_SAMPLE_STRIDE = 64
"""Every 64th word of a row (one per 256 bytes) is read to estimate the row's costs."""
_FILL_COST = 1.0
_WHOLE_COST = 1.5
_EXTRACT_COST = 5.0
"""Estimated costs, in in-place passes over a row: filling it with -inf; masking it whole
(one pass plus its share of its mask's expansion); finding and writing the bits of its
words, per fraction of its words that hold such bits (docs/performance.md: apply)."""
_MAX_ROUNDS = 6
_UNPACK_BELOW = 1024
"""Lowest-bit rounds go on until at most 1024 groups (or after 6 rounds) are left; those
(with many bits) are unpacked whole."""


def _set_bits(groups: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """base + i for every set bit i of the int64 `groups`: rounds of isolating each group's
    lowest set bit, its index read from the exponent of its float32 value (exact for powers
    of two), then the few groups with more bits left are unpacked whole."""
    found = []
    biased = base - 127
    for _ in range(_MAX_ROUNDS):
        if groups.numel() <= _UNPACK_BELOW:
            break
        low = groups & -groups
        found.append(biased + ((low.float().view(torch.int32) >> 23) & 0xFF))
        groups = groups ^ low
        left = groups.nonzero().squeeze(1)
        groups, biased = groups.index_select(0, left), biased.index_select(0, left)
    shifts = torch.arange(64, device=groups.device, dtype=torch.int64)
    group, bit = ((groups.unsqueeze(1) >> shifts) & 1).nonzero(as_tuple=True)
    found.append(biased.index_select(0, group) + 127 + bit)
    return torch.cat(found)


def _groups(words: torch.Tensor) -> torch.Tensor:
    """int32 words [rows, W] -> int64 groups [rows, ceil(W/2)]: bit i of group g is token
    64g + i (little-endian pairs; a zero word pads an odd width)."""
    if words.shape[1] % 2:
        words = torch.nn.functional.pad(words, (0, 1))
    return words.view(torch.int64)


def _positions(words: torch.Tensor, rows: torch.Tensor, vocab: int) -> torch.Tensor:
    """Flat logits positions (rows[r] * vocab + token) of the set bits of `words` (a
    scratch copy: bits past the vocabulary are cleared in place)."""
    if vocab % 32:
        words[:, -1] &= (1 << (vocab % 32)) - 1
    groups = _groups(words)
    width = groups.shape[1]
    index = groups.view(-1).nonzero().squeeze(1)
    row = index.div(width, rounding_mode="floor")
    shift = rows * vocab - torch.arange(rows.shape[0], device=rows.device) * width * 64
    return _set_bits(groups.view(-1).index_select(0, index), index * 64 + shift[row])


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted row indices -> [start, end) runs of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


_BITS_DTYPE = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
"""The integer type as wide as each logits type: the whole-row pass works on the bits."""


_HASH_STEP = 0x9E3779B97F4A7C15 - (1 << 64)
_HASH_STRIDE = 8
"""Rows are hashed on every 8th 64-bit group, times odd multipliers (the golden ratio's)."""


def _duplicates(words: torch.Tensor) -> dict[int, list[int]]:
    """Rows grouped by content: first row -> all rows with the same words. A wrapping
    int64 hash of a sample of each row proposes, `torch.equal` on the whole row decides."""
    groups = _groups(words)
    sample = groups[:, ::_HASH_STRIDE]
    weights = torch.arange(1, 2 * sample.shape[1], 2, device=words.device) * _HASH_STEP
    owners: dict[int, list[int]] = {}
    seen: dict[int, list[int]] = {}
    for row, key in enumerate((sample * weights).sum(1).tolist()):
        candidates = seen.setdefault(key, [])
        owner = next((o for o in candidates if torch.equal(groups[o], groups[row])), None)
        if owner is None:
            candidates.append(row)
            owners[row] = [row]
        else:
            owners[owner].append(row)
    return owners


@functools.lru_cache(maxsize=8)
def _minus_inf_bits(dtype: torch.dtype) -> int:
    """The bits of -inf in `dtype`, as a value of the integer type as wide as it (negative:
    the sign bit is set; the C kernel takes the low bits)."""
    return int(torch.tensor(float("-inf"), dtype=dtype).view(_BITS_DTYPE[dtype]))


@functools.lru_cache(maxsize=8)
def _keep_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Row h: bit i of the 16-bit half-word h (1 where allowed), in the integer type as wide
    as `dtype`."""
    halves = torch.arange(1 << 16, device=device).unsqueeze(1)
    return ((halves >> torch.arange(16, device=device)) & 1).to(_BITS_DTYPE[dtype])


def _apply_whole(logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor, vocab: int) -> None:
    """Rows with no short list either way, masked whole in one pass over the logits' bits:
    bits = fill + bits * keep, keep 1 where allowed, fill the bits of -inf where forbidden
    (exact for any logit, NaN included: a float `minimum` would keep a forbidden NaN,
    `where` is several times slower on CPU). Rows with identical words (string contents)
    share one expansion of their mask (a table lookup per 16 bits, then fill = -inf bits
    * (1 - keep), into reused scratch rows), and consecutive ones take it in one call."""
    table = _keep_table(logits.dtype, logits.device)
    bits = logits.view(table.dtype)
    minus_inf = _minus_inf_bits(logits.dtype)
    base = torch.tensor(minus_inf, dtype=bits.dtype, device=logits.device)
    halves = words.view(torch.int16).int() & 0xFFFF
    scratch = torch.empty(2, halves.shape[1], 16, device=logits.device, dtype=bits.dtype)
    keep, fill = scratch[0].view(-1)[:vocab], scratch[1].view(-1)[:vocab]
    targets = rows.tolist()
    for owner, members in _duplicates(words).items():
        torch.index_select(table, 0, halves[owner], out=scratch[0])
        torch.add(base, scratch[0], alpha=-minus_inf, out=scratch[1])
        for start, end in _runs(sorted(targets[member] for member in members)):
            block = bits[start:end]
            torch.addcmul(fill, block, keep, out=block)


def _classify(
    bitmask: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's cheapest path, estimated from a sample of its words: few forbidden ->
    set them to -inf; few allowed -> fill the row with -inf and restore them; else whole."""
    sample = bitmask[:, ::_SAMPLE_STRIDE].index_select(0, rows)
    width = sample.shape[1]
    nonzero = sample.ne(0).sum(1, dtype=torch.int32) * (_EXTRACT_COST / width)
    nonfull = sample.ne(-1).sum(1, dtype=torch.int32) * (_EXTRACT_COST / width)
    dense_cost = nonzero + _FILL_COST
    sparse = (nonfull <= dense_cost) & (nonfull <= _WHOLE_COST)
    dense = ~sparse & (dense_cost <= _WHOLE_COST)
    return sparse, dense, ~sparse & ~dense


def apply_bitmask(logits: torch.Tensor, masks: StepMasks) -> None:
    """Set forbidden tokens to -inf in the rows that have a grammar; other rows untouched.

    Allowed logits keep their bits (NaN included); forbidden ones become -inf, whatever they
    were: bit for bit `torch.where(allowed, logits, -inf)`. On CPU the compiled kernel does
    it in one pass over what changes, on torch's intra-op thread count; elsewhere (and on
    CPU without the compiled kernel) tensor ops do it (see _apply_tensor_ops).
    """
    _check(logits, masks)
    mask_rows(logits, masks.bitmask, masks.grammar_rows)


def mask_rows(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """apply_bitmask's work on tensors the caller has checked (contiguous logits [rows,
    vocab] in a supported dtype, int32 bitmask [rows, ceil(vocab/32)] on the same device):
    in each of `rows`, -inf where the mask's bit is 0."""
    if rows.numel() == 0:
        return
    if logits.device.type == "cpu" and _native is not None:
        _native.apply_rows(
            logits.view(_BITS_DTYPE[logits.dtype]).numpy(),
            bitmask.contiguous().numpy(),
            rows.to(torch.int64).contiguous().numpy(),
            _minus_inf_bits(logits.dtype),
            torch.get_num_threads(),
        )
    else:
        _apply_tensor_ops(logits, bitmask, rows)


def _apply_tensor_ops(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Never touches more than it must: a row that allows almost everything (inside a
    string) gets -inf at its forbidden tokens only; a row that forbids almost everything (a
    structural position) is filled with -inf and its allowed logits restored; rows with
    neither short list are masked whole."""
    rows = rows.to(logits.device, non_blocking=True)
    vocab = logits.shape[1]
    flat = logits.view(-1)
    sparse, dense, whole = _classify(bitmask, rows)
    if dense.any():
        picked = rows[dense]
        restore = _positions(bitmask.index_select(0, picked), picked, vocab)
        kept = flat.index_select(0, restore)
        for start, end in _runs(sorted(picked.tolist())):
            logits[start:end].fill_(float("-inf"))
        flat.index_copy_(0, restore, kept)
    if sparse.any():
        picked = rows[sparse]
        forbidden = bitmask.index_select(0, picked).bitwise_not_()
        flat.index_fill_(0, _positions(forbidden, picked, vocab), float("-inf"))
    if whole.any():
        picked = rows[whole]
        _apply_whole(logits, picked, bitmask.index_select(0, picked), vocab)
