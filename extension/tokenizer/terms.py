"""Terms as users give them: read from a file or a list, stripped, normalised to NFC and checked.
The service (app/) applies the same rules at submit time, so a bad term is refused before a job
starts, and the worker's "nothing to add" error is the one the API gives at submit."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Iterable

import regex

from ..errors import InvalidTermsError
from ..plan.options import BY_NAME, DEFAULTS
from .results import SkippedTerm

# Decided by Unicode property, not by a list of characters we happen to know: every code point
# that displays as nothing or is not text at all. A term holding one displays as another text
# ("pay\u200fload" reads "payload") or means nothing, and would become a token nobody can type.
#   Cc controls, Cf format characters (bidi marks and overrides, zero-width ones, soft hyphen,
#   tags), Co private use, Cs surrogate halves, Cn unassigned, Zl/Zp line and paragraph
#   separators, and Default_Ignorable_Code_Point: the Hangul fillers, U+034F, the variation
#   selectors (U+FE00-FE0F, U+E0100-E01EF) and the rest Unicode says to render as nothing.
# Also refused: separators other than U+0020 (a no-break space makes "foo\u00a0bar" a second term
# that looks like "foo bar") and U+FFFD, which stands for bytes that could not be decoded.
_REFUSED = regex.compile(
    r"[\p{Cc}\p{Cf}\p{Co}\p{Cs}\p{Cn}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\p{Zs}\uFFFD--\x20]", regex.V1
)
# Some of those invisible characters are part of a word or an emoji, where Unicode's rules give
# them a meaning; there, and only there, they are kept (each match is one kept character, or a
# whole tag sequence):
#   ZWNJ and ZWJ after a virama (conjuncts and half forms of Indic scripts, Sinhala's ශ්‍රී), and
#   ZWNJ between letters that join (Arabic script: Persian می‌خواهم) — the CONTEXTJ rules of
#   RFC 5892 appendix A.1/A.2, also UAX #31 section 2.3;
#   ZWJ inside an emoji ZWJ sequence (UTS #51 ED-16: pictographs, each with its VS16 or
#   modifier, joined: 👩‍💻);
#   VS15/VS16 after an emoji character (text or emoji presentation: ❤️, the keycap 1️⃣);
#   the other variation selectors after an ideograph (ideographic variation sequences, CJK
#   compatibility variants: 葛󠄀) or a mathematical symbol (standardized variants);
#   Mongolian free variation selectors after a Mongolian letter;
#   tag characters after an emoji, ended by CANCEL TAG (UTS #51 ED-14a: the England flag).
_KEPT = regex.compile(
    r"""
      (?<=\p{Canonical_Combining_Class=Virama})[\u200C\u200D]
    | (?<=[\p{Joining_Type=Dual_Joining}\p{Joining_Type=Left_Joining}]\p{Joining_Type=Transparent}*)
      \u200C
      (?=\p{Joining_Type=Transparent}*[\p{Joining_Type=Dual_Joining}\p{Joining_Type=Right_Joining}])
    | (?<=\p{Extended_Pictographic}(?:\uFE0F|\p{Emoji_Modifier})?)\u200D(?=\p{Extended_Pictographic})
    | (?<=\p{Emoji})[\uFE0E\uFE0F]
    | (?<=[\p{Ideographic}\p{Sm}])[\uFE00-\uFE0D\U000E0100-\U000E01EF]
    | (?<=\p{Script=Mongolian})[\u180B-\u180D\u180F]
    | (?<=\p{Emoji}\uFE0F?)[\U000E0020-\U000E007E]+\U000E007F
    """,
    regex.VERBOSE,
)
_WHY = {
    "Cc": "a control character",
    "Cf": "an invisible format character: it makes the term display as another text",
    "Co": "a private-use character: it has no meaning outside one program",
    "Cs": "a lone surrogate half, not a character",
    "Cn": "an unassigned code point",
    "Zl": "a line break",
    "Zp": "a paragraph break",
    "Zs": "a space other than U+0020 SPACE: the term would look like one written with a plain space; write U+0020",
}
# The characters _KEPT keeps in their place, refused elsewhere: the reason says where they belong.
_OUT_OF_PLACE = [
    (regex.compile(r"[\u200C\u200D]"), "an invisible joiner that joins nothing here (it is kept after a virama, between "
     "letters that join, and inside an emoji ZWJ sequence): it makes the term display as another text"),
    (regex.compile(r"\p{Variation_Selector}"), "an invisible variation selector that applies to nothing before it (it is "
     "kept after an emoji, an ideograph, a mathematical symbol or a Mongolian letter)"),
    (regex.compile(r"[\U000E0020-\U000E007F]"), "an invisible tag character outside an emoji tag sequence (an emoji, "
     "tags, then U+E007F CANCEL TAG)"),
    (regex.compile(r"\uFFFD"), "a replacement character: it stands for bytes that could not be decoded; fix the text's encoding"),
]


def _bad_character(term: str) -> str | None:
    """The first character `term` may not hold, named for the user ("U+200F RIGHT-TO-LEFT MARK
    (...)"); None when there is none."""
    kept = {index for found in _KEPT.finditer(term) for index in range(*found.span())}
    found = next((f for f in _REFUSED.finditer(term) if f.start() not in kept), None)
    if found is None:
        if term and all(unicodedata.category(char).startswith("M") for char in term):
            char = term[0]
            return (f"only combining marks ({_named(char)}, ...): a mark belongs to the letter before it; "
                    "give the term with its letter") if len(term) > 1 else (
                    f"only {_named(char)}, a combining mark: it belongs to the letter before it; give the term with its letter")
        return None
    char = found.group()
    category = unicodedata.category(char)
    if category == "Cc":
        return f"the control character U+{ord(char):04X}"  # controls have no Unicode name
    why = next((why for pattern, why in _OUT_OF_PLACE if pattern.match(char)), None)
    why = why or _WHY.get(category, "an invisible character: it displays as nothing")
    return f"{_named(char)} ({why})"


def _named(char: str) -> str:
    code_point = f"U+{ord(char):04X}"
    name = unicodedata.name(char, "")
    return f"{code_point} {name}" if name else code_point


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
                f"terms file {path.name} line {number}: term {term!r} contains {bad}; "
                "remove it (write one plain term per line)",
                param="terms",
            )
        terms.append(term)
    if not terms:
        raise InvalidTermsError(f"terms file {path.name} has no terms; write one term per line", param="terms")
    return terms


