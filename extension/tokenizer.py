"""Extend a fast BPE tokenizer with new terms: new BPE merges where they provably work, added
tokens with word-boundary matching where they do not.

Why merges first: extra merges in `tokenizer.json` are ordinary BPE to every runtime (transformers,
vLLM, TGI, llama.cpp), while added tokens lose their `single_word` flag in llama.cpp and then match
inside other words. Why it is safe: new merges are appended after every base merge, so they can
only fire once base BPE has finished a word, and every merge result is a string the base vocab does
not have, so no base merge can fire after them. A text that contains none of the new token strings
therefore encodes exactly as before.

The tokenizer family is never guessed from a model name: how a term appears to the BPE model
("Ġterm" for byte-level BPE, "▁term" for SentencePiece-style BPE, one or two forms) is read off
the tokenizer's own normalizer and pre-tokenizer, and every term is checked by encoding it in a
set of natural contexts with the finished tokenizer.
"""

from __future__ import annotations

import json
import re
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import InvalidOptionError, InvalidTermsError, ModelNotFoundError

MECHANISMS = ("auto", "merges", "added_tokens")

# llama.cpp's convert_hf_to_gguf.py identifies a BPE pre-tokenizer by hashing the ids of this text
# (`get_vocab_base_pre`, `chktxt`); a new merge that fires inside it makes the conversion refuse.
LLAMA_CPP_PROBE_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL"
)

# Natural contexts a term must be ONE token in. "{}" is the term. Contexts that start with the
# term exercise the start-of-text form, the others the after-a-space form.
START_CONTEXTS = ("{}", "{} is", "{}.", "{}, and", "{}\n")
SPACE_CONTEXTS = ("a {}", "the {} is", "See {}.", "a {}, b", "a {}\n", "(a {})")

_PROBE_ADDED_TOKEN = (
    "it occurs in llama.cpp's converter probe text, so as an added token it would change the probe's ids "
    "and GGUF conversion would refuse the model"
)
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
_FORBIDDEN_CATEGORIES = {"Cc", "Cs", "Zl", "Zp"}  # controls, lone surrogates, line/paragraph separators


# --------------------------------------------------------------------------------------------
# Result types (the pipeline, init and publish read these)
# --------------------------------------------------------------------------------------------


@dataclass
class NewToken:
    """Every new vocabulary entry, terms' forms and intermediates alike."""

    id: int
    token: str  # the vocab string ("Ġimmuno", "▁immuno") or the added token's content
    text: str  # the text it stands for (" immuno")
    base_ids: list[int]  # the base tokenizer's ids of `text`: the new row starts at their mean
    kind: str  # "form" | "intermediate"
    term: str | None  # the term it belongs to (the first one, for shared intermediates)


@dataclass
class TermExtension:
    term: str
    mechanism: str  # "merges" | "added_token"
    forms: dict[str, int]  # form text (" term", "term") -> its new id
    original_pieces: dict[str, list[str]]  # form text -> base token strings
    intermediates: list[str]  # vocab strings created only as steps for this term
    existing_forms: dict[str, int] = field(default_factory=dict)  # forms already one base token
    fallback_reason: str | None = None  # why merges were not used (added_token terms)


@dataclass
class SkippedTerm:
    term: str
    reason: str  # "duplicate" | "already_single_token" | "unsupported" | "probe_text"
    detail: str  # a sentence for the user


@dataclass
class ExtendedTokenizer:
    tokenizer: Any  # a transformers fast tokenizer, ready to save_pretrained
    base_vocab_size: int  # len(base tokenizer); new ids are base_vocab_size, +1, ...
    terms: list[TermExtension]
    new_tokens: list[NewToken]  # sorted by id, ids contiguous from base_vocab_size
    skipped: list[SkippedTerm]
    merges: list[tuple[str, str]] = field(default_factory=list)  # appended after the base merges

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + len(self.new_tokens)

    def to_json(self) -> dict:
        """The tokenizer part of tide_extension.json."""
        by_id = {token.id: token for token in self.new_tokens}
        terms = []
        for term in self.terms:
            terms.append({
                "term": term.term,
                "mechanism": term.mechanism,
                "forms": {
                    text: {"id": token_id, "token": by_id[token_id].token, "original_pieces": term.original_pieces.get(text, [])}
                    for text, token_id in term.forms.items()
                },
                "existing_forms": dict(term.existing_forms),
                "intermediates": list(term.intermediates),
                **({"fallback_reason": term.fallback_reason} if term.fallback_reason else {}),
            })
        kinds = [token.kind for token in self.new_tokens]
        return {
            "base_vocab_size": self.base_vocab_size,
            "vocab_size": self.vocab_size,
            "counts": {
                "terms_added": len(self.terms),
                "terms_by_mechanism": {
                    mechanism: sum(1 for term in self.terms if term.mechanism == mechanism)
                    for mechanism in ("merges", "added_token")
                },
                "new_vocab_entries": len(self.new_tokens),
                "forms": kinds.count("form"),
                "intermediates": kinds.count("intermediate"),
                "merges": len(self.merges),
                "skipped": len(self.skipped),
            },
            "terms": terms,
            "new_tokens": [
                {"id": t.id, "token": t.token, "text": t.text, "base_ids": list(t.base_ids), "kind": t.kind, "term": t.term}
                for t in self.new_tokens
            ],
            "merges": [list(pair) for pair in self.merges],
            "skipped": [{"term": s.term, "reason": s.reason, "detail": s.detail} for s in self.skipped],
        }


