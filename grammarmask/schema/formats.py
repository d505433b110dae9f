"""The date and time formats and `uri-reference` as exact regular expressions, and which
formats each draft defines (what schema lowering and the judge share).

Exact as jsonschema's format checker defines them (which is what a validator of the
output says): `date` is `YYYY-MM-DD` that `datetime.date.fromisoformat` accepts (years 1 to
9999, month lengths, leap years); `date-time` is RFC 3339 as `rfc3339_validator` reads it
(case-insensitive `T` and `Z`, a fraction after a dot, an offset, no leap second, year 0
refused); `time` is the time part of such a date-time; `uri-reference` is RFC 3986 as
`rfc3986_validator` reads it. Only ASCII digits, no lookaround,
no optional group that ends in a repetition (xgrammar 0.2.9 lets the start of `(\\.[0-9]+)?`
be skipped; `(|\\.[0-9]+)` means the same): every backend's regex dialect parses them
alike.
"""

from __future__ import annotations

_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
"""0001 to 9999."""
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
"""A leap year from 0004 to 9996: divisible by 4 and not by 100, or by 400 (0000 is no year)."""
_MONTH_DAY = (
    "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"  # days 1-28 of every month
    "|(0[13-9]|1[0-2])-(29|30)"  # 29 and 30 of every month but February
    "|(0[13578]|1[02])-31)"  # 31 of the long months
)
DATE = f"({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
TIME = (
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](|\\.[0-9]+)([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
DATE_TIME = f"{DATE}[Tt]{TIME}"

_HEX = "[0-9A-Fa-f]"
_ESCAPED = f"%{_HEX}{_HEX}"
_NAME_CHARS = "-A-Za-z0-9._~!$&'()*+,;="
"""RFC 3986's unreserved and sub-delims characters."""


def _maybe(part: str) -> str:
    """`part` or nothing, written `(|part)`: xgrammar skips the start of `(part)?`."""
    return f"(|{part})"


_H16 = f"{_HEX}{{1,4}}"
_OCTET = "(25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
"""0 to 255, leading zeros allowed (`rfc3986_validator` takes `001`)."""
_LS32 = f"({_H16}:{_H16}|({_OCTET}\\.){{3}}{_OCTET})"


def _ipv6() -> str:
    """RFC 3986's IPv6address: 6 groups and the last 32 bits, or up to `before` + 1 groups,
    `::`, and the groups after it (fewer the more come before)."""
    options = [f"({_H16}:){{6}}{_LS32}", f"::({_H16}:){{5}}{_LS32}"]
    after = (f"({_H16}:){{4}}{_LS32}", f"({_H16}:){{3}}{_LS32}", f"({_H16}:){{2}}{_LS32}",
             f"{_H16}:{_LS32}", _LS32, _H16, "")  # fmt: skip
    for before, tail in enumerate(after):
        head = f"({_H16}:){{0,{before}}}{_H16}" if before else _H16
        options.append(f"{_maybe(head)}::{tail}")
    return "(" + "|".join(options) + ")"


_PCHAR = f"([{_NAME_CHARS}:@]|{_ESCAPED})"
_AUTHORITY = (
    _maybe(f"([{_NAME_CHARS}:]|{_ESCAPED})*@")  # userinfo
    + f"(\\[({_ipv6()}|v{_HEX}+\\.[{_NAME_CHARS}:]+)\\]|([{_NAME_CHARS}]|{_ESCAPED})*)"
    + _maybe(":[0-9]*")  # port
)
_TAIL = _maybe(f"\\?([{_NAME_CHARS}:@/?]|{_ESCAPED})*") + _maybe(
    f"#([{_NAME_CHARS}:@/?]|{_ESCAPED})*"
)
"""The query and the fragment."""
_SCHEME = "[A-Za-z][A-Za-z0-9+.-]*:"
_SEGMENTS = f"(/{_PCHAR}*)*"
URI_REFERENCE = (
    f"({_maybe(_SCHEME)}(//{_AUTHORITY}{_SEGMENTS}|/{_maybe(_PCHAR + '+' + _SEGMENTS)}|)"
    f"|({_SCHEME}{_PCHAR}+|([{_NAME_CHARS}@]|{_ESCAPED})+){_SEGMENTS}){_TAIL}"
)
"""RFC 3986's URI-reference: a URI or a relative reference, with an authority, an absolute
path, a path of segments or none; without a scheme the first segment holds no colon (`a:b`
has the scheme `a`)."""

PATTERNS = {
    "date": f"^{DATE}$",
    "time": f"^{TIME}$",
    "date-time": f"^{DATE_TIME}$",
    "uri-reference": f"^{URI_REFERENCE}$",
}
"""Anchored: a JSON Schema pattern matches anywhere in the string."""

EXACT_LENGTH = {"date": 10}
"""A `date` is exactly 10 characters. Said beside its pattern because Python's `$` (which
jsonschema uses) also matches before a final newline, which `date` refuses and the
date-time formats accept."""
FIXED_LENGTH_PATTERNS = {PATTERNS[name]: length for name, length in EXACT_LENGTH.items()}
"""Patterns (under a backend's regex semantics) that only strings of one length match."""

_DRAFT4 = frozenset({"date-time", "email", "hostname", "idn-email", "ipv4", "ipv6", "regex", "uri"})
_DRAFT6 = _DRAFT4 | {"json-pointer", "uri-reference", "uri-template"}
_DRAFT7 = _DRAFT6 | {
    "date", "time", "idn-hostname", "iri", "iri-reference", "relative-json-pointer",
}  # fmt: skip
_DRAFT2019 = _DRAFT7 | {"duration", "uuid"}

DEFINED_FORMATS: dict[str, frozenset[str]] = {
    "draft4": _DRAFT4,
    "draft6": _DRAFT6,
    "draft7": _DRAFT7,
    "draft2019-09": _DRAFT2019,
    "draft2020-12": _DRAFT2019,
}
"""The formats a validator checks, per draft (jsonschema's format checker, all extras):
any other format constrains nothing under that draft."""

FORMATS = DEFINED_FORMATS["draft2020-12"]
"""The formats JSON Schema defines. Validators check no other (OpenAPI's int32, double, ...),
so another `format` constrains nothing and is not reported."""
