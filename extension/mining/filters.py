"""Which candidate tokens the miner refuses, and which parts of a document it does not count.

Real corpora are dirty: terminal colour codes (the Chinese fortunes are full of them), URLs, page
numbers, rules of dashes. Such strings repeat a lot, so a pure tokens-saved ranking would spend
the new vocabulary on them. Two layers keep them out:

- text layer: ANSI escape sequences (and URLs) are cut out of a document before its words are
  counted, so their fragments never look frequent;
- token layer: every candidate merge result is checked, intermediates included.

Each rule can be switched off (MiningFilters) for corpora where such strings are the domain.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import product

from ..plan.options import DEFAULTS

# CSI sequences (colours, cursor moves), OSC sequences (titles, hyperlinks) and two-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
URL = re.compile(r"(?:\b(?:https?|ftp)://|\bwww\.)[^\s<>\"'{}|\\^`]+", re.IGNORECASE)
_URL_PIECE = re.compile(r"://|^www\.|\bwww\.", re.IGNORECASE)


@dataclass(frozen=True)
class MiningFilters:
    """Switches for the candidate filters; all on by default."""

    digits: bool = True  # no letters but some digit: "2023", " 1.5", "0x"-less hex runs
    punctuation: bool = True  # only whitespace, punctuation or symbols: "----", " ((", "\n\n"
    urls: bool = True  # URL text is not counted; tokens containing "://" or "www." are refused
    control: bool = True  # control characters and ANSI escape codes
    max_chars: int = DEFAULTS["max_term_chars"]  # longer token texts are refused (the same limit as terms)

    def to_json(self) -> dict:
        return asdict(self)

    def clean_segments(self, document: str) -> list[str]:
        """The parts of a document whose words are counted (escape codes and URLs cut out).

        Cutting (rather than deleting) keeps the text on either side from fusing into a word
        that never occurs in the real text.
        """
        segments = [document]
        if self.control:
            segments = [part for seg in segments for part in ANSI_ESCAPE.split(seg)]
        if self.urls:
            segments = [part for seg in segments for part in URL.split(seg)]
        return [seg for seg in segments if seg]

    def reject_reason(self, data: bytes) -> str | None:
        """Why a candidate token spelling the UTF-8 bytes `data` must not be added, or None.

        Byte-level BPE splits characters into bytes, so a candidate may start or end inside a
        character. A cut-off character at the end is judged by every character it could
        complete to ("\xe2\x94" can only become box drawing, so "─\xe2\x94" is a symbol run);
        continuation bytes at the start, whose character is unknown, count as letters: pieces
        of CJK characters are the first steps toward whole characters.
        """
        orphans, complete, tail = _split_utf8(data)
        if len(complete) + (1 if tail else 0) > self.max_chars:
            return "too_long"
        has_letter = has_digit = False
        for char in complete:
            category = unicodedata.category(char)
            if category == "Cc" and char not in "\t\n\r":
                if self.control:
                    return "control"
            elif category[0] in "LM" or char == "\ufffd":
                has_letter = True
            elif category[0] == "N":
                has_digit = True
        if tail:
            tail_class = _tail_class(tail)
            has_letter = has_letter or tail_class == "letter"
            has_digit = has_digit or tail_class == "digit"
        if not complete and not tail:
            has_letter = orphans > 0
        text = complete
        if self.urls and _URL_PIECE.search(text):
            return "url"
        if not has_letter:
            if has_digit and self.digits:
                return "digits"
            if not has_digit and self.punctuation:
                return "punctuation"
        return None


def _split_utf8(data: bytes) -> tuple[int, str, bytes]:
    """(continuation bytes at the start, the complete characters, a cut-off character at the end)."""
    start = 0
    while start < len(data) and 0x80 <= data[start] < 0xC0:
        start += 1
    end = len(data)
    for back in range(1, min(4, len(data) - start) + 1):
        byte = data[len(data) - back]
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if back < need:
                end = len(data) - back
            break
        if byte < 0x80:
            break
    return start, data[start:end].decode("utf-8", errors="replace"), data[end:]


@lru_cache(maxsize=4096)
def _tail_class(tail: bytes) -> str:
    """'letter' if some completion of the cut-off character is a letter or mark, else 'digit' if
    some is a digit, else 'symbol'. Lead bytes alone of 4-byte characters count as letters."""
    need = (2 if tail[0] < 0xE0 else 3 if tail[0] < 0xF0 else 4) - len(tail)
    if need > 2:
        return "letter"
    has_digit = False
    for suffix in product(range(0x80, 0xC0), repeat=need):
        try:
            char = (tail + bytes(suffix)).decode("utf-8")
        except UnicodeDecodeError:
            continue
        category = unicodedata.category(char)
        if category[0] in "LM":
            return "letter"
        has_digit = has_digit or category[0] == "N"
    return "digit" if has_digit else "symbol"
