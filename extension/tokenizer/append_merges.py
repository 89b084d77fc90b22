"""The corpus miner's entry points: given merges, appended as they are (the miner chose them)."""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidOptionError
from .base_view import BaseView
from .merge_plan import MergePlan, MergeTable
from .results import ExtendedTokenizer, NewToken, TermExtension
from .tokenizer_json import assign_ids, build_tokenizer, check_ids


def extend_with_merges(tokenizer, merges: Sequence[tuple[str, str]], *, embedding_rows: int | None = None) -> ExtendedTokenizer:
    """Append `merges` (lowest priority, in order) to a BPE tokenizer and record the new tokens.

    Each merge's parts must be base tokens or results of earlier merges in the list, and no
    result may be a base token. Every new string is reported as a "form" whose term is the text
    it stands for. New ids start at BaseView.first_new_id (after `embedding_rows`, if given).
    """
    view = BaseView(tokenizer, embedding_rows=embedding_rows)
    if not view.is_bpe:
        raise InvalidOptionError(
            f"new merges need a BPE tokenizer, but this one is {view.algorithm!r}",
            param="merges",
        )
    table = MergeTable(view.vocab)
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
    new_vocab = assign_ids(view, MergePlan(table), [])
    extended = build_tokenizer(view, new_vocab)
    check_ids(view, extended, new_vocab)
    new_tokens, terms = [], []
    for string, token_id in new_vocab.merge_token_ids.items():
        text = view.decode_bpe_string(string)
        pieces = view.bpe_pieces(string)
        new_tokens.append(NewToken(id=token_id, token=string, text=text, base_ids=[i for _, i in pieces], kind="form", term=text))
        terms.append(TermExtension(term=text, mechanism="merges", forms={text: token_id},
                                   original_pieces={text: [p for p, _ in pieces]}, intermediates=[]))
    return ExtendedTokenizer(
        tokenizer=extended,
        base_vocab_size=view.first_new_id,
        terms=terms,
        new_tokens=new_tokens,
        skipped=[],
        merges=list(table.merges),
    )
