"""What mining returns: the merges, one record per new vocabulary entry, and the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MinedTerm:
    """One new vocabulary entry, in merge order (rank 0 = the merge that saved the most)."""

    rank: int
    token: str  # as stored in the vocabulary ('Ġcompiler', '▁compiler')
    text: str  # what it spells (' compiler'); bytes of a cut-off character show as \\xNN
    id: int | None  # id in the extended tokenizer
    merge: tuple[str, str]  # the pair of existing tokens it joins
    tokens_saved: int  # tokens this merge removed from the training split when it was made
    frequency: int  # how often the token occurs in the training split after extension
    original_pieces: list[str]  # the base tokens it replaces
    original_ids: list[int]
    original_texts: list[str]  # what each of those pieces spells
    kind: str  # "term", or "intermediate": a step toward longer tokens, rarely used on its own

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["merge"] = list(self.merge)
        return data


@dataclass
class MiningResult:
    merges: list[tuple[str, str]]
    terms: list[MinedTerm]
    extended: Any  # extension.tokenizer.ExtendedTokenizer
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def found_terms(self) -> bool:
        return bool(self.merges)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.report,
            "merges": [list(pair) for pair in self.merges],
            "terms": [term.to_json() for term in self.terms],
        }