def clean_terms(terms: Iterable[str], *, max_term_chars: int = DEFAULTS['max_term_chars']) -> tuple[list[str], list[SkippedTerm]]:
    """Strip, NFC-normalise and validate terms: the one decision the CLI, the API at submit and
    the worker all apply. Raises InvalidTermsError listing every bad term; duplicates (also the
    same term written in two Unicode normal forms, "café" as é or as e + U+0301) are reported as
    skipped and kept once (first occurrence, in NFC)."""
    if isinstance(terms, str):
        raise InvalidTermsError("terms must be a list of strings, not one string; give one term per item", param="terms")
    BY_NAME["max_term_chars"].check(max_term_chars)  # the range --help states, not a second copy of it
    problems: list[str] = []
    kept: list[str] = []
    spellings: dict[str, list[str]] = {}  # NFC term -> the spellings it was given in, in order
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
            problems.append(f"term {number} ({term!r}) contains {bad}; remove it")
            continue
        given, term = term, unicodedata.normalize("NFC", term)
        if len(term) > max_term_chars:
            problems.append(
                f"term {number} ({term[:40]!r}...) is {len(term)} characters, over the limit of {max_term_chars}; "
                "shorten it or raise max_term_chars"
            )
            continue
        if term not in spellings:
            spellings[term] = []
            kept.append(term)
        spellings[term].append(given)
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InvalidTermsError(f"{len(problems)} invalid term(s): {shown}{more}", param="terms")
    skipped = [SkippedTerm(term, "duplicate", _duplicate_detail(term, given))
               for term, given in spellings.items() if len(given) > 1]
    return kept, skipped


def normalized_term(item: str) -> str:
    """A term as clean_terms keeps it (stripped, NFC), to find which entry of a list a kept term
    came from."""
    return unicodedata.normalize("NFC", item.strip()) if isinstance(item, str) else item


def _duplicate_detail(term: str, given: list[str]) -> str:
    other_forms = len(set(given)) > 1
    if not other_forms:
        return f"{term!r} is listed {len(given)} times; it is added once"
    return (f"{term!r} is listed {len(given)} times, in {len(set(given))} Unicode spellings "
            f"({', '.join(ascii(g) for g in dict.fromkeys(given))}) that are the same text once normalised to NFC; "
            "it is added once, in NFC")


def nothing_to_add_error(terms: list[str], skipped: list[SkippedTerm], base_model: str) -> InvalidTermsError | None:
    """The error for a terms list of which nothing would be added (every term already one token
    of the base tokenizer, or otherwise skipped), naming the first such term as terms[i]. One
    function for the check at submit and the worker's, so a client reads the same words
    whichever of the two caught it. None when no term was skipped for a reason of its own."""
    reasons = [entry for entry in skipped if entry.reason != "duplicate"]
    if not reasons:
        return None
    first = reasons[0]
    index = next((i for i, term in enumerate(terms) if normalized_term(term) == first.term), 0)
    others = f" (and {len(reasons) - 1} more term{'s' if len(reasons) > 2 else ''} like it)" if len(reasons) > 1 else ""
    if first.reason == "already_single_token":
        advice = f"give terms the {base_model} tokenizer splits into several pieces"
    elif "only as added tokens" in first.detail:  # the terms are split already: the tokenizer is the limit
        advice = (f"TIDE cannot add such terms to the {base_model} tokenizer without changing other text; extend a "
                  "base model whose tokenizer is BPE (a tokenizer.json with merges), where new terms become merges")
    else:
        advice = f"TIDE cannot add such terms to the {base_model} tokenizer without changing other text; give other terms"
    return InvalidTermsError(
        f"nothing to add: {first.detail.removesuffix('; nothing to add')}{others}; {advice}",
        param=f"terms[{index}]",
    )