# --------------------------------------------------------------------------------------------
# Terms input
# --------------------------------------------------------------------------------------------


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


def clean_terms(terms: Iterable[str], *, max_term_chars: int = 64) -> tuple[list[str], list[SkippedTerm]]:
    """Strip and validate terms. Raises InvalidTermsError listing every bad term; duplicates are
    reported as skipped and kept once (first occurrence)."""
    if isinstance(terms, str):
        raise InvalidTermsError("terms must be a list of strings, not one string; give one term per item", param="terms")
    if not isinstance(max_term_chars, int) or isinstance(max_term_chars, bool) or not 1 <= max_term_chars <= 1000:
        raise InvalidOptionError(
            f"max_term_chars must be an integer from 1 to 1000, got {max_term_chars!r}", param="max_term_chars"
        )
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


# --------------------------------------------------------------------------------------------
# What the base tokenizer does to text
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Form:
    text: str  # what the user's text contains: "term" or " term"
    model: str  # the same as the BPE model sees it: "term", "Ġterm", "▁term"
    one_pretoken: bool  # the pre-tokenizer keeps it inside one pre-token (merges can reach it)
    start: bool  # the start-of-text form (else the after-a-space form)


class _BaseView:
    """The base tokenizer, read once: its JSON text, vocab, and how it maps text to the BPE model."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(tokenizer, "is_fast", False):
            raise ModelNotFoundError(
                "the base tokenizer is not a fast (tokenizer.json) tokenizer; TIDE extends tokenizer.json "
                "tokenizers — load it with AutoTokenizer from a folder that has tokenizer.json",
                param="base_model",
            )
        self.tokenizer = tokenizer
        self.backend = backend
        self.source = backend.to_str()  # the base tokenizer.json, which is extended as text
        self._model = backend.model
        self.model_type = type(self._model).__name__
        self.is_bpe = self.model_type == "BPE"
        self.size = len(tokenizer)
        self.vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False) if self.is_bpe else {}
        self.byte_fallback = bool(self._model.byte_fallback) if self.is_bpe else False
        self.unk = self._model.unk_token if self.is_bpe else None
        self.added_contents = {token.content for token in backend.get_added_tokens_decoder().values()}
        self._normalizer = backend.normalizer
        self._pre_tokenizer = backend.pre_tokenizer
        self._decoder = backend.decoder
        # A one-letter text whose model form leads every probe: "a", or "▁a" where a prefix is added.
        self._head = "".join(self.pretokens("a"))
        self._head_text = self._decode([self._head]) if self._decoder else self._head

    def pretokens(self, text: str) -> list[str]:
        normalized = self._normalizer.normalize_str(text) if self._normalizer else text
        if self._pre_tokenizer is None:
            return [normalized] if normalized else []
        return [piece for piece, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]

    def forms(self, term: str) -> list[_Form]:
        """The start-of-text and after-a-space forms of a term (one, if the tokenizer makes them equal)."""
        start = self.pretokens(term)
        forms = [_Form(term, "".join(start), len(start) == 1, True)]
        spaced = self.pretokens("a " + term)
        joined = "".join(spaced)
        if joined.startswith(self._head) and len(joined) > len(self._head):
            model = joined[len(self._head):]
            if model != forms[0].model:
                forms.append(_Form(" " + term, model, spaced[-1].endswith(model), False))
        return forms

    def pieces(self, model_string: str) -> list[tuple[str, int]]:
        """Base BPE of one model-space string, as (token string, id)."""
        return [(token.value, token.id) for token in self._model.tokenize(model_string)]

    def inner_pieces(self, text: str) -> list[tuple[str, int]]:
        """Base pieces of `text` written right after a letter: no space marker or prefix the
        tokenizer adds at the start of a text or word. These are the pieces an added token stands
        in for (a space before it stays a token of its own)."""
        words = self.pretokens("a" + text)
        if not words or not words[0].startswith(self._head):
            return [(token, token_id) for token, token_id in zip(self.text_tokens(text), self.text_ids(text))]
        words[0] = words[0][len(self._head):]
        return [piece for word in words if word for piece in self.pieces(word)]

    def mergeable_pieces(self, pieces: Sequence[tuple[str, int]], model_string: str) -> bool:
        if "".join(piece for piece, _ in pieces) != model_string:
            return False  # unknown characters were dropped or replaced
        return not any(
            piece == self.unk or (self.byte_fallback and _BYTE_PIECE.match(piece)) for piece, _ in pieces
        )

    def _decode(self, tokens: list[str]) -> str:
        return self._decoder.decode(tokens)

    def text_of(self, model_string: str) -> str:
        """The text a model-space string stands for (the decoder, with a lead token so decoders
        that strip a leading space keep it)."""
        if self._decoder is None:
            return model_string
        full = self._decode([self._head, model_string])
        if full.startswith(self._head_text):
            return full[len(self._head_text):]
        return self._decode([model_string])

    def text_ids(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def text_tokens(self, text: str) -> list[str]:
        return self.backend.encode(text, add_special_tokens=False).tokens


# --------------------------------------------------------------------------------------------
# Merge planning
# --------------------------------------------------------------------------------------------


class _MergeTable:
    """New merges, appended after the base ones, and the new vocab strings they create."""

    def __init__(self, base_vocab: dict[str, int], banned: frozenset = frozenset()):
        self.base_vocab = base_vocab
        self.banned = banned  # pairs new merges must not join (adjacent in the probe text)
        self.merges: list[tuple[str, str]] = []
        self.rank: dict[tuple[str, str], int] = {}
        self.created: dict[str, int] = {}  # new string -> order of creation
        self._created_order: list[str] = []

    def run(self, pieces: Sequence[str], fired: set | None = None) -> list[str]:
        """Apply the new merges to a word's base pieces exactly as BPE does: lowest rank first,
        leftmost first among equal ranks."""
        pieces = list(pieces)
        while len(pieces) > 1:
            best_rank, best_at = None, -1
            for at in range(len(pieces) - 1):
                rank = self.rank.get((pieces[at], pieces[at + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, at
            if best_rank is None:
                break
            if fired is not None:
                fired.add(self.merges[best_rank])
            pieces[best_at:best_at + 2] = [pieces[best_at] + pieces[best_at + 1]]
        return pieces

    def add(self, left: str, right: str) -> str | None:
        """Append one merge; returns its result when that string is new to the table."""
        result = left + right
        if result in self.base_vocab:
            raise ValueError(f"merge {left!r} + {right!r} makes {result!r}, which the base vocab already has")
        if (left, right) not in self.rank:
            self.rank[(left, right)] = len(self.merges)
            self.merges.append((left, right))
        if result not in self.created:
            self.created[result] = len(self._created_order)
            self._created_order.append(result)
            return result
        return None

    def mark(self) -> tuple[int, int]:
        return len(self.merges), len(self._created_order)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget everything added since `mark` (it is all at the end of both lists)."""
        merges, created = mark
        for pair in self.merges[merges:]:
            del self.rank[pair]
        del self.merges[merges:]
        for string in self._created_order[created:]:
            del self.created[string]
        del self._created_order[created:]

    def plan(self, pieces: list[str], target: str, *, prefer_left: bool = True) -> list[tuple[str, str]] | None:
        """Merges that join `pieces` into `target` with every intermediate a new string.

        Interval DP over bracketings: a span may be an inner node only if its string is not a base
        token (a merge producing an existing token could let base merges fire after it), and no
        merge may join a banned pair. Among
        valid trees, fewest new strings first; ties go to the left-leaning tree (prefixes, shared
        between terms) or the right-leaning one (suffixes, shared between a term's two forms).
        """
        count = len(pieces)
        best: dict[tuple[int, int], tuple[int, int]] = {}
        for width in range(2, count + 1):
            for i in range(0, count - width + 1):
                j = i + width
                text = "".join(pieces[i:j])
                if (i, j) != (0, count) and text in self.base_vocab:
                    continue
                node_cost = 0 if text in self.created else 1
                splits = range(j - 1, i, -1) if prefer_left else range(i + 1, j)
                choice = None
                for m in splits:
                    left = 0 if m - i == 1 else best.get((i, m), (None,))[0]
                    right = 0 if j - m == 1 else best.get((m, j), (None,))[0]
                    if left is None or right is None:
                        continue
                    if self.banned and ("".join(pieces[i:m]), "".join(pieces[m:j])) in self.banned:
                        continue
                    cost = node_cost + left + right
                    if choice is None or cost < choice[0]:
                        choice = (cost, m)
                if choice is not None:
                    best[(i, j)] = choice
        if (0, count) not in best:
            return None
        merges: list[tuple[str, str]] = []

        def emit(i: int, j: int) -> str:
            if j - i == 1:
                return pieces[i]
            m = best[(i, j)][1]
            left, right = emit(i, m), emit(m, j)
            merges.append((left, right))
            return left + right

        emit(0, count)
        return merges


