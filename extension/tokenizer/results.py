"""What an extension produced: the new tokenizer, one record per new vocabulary entry and per
term, and the terms that were left out. The pipeline, init and publish read these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    base_vocab_size: int  # the first new id: every id below is the base's (tokens and embedding rows alike)
    terms: list[TermExtension]
    new_tokens: list[NewToken]  # sorted by id, ids contiguous from base_vocab_size (or on reserved ids)
    skipped: list[SkippedTerm]
    merges: list[tuple[str, str]] = field(default_factory=list)  # appended after the base merges
    # new_ids 'reserved' (tokenizer/onto_reserved.py): the reserved tokens the new tokens took, in
    # new_tokens' order ({"id", "reserved": its old content, "token", "term"}); None: appended ids
    reserved: list[dict] | None = None

    @property
    def vocab_size(self) -> int:
        if self.reserved is not None:
            return self.base_vocab_size  # the new tokens sit on ids the base already had
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
            "new_ids": "append" if self.reserved is None else "reserved",
            **({"reserved_tokens": [dict(entry) for entry in self.reserved]} if self.reserved is not None else {}),
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
