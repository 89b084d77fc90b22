"""Terms as users give them: read from a file or a list, stripped and checked. The service (app/)
applies the same rules at submit time, so a bad term is refused before a job starts."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Iterable

from ..errors import InvalidTermsError
from ..options import BY_NAME, DEFAULTS
from .results import SkippedTerm

_FORBIDDEN_CATEGORIES = {"Cc", "Cs", "Zl", "Zp"}  # controls, lone surrogates, line/paragraph separators


def _bad_character(term: str) -> str | None:
    for char in term:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            return f"U+{ord(char):04X}"
        # Bidi embeddings/overrides/isolates and zero-width characters: invisible, they make a
        # term display as a different text (or reorder the text around it).
        if char in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\ufeff\u2060":
            return f"U+{ord(char):04X} ({unicodedata.name(char).lower()}: invisible, it makes the term display as another text)"
    return None


def read_terms_file(path) -> list[str]:
    """Terms from a UTF-8 file, one per line, surrounding whitespace stripped, blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise InvalidTermsError(
            f"terms file {str(path)!r} does not exist; give a UTF-8 text file with one term per line", param="terms"
        )
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if b"\x00" in raw:
        offset = raw.index(b"\x00")
        line = raw.count(b"\n", 0, offset) + 1
        raise InvalidTermsError(
            f"terms file {path.name} looks binary: NUL byte at byte offset {offset} (line {line}); "
            "give a UTF-8 text file with one term per line",
            param="terms",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InvalidTermsError(
            f"terms file {path.name} is not UTF-8: byte 0x{raw[exc.start]:02X} at byte offset {exc.start} (line {line}) "
            "cannot be decoded; save the file as UTF-8 (e.g. iconv -t UTF-8)",
            param="terms",
        ) from None
    terms = []
    for number, line in enumerate(text.split("\n"), start=1):
        term = line.strip()
        if not term:
            continue
        bad = _bad_character(term)
        if bad:
            raise InvalidTermsError(
                f"terms file {path.name} line {number}: term {term!r} contains the control character {bad}; "
                "remove it (write one plain term per line)",
                param="terms",
            )
        terms.append(term)
    if not terms:
        raise InvalidTermsError(f"terms file {path.name} has no terms; write one term per line", param="terms")
    return terms


def clean_terms(terms: Iterable[str], *, max_term_chars: int = DEFAULTS['max_term_chars']) -> tuple[list[str], list[SkippedTerm]]:
    """Strip and validate terms. Raises InvalidTermsError listing every bad term; duplicates are
    reported as skipped and kept once (first occurrence)."""
    if isinstance(terms, str):
        raise InvalidTermsError("terms must be a list of strings, not one string; give one term per item", param="terms")
    BY_NAME["max_term_chars"].check(max_term_chars)  # the range --help states, not a second copy of it
    problems: list[str] = []
    kept: list[str] = []
    counts: dict[str, int] = {}
    items = list(terms)
    if not items:
        raise InvalidTermsError("no terms given; give at least one term (one per line in a terms file)", param="terms")
    for number, item in enumerate(items, start=1):
        if not isinstance(item, str):
            problems.append(f"term {number} is {type(item).__name__}, not a string; give every term as text")
            continue
        term = item.strip()
        if not term:
            problems.append(f"term {number} ({item!r}) is empty or only whitespace; remove it")
            continue
        bad = _bad_character(term)
        if bad:
            problems.append(f"term {number} ({term!r}) contains the control character {bad}; remove it")
            continue
        if len(term) > max_term_chars:
            problems.append(
                f"term {number} ({term[:40]!r}...) is {len(term)} characters, over the limit of {max_term_chars}; "
                "shorten it or raise max_term_chars"
            )
            continue
        if term in counts:
            counts[term] += 1
            continue
        counts[term] = 1
        kept.append(term)
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InvalidTermsError(f"{len(problems)} invalid term(s): {shown}{more}", param="terms")
    skipped = [
        SkippedTerm(term, "duplicate", f"{term!r} is listed {n} times; it is added once")
        for term, n in counts.items() if n > 1
    ]
    return kept, skipped