# --------------------------------------------------------------------------------------------
# Planning terms
# --------------------------------------------------------------------------------------------


@dataclass
class _Candidate:
    term: str
    forms: list[_Form]  # forms that are not yet one base token
    existing: dict[str, int]  # forms that already are, text -> base id
    fallback_reason: str | None = None  # set once merges are ruled out for it


@dataclass
class _Plan:
    table: _MergeTable
    merge_terms: dict[str, dict[str, str]]  # term -> {form text: model string}
    uses: dict[str, set]  # term -> merges it relies on
    owner: dict[str, str]  # new string -> first term that created it
    failed: dict[str, str]  # term -> why merges could not be planned


def _form_pieces(view: _BaseView, cand: _Candidate) -> tuple[list[tuple[_Form, list[str]]], str | None]:
    result = []
    for form in cand.forms:
        if not form.one_pretoken:
            return [], f"the pre-tokenizer splits {form.text!r} into several words before BPE"
        pieces = view.pieces(form.model)
        if not view.mergeable_pieces(pieces, form.model):
            return [], f"{form.text!r} needs byte-fallback or unknown pieces, which merges cannot join"
        result.append((form, [piece for piece, _ in pieces]))
    return result, None


def _add_term(table: _MergeTable, forms: list[tuple[_Form, list[str]]], prefer_left: bool) -> tuple[set, list[str], str | None]:
    """Plan and append the merges of one term's forms; (merges used, strings created, failure)."""
    uses: set = set()
    created: list[str] = []
    for number, (form, base_pieces) in enumerate(forms):
        current = table.run(base_pieces)
        if current != [form.model]:
            merges = table.plan(current, form.model, prefer_left=prefer_left or number > 0)
            if merges is None:
                return uses, created, _no_plan_reason(table, current, form, base_pieces)
            for left, right in merges:
                string = table.add(left, right)
                if string is not None:
                    created.append(string)
        fired: set = set()
        if table.run(base_pieces, fired) != [form.model]:
            return uses, created, f"the new merges do not join {base_pieces} into {form.model!r}"
        uses |= fired
    return uses, created, None


