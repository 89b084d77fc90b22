"""llama.cpp's probe text, which an extended tokenizer must encode exactly as the base does.

llama.cpp's convert_hf_to_gguf.py identifies a BPE pre-tokenizer by hashing the ids of this text
(`get_vocab_base_pre`, `chktxt`); a new merge that fires inside it, or an added token that matches
in it, changes those ids and makes the conversion refuse the model.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from .base_view import BaseView


class MergeRunner(Protocol):
    """What the probe check needs of a merge table: run its merges over a word's pieces."""

    def run(self, pieces: Sequence[str], fired: set | None = None) -> list[str]: ...

LLAMA_CPP_PROBE_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL"
)

MERGES_FIRE_IN_PROBE = "its merges would fire inside llama.cpp's converter probe text"
ADDED_TOKEN_IN_PROBE = (
    "it occurs in llama.cpp's converter probe text, so as an added token it would change the probe's ids "
    "and GGUF conversion would refuse the model"
)


def probe_text_unchanged(base_tokenizer, extended_tokenizer) -> bool:
    """Whether llama.cpp's converter probe text encodes to the same ids with both tokenizers."""
    return base_tokenizer.encode(LLAMA_CPP_PROBE_TEXT) == extended_tokenizer.encode(LLAMA_CPP_PROBE_TEXT)


def occurs_as_word_in_probe(term: str) -> bool:
    """Whether a word-boundary added token for `term` would match inside the probe text."""
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", LLAMA_CPP_PROBE_TEXT) is not None


def probe_words(view: BaseView) -> list[list[str]]:
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


def adjacent_probe_pairs(view: BaseView) -> frozenset:
    """Pairs of base pieces that stand side by side inside one word of the probe text. New merges
    rank after every base merge, so as long as none joins such a pair, none fires in the probe."""
    return frozenset(pair for word in probe_words(view) for pair in zip(word, word[1:]))


def merges_fired_in_probe(view: BaseView, table: MergeRunner) -> set:
    """The merges of `table` that fire when the probe text's words are encoded with them."""
    fired: set = set()
    for word in probe_words(view):
        table.run(word, fired)
    return fired


def terms_in_probe(backend, view: BaseView, owners: Mapping[int, str]) -> set[str]:
    """Terms whose new tokens show up when the probe text is encoded with `backend`; `owners`
    maps each new id to the term it belongs to."""
    ids = backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False).ids
    if ids == view.backend.encode(LLAMA_CPP_PROBE_TEXT, add_special_tokens=False).ids:
        return set()
    return {owners[i] for i in ids if i in owners}