def _no_plan_reason(table: _MergeTable, current: list[str], form: _Form, base_pieces: list[str]) -> str:
    banned, table.banned = table.banned, frozenset()
    try:
        possible = table.plan(current, form.model) is not None
    finally:
        table.banned = banned
    if possible:
        return (f"every way of joining {base_pieces} would also join pieces of llama.cpp's converter "
                "probe text, and GGUF conversion would then refuse the model")
    return f"every way of joining {base_pieces} passes through a string the base vocab already has"


def _plan_merges(view: _BaseView, candidates: list[_Candidate]) -> _Plan:
    """Plan every open candidate in order, each on top of the merges planned before it.

    No planned merge joins two pieces that are adjacent in the probe text's base tokenization:
    as long as none does, no new merge fires there at all, so the probe keeps its ids."""
    banned = frozenset(pair for word in _probe_words(view) for pair in zip(word, word[1:]))
    table = _MergeTable(view.vocab, banned)
    plan = _Plan(table, {}, {}, {}, {})
    for cand in candidates:
        if cand.fallback_reason is not None:
            continue
        forms, reason = _form_pieces(view, cand)
        if reason is not None:
            plan.failed[cand.term] = reason
            continue
        mark = table.mark()
        uses, created, reason = _add_term(table, forms, prefer_left=True)
        if reason is None and len(forms) > 1 and len(created) > len(forms):
            # Two forms usually differ only in their first piece: a right-leaning first form lets
            # the second reuse its suffix strings. Keep whichever needs fewer new strings.
            table.rollback(mark)
            alt_uses, alt_created, alt_reason = _add_term(table, forms, prefer_left=False)
            if alt_reason is not None or len(alt_created) >= len(created):
                table.rollback(mark)
                uses, created, reason = _add_term(table, forms, prefer_left=True)
            else:
                uses, created = alt_uses, alt_created
        if reason is not None:
            table.rollback(mark)
            plan.failed[cand.term] = reason
            continue
        for string in created:
            plan.owner.setdefault(string, cand.term)
        plan.merge_terms[cand.term] = {form.text: form.model for form, _ in forms}
        plan.uses[cand.term] = uses
    return plan


def _context_checks(term: str) -> list[tuple[str, int, int]]:
    """(context text, start, end) of the term's form in every context; the after-a-space form
    includes its space."""
    checks = []
    for template in START_CONTEXTS:
        checks.append((template.format(term), 0, len(term)))
    for template in SPACE_CONTEXTS:
        at = template.index("{}") - 1
        checks.append((template.format(term), at, at + 1 + len(term)))
    return checks


def _joined_with_context(view: _BaseView, terms: list[str]) -> dict[str, str]:
    """Terms that the BASE tokenizer already fuses with neighbouring text in some context (a base
    token straddles the term's edge, as Gemma's "++." does): merges appended after the base ones
    can never give those a token of their own. Checked up front so the build is usually right
    the first time."""
    jobs = [(term, text, start, end) for term in terms for text, start, end in _context_checks(term)]
    if not jobs:
        return {}
    encodings = view.backend.encode_batch([text for _, text, _, _ in jobs], add_special_tokens=False)
    joined: dict[str, str] = {}
    for (term, text, start, end), encoding in zip(jobs, encodings):
        if term in joined:
            continue
        for at, (low, high) in enumerate(encoding.offsets):
            if low < start < high or low < end < high:
                token = encoding.tokens[at]
                joined[term] = f"the base tokenizer joins it with the text around it: in {text!r} it makes {token!r}"
                break
    return joined


def _probe_words(view: _BaseView) -> list[list[str]]:
    """The probe text's base pieces, grouped by pre-token (word)."""
    encoding = view.backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False)
    words: list[list[str]] = []
    last = object()
    for token, word in zip(encoding.tokens, encoding.word_ids):
        if word is None or word != last:
            words.append([])
            last = word
        words[-1].append(token)
    return words


def _fired_in_probe(view: _BaseView, table: _MergeTable) -> set:
    fired: set = set()
    for word in _probe_words(view):
        table.run(word, fired)
    return fired


# --------------------------------------------------------------------------------------------
# Building and checking a tokenizer
# --------------------------------------------------------------------------------------------


@dataclass
class _Layout:
    """Ids and strings of one candidate extension."""

    plan: _Plan
    added: list[str]  # terms added as added tokens (their content is the term)
    ids: dict[str, int]  # new model-vocab string -> id
    added_ids: dict[str, int]  # added-token content -> id


def _layout(view: _BaseView, plan: _Plan, added: list[str]) -> _Layout:
    ids = {string: view.size + order for string, order in sorted(plan.table.created.items(), key=lambda kv: kv[1])}
    start = view.size + len(ids)
    added_ids = {term: start + i for i, term in enumerate(added)}
    return _Layout(plan, added, ids, added_ids)


def _added_token_entry(content: str, token_id: int) -> dict:
    return {"id": token_id, "content": content, "single_word": True, "lstrip": False, "rstrip": False,
            "normalized": False, "special": False}


def _build(view: _BaseView, layout: _Layout):
    """The extended tokenizer, as a transformers tokenizer of the base's own class."""
    return _wrap(view.tokenizer, _spliced_json(view.source, layout) or _rebuilt_json(view.source, layout))


def _spliced_json(source: str, layout: _Layout) -> str | None:
    """The base tokenizer.json with the new vocab, merges and added tokens written into it as text.

    Parsing and re-serialising a 33 MB tokenizer.json (Gemma's) costs seconds; the serialised
    layout is fixed (`added_tokens` before `normalizer`; `vocab` then `merges` closing `model`,
    which closes the file), and an unescaped `"` never occurs inside a JSON string, so the
    insertion points are unambiguous. None when the layout is not the expected one."""
    dumps = lambda value: json.dumps(value, ensure_ascii=False)  # noqa: E731
    vocab_end = source.rfind('},"merges":[')
    added_start = source.find('"added_tokens":[')
    added_end = source.find('],"normalizer":', added_start)
    if vocab_end < 0 or added_start < 0 or added_end < 0 or not source.endswith("]}}"):
        return None
    merges_start = vocab_end + len('},"merges":[')
    merges = layout.plan.table.merges
    if source[merges_start] == '"':  # the old "left right" string format
        if any(" " in left or " " in right for left, right in merges):
            return None
        merge_items = [dumps(f"{left} {right}") for left, right in merges]
    else:
        merge_items = [dumps([left, right]) for left, right in merges]
    vocab_items = [f"{dumps(string)}:{token_id}" for string, token_id in layout.ids.items()]
    added_items = [dumps(_added_token_entry(content, token_id)) for content, token_id in layout.added_ids.items()]

    def joined(items: list[str], after: str) -> str:
        return ("" if after in "[{" else ",") + ",".join(items) if items else ""

    merges_end = len(source) - 3
    return (
        source[:added_end] + joined(added_items, source[added_end - 1])
        + source[added_end:vocab_end] + joined(vocab_items, source[vocab_end - 1])
        + source[vocab_end:merges_end] + joined(merge_items, source[merges_end - 1])
        + source[merges_end:]
    )


def _rebuilt_json(source: str, layout: _Layout) -> str:
    """The same result through a full parse (any tokenizer.json layout)."""
    spec = json.loads(source)
    model = spec["model"]
    if layout.ids:
        model["vocab"].update(layout.ids)
    merges = layout.plan.table.merges
    if merges:
        if model["merges"] and isinstance(model["merges"][0], str):
            model["merges"] = [m.split(" ", 1) for m in model["merges"]]
        model["merges"] += [[left, right] for left, right in merges]
    spec["added_tokens"] += [_added_token_entry(content, token_id) for content, token_id in layout.added_ids.items()]
    return json.dumps(spec, ensure_ascii=False)


def _contexts(term: str, start_id: int, space_id: int) -> list[tuple[str, int]]:
    return [(c.format(term), start_id) for c in START_CONTEXTS] + [(c.format(term), space_id) for c in SPACE_CONTEXTS]


def _check_terms(backend, layout: _Layout, view: _BaseView, candidates: dict[str, _Candidate]) -> dict[str, str]:
    """Encode every term in its natural contexts; term -> why it failed (first failure)."""
    checks: list[tuple[str, str, int]] = []
    for term, planned in layout.plan.merge_terms.items():
        form_ids = {text: layout.ids[model] for text, model in planned.items()}
        form_ids.update(candidates[term].existing)
        # The start form's text is the term itself; a tokenizer with one form uses it after spaces too.
        start_id = form_ids[term]
        space_id = form_ids.get(" " + term, start_id)
        checks.extend((term, text, token_id) for text, token_id in _contexts(term, start_id, space_id))
    for term in layout.added:
        token_id = layout.added_ids[term]
        checks.extend((term, text, token_id) for text, token_id in _contexts(term, token_id, token_id))
    if not checks:
        return {}
    texts = [text for _, text, _ in checks]
    encoded = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    failures: dict[str, str] = {}
    for (term, text, token_id), ids in zip(checks, encoded):
        if term not in failures and token_id not in ids:
            failures[term] = f"in {text!r} it is split as {backend.encode(text, add_special_tokens=False).tokens}"
    # Added tokens are decoded from their content, which some decoders misread (a byte-level
    # decoder takes "é" for the byte 0xE9): decoding must give the text back, or at least what the
    # base tokenizer gives back. Merge tokens are concatenations of base pieces and decode like them.
    added = [(i, check) for i, check in enumerate(checks) if check[0] in layout.added_ids and check[0] not in failures]
    if added:
        back = backend.decode_batch([encoded[i] for i, _ in added], skip_special_tokens=False)
        base_ids = [e.ids for e in view.backend.encode_batch_fast([c[1] for _, c in added], add_special_tokens=False)]
        expected = view.backend.decode_batch(base_ids, skip_special_tokens=False)
        for (_, (term, text, _)), got, want in zip(added, back, expected):
            if term not in failures and got != text and got != want:
                failures[term] = f"{text!r} decodes back as {got!r}"
    return failures


def _terms_in_probe(backend, layout: _Layout, view: _BaseView) -> set[str]:
    """Terms whose new tokens show up when the probe text is encoded (it must keep its base ids)."""
    ids = backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False).ids
    if ids == view.backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False).ids:
        return set()
    owners = {token_id: term for term, token_id in layout.added_ids.items()}
    for term, planned in layout.plan.merge_terms.items():
        for model in planned.values():
            owners[layout.ids[model]] = term
    for string, term in layout.plan.owner.items():
        owners.setdefault(layout.ids[string], term)
    return {owners[i] for i in ids if i in owners}


# --------------------------------------------------------------------------------------------
# Wrapping the result as a transformers tokenizer
# --------------------------------------------------------------------------------------------


def _wrap(tokenizer, tokenizer_json: str):
    """A tokenizer of the base's own class reading the new tokenizer.json: special tokens, chat
    template and init options carry over; the base object is left untouched. (Loading from a file
    parses the JSON once; handing over a `tokenizers.Tokenizer` object would deep-copy it.)"""
    kwargs = dict(tokenizer.init_kwargs)
    for key in ("tokenizer_object", "tokenizer_file", "vocab", "merges", "vocab_file", "merges_file"):
        kwargs.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="tide-tokenizer-") as folder:
        path = Path(folder) / "tokenizer.json"
        path.write_text(tokenizer_json, encoding="utf-8")
        new = type(tokenizer)(tokenizer_file=str(path), **kwargs)
    if getattr(tokenizer, "chat_template", None) is not None:
        new.chat_template = tokenizer.chat_template
    return new


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def extend_tokenizer(tokenizer, terms: Iterable[str], *, max_term_chars: int = 64, mechanism: str = "auto") -> ExtendedTokenizer:
    """Add `terms` so each becomes one token in its natural forms. The base tokenizer is not changed.

    mechanism: "auto" (merges where they provably work, else added tokens), "merges" (error for a
    term merges cannot serve), "added_tokens" (every term as a word-boundary added token).
    """
    if mechanism not in MECHANISMS:
        raise InvalidOptionError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}", param="mechanism")
    kept, skipped = clean_terms(terms, max_term_chars=max_term_chars)
    view = _BaseView(tokenizer)
    if mechanism == "merges" and not view.is_bpe:
        raise InvalidOptionError(
            f"mechanism 'merges' needs a BPE tokenizer, but this one is {view.model_type!r}; "
            "use mechanism 'auto' or 'added_tokens'",
            param="mechanism",
        )

    candidates: dict[str, _Candidate] = {}
    for term in kept:
        todo, existing = [], {}
        for form in view.forms(term):
            pieces = view.pieces(form.model) if view.is_bpe else []
            if len(pieces) == 1 and pieces[0][0] == form.model:
                existing[form.text] = pieces[0][1]
            else:
                todo.append(form)
        if not view.is_bpe:
            single = view.text_ids(term)
            if len(single) == 1:
                existing[term] = single[0]
                todo = []
        if not todo:
            forms = ", ".join(repr(text) for text in existing)
            skipped.append(SkippedTerm(
                term, "already_single_token", f"{term!r} is already one token of the base tokenizer ({forms}); nothing to add"
            ))
            continue
        cand = _Candidate(term, todo, existing)
        if mechanism == "added_tokens" or not view.is_bpe:
            cand.fallback_reason = "added tokens requested" if mechanism == "added_tokens" else "the tokenizer is not BPE"
        candidates[term] = cand

    open_terms = [c.term for c in candidates.values() if c.fallback_reason is None]
    for term, reason in _joined_with_context(view, open_terms).items():
        candidates[term].fallback_reason = reason

    dropped: dict[str, tuple[str, str]] = {}  # term -> (reason, why)
    while True:
        plan = _plan_merges(view, list(candidates.values()))
        for term, reason in plan.failed.items():
            candidates[term].fallback_reason = reason
        # Planned merges never join probe pieces, so nothing fires there; checked all the same.
        fired = _fired_in_probe(view, plan.table) if plan.table.merges else set()
        hit = [term for term, uses in plan.uses.items() if uses & fired]
        for term in hit:
            candidates[term].fallback_reason = "its merges would fire inside llama.cpp's converter probe text"
        if hit:
            continue
        added = [c.term for c in candidates.values() if c.fallback_reason is not None]
        for term in list(added):
            conflict = _added_token_conflict(view, plan, term, candidates[term])
            if conflict:
                dropped[term] = ("unsupported", conflict)
            elif re.search(rf"(?<!\w){re.escape(term)}(?!\w)", LLAMA_CPP_PROBE_TEXT):
                dropped[term] = ("probe_text", _PROBE_ADDED_TOKEN)
            else:
                continue
            del candidates[term]
            added.remove(term)
        layout = _layout(view, plan, added)
        extended = _build(view, layout)
        backend = extended.backend_tokenizer
        failures = _check_terms(backend, layout, view, candidates)
        in_probe = _terms_in_probe(backend, layout, view)
        if not failures and not in_probe:
            break
        for term, why in failures.items():
            cand = candidates[term]
            if cand.fallback_reason is None:
                cand.fallback_reason = f"merges alone do not make it one token: {why}"
            else:
                dropped[term] = (
                    "unsupported",
                    f"neither merges nor an added token make it one token without changing other text: {why}",
                )
                del candidates[term]
        for term in sorted(in_probe - set(failures)):
            cand = candidates[term]
            if cand.fallback_reason is None:  # not expected: planned merges never join probe pieces
                cand.fallback_reason = "its merges would fire inside llama.cpp's converter probe text"
            else:
                dropped[term] = ("probe_text", _PROBE_ADDED_TOKEN)
                del candidates[term]

    if mechanism == "merges":
        refused = {c.term: c.fallback_reason for c in candidates.values() if c.fallback_reason}
        refused.update({term: why for term, (_, why) in dropped.items()})
        if refused:
            listing = "; ".join(f"{term!r}: {why}" for term, why in list(refused.items())[:5])
            raise InvalidTermsError(
                f"{len(refused)} term(s) cannot be added with merges ({listing}); use mechanism 'auto' "
                "(they become word-boundary added tokens) or remove them",
                param="terms",
            )
    for term, (reason, why) in dropped.items():
        skipped.append(SkippedTerm(term, reason, f"{term!r} was not added: {why}"))

    return _result(extended, view, layout, candidates, skipped)


def _added_token_conflict(view: _BaseView, plan: _Plan, term: str, cand: _Candidate) -> str | None:
    """An added token whose content is already a vocab string would re-label that token."""
    if term in view.vocab or term in view.added_contents:
        return f"its text is already the base token {term!r} but its other forms are not, and an added token would re-label it"
    if term in plan.table.created:
        return f"its text {term!r} is also a new merge token of another term"
    return None


def _result(
    extended, view: _BaseView, layout: _Layout, candidates: dict[str, _Candidate], skipped: list[SkippedTerm]
) -> ExtendedTokenizer:
    plan = layout.plan
    form_strings = {model for planned in plan.merge_terms.values() for model in planned.values()}
    form_owner: dict[str, str] = {}
    for term, planned in plan.merge_terms.items():
        for model in planned.values():
            form_owner.setdefault(model, term)
    new_tokens: list[NewToken] = []
    for string, token_id in layout.ids.items():
        is_form = string in form_strings
        new_tokens.append(NewToken(
            id=token_id, token=string, text=view.text_of(string),
            base_ids=[i for _, i in view.pieces(string)],
            kind="form" if is_form else "intermediate",
            term=form_owner[string] if is_form else plan.owner.get(string),
        ))
    for term, token_id in layout.added_ids.items():
        base_ids = [i for _, i in view.inner_pieces(term)] if view.is_bpe else view.text_ids(term)
        new_tokens.append(NewToken(id=token_id, token=term, text=term, base_ids=base_ids, kind="form", term=term))
    new_tokens.sort(key=lambda t: t.id)

    intermediates_of: dict[str, list[str]] = {}
    for token in new_tokens:
        if token.kind == "intermediate" and token.term is not None:
            intermediates_of.setdefault(token.term, []).append(token.token)
    terms: list[TermExtension] = []
    for term, cand in candidates.items():
        if term in plan.merge_terms:
            planned = plan.merge_terms[term]
            terms.append(TermExtension(
                term=term, mechanism="merges",
                forms={text: layout.ids[model] for text, model in planned.items()},
                original_pieces={text: [p for p, _ in view.pieces(model)] for text, model in planned.items()},
                intermediates=intermediates_of.get(term, []),
                existing_forms=dict(cand.existing),
            ))
        else:
            terms.append(TermExtension(
                term=term, mechanism="added_token",
                forms={term: layout.added_ids[term]},
                original_pieces={term: [p for p, _ in view.inner_pieces(term)] if view.is_bpe else view.text_tokens(term)},
                intermediates=[],
                existing_forms=dict(cand.existing),
                fallback_reason=cand.fallback_reason,
            ))
    return ExtendedTokenizer(
        tokenizer=extended,
        base_vocab_size=view.size,
        terms=terms,
        new_tokens=new_tokens,
        skipped=skipped,
        merges=list(plan.table.merges),
    )


def extend_with_merges(tokenizer, merges: Sequence[tuple[str, str]]) -> ExtendedTokenizer:
    """Append `merges` (lowest priority, in order) to a BPE tokenizer and record the new tokens.

    The low-level primitive for the corpus miner: each merge's parts must be base tokens or
    results of earlier merges in the list, and no result may be a base token. Every new string is
    reported as a "form" whose term is the text it stands for.
    """
    view = _BaseView(tokenizer)
    if not view.is_bpe:
        raise InvalidOptionError(
            f"new merges need a BPE tokenizer, but this one is {view.model_type!r}",
            param="merges",
        )
    table = _MergeTable(view.vocab)
    for number, pair in enumerate(merges, start=1):
        if len(pair) != 2:
            raise InvalidOptionError(f"merge {number} is {pair!r}, not a (left, right) pair", param="merges")
        left, right = pair
        for part in (left, right):
            if part not in view.vocab and part not in table.created:
                raise InvalidOptionError(
                    f"merge {number} ({left!r}, {right!r}) uses {part!r}, which is neither a base token nor "
                    "the result of an earlier merge",
                    param="merges",
                )
        if left + right in view.vocab:
            raise InvalidOptionError(
                f"merge {number} ({left!r}, {right!r}) makes {left + right!r}, which is already a base token; "
                "a new merge must make a new string",
                param="merges",
            )
        table.add(left, right)
    plan = _Plan(table, {}, {}, {}, {})
    layout = _layout(view, plan, [])
    extended = _build(view, layout)
    new_tokens, terms = [], []
    for string, token_id in layout.ids.items():
        text = view.text_of(string)
        pieces = view.pieces(string)
        new_tokens.append(NewToken(id=token_id, token=string, text=text, base_ids=[i for _, i in pieces], kind="form", term=text))
        terms.append(TermExtension(term=text, mechanism="merges", forms={text: token_id},
                                   original_pieces={text: [p for p, _ in pieces]}, intermediates=[]))
    return ExtendedTokenizer(
        tokenizer=extended,
        base_vocab_size=view.size,
        terms=terms,
        new_tokens=new_tokens,
        skipped=[],
        merges=list(table.merges),
    )


def merges_fire_in_probe(tokenizer, merges: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The merges (of `merges`, appended to `tokenizer`) that would fire inside llama.cpp's probe
    text — any of them changes the probe's ids and makes the GGUF converter refuse the model."""
    view = _BaseView(tokenizer)
    table = _MergeTable(view.vocab)
    merges = [tuple(pair) for pair in merges]
    for left, right in merges:
        if left + right not in view.vocab:
            table.add(left, right)
    fired = _fired_in_probe(view, table)
    return [pair for pair in merges if pair in fired]


def probe_text_unchanged(base_tokenizer, extended_tokenizer) -> bool:
    """Whether llama.cpp's converter probe text encodes to the same ids with both tokenizers."""
    return base_tokenizer.encode(LLAMA_CPP_PROBE_TEXT) == extended_tokenizer.encode(LLAMA_CPP_PROBE_TEXT)
