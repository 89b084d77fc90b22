"""The base tokenizer, read once: its tokenizer.json, vocab, and how it maps text into the strings
its BPE works on.

Two spaces meet here. Text is what users write (" immuno"). A BPE string is the same text after
the tokenizer's normalizer and pre-tokenizer, as its vocab and merges spell it ("Ġimmuno" for
byte-level BPE, "▁immuno" for SentencePiece-style BPE). The tokenizer family is never guessed from
a model name: both directions are read off the tokenizer's own normalizer, pre-tokenizer and
decoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..errors import ModelNotFoundError

_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass(frozen=True)
class Form:
    """One natural way a term appears in text, and how BPE sees it there."""

    text: str  # what the user's text contains: "term" or " term"
    bpe_string: str  # the same as BPE sees it: "term", "Ġterm", "▁term"
    one_pretoken: bool  # the pre-tokenizer keeps it inside one pre-token (merges can reach it)
    start: bool  # the start-of-text form (else the after-a-space form)


class BaseView:
    """The base tokenizer, read once. Nothing here changes it."""

    def __init__(self, tokenizer, *, embedding_rows: int | None = None):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(tokenizer, "is_fast", False):
            raise ModelNotFoundError(
                "the base tokenizer is not a fast (tokenizer.json) tokenizer; TIDE extends tokenizer.json "
                "tokenizers — load it with AutoTokenizer from a folder that has tokenizer.json",
                param="base_model",
            )
        self.tokenizer = tokenizer
        self.backend = backend
        self.source = backend.to_str()  # the base tokenizer.json
        # The tokenizers library's "model" is the subword algorithm (BPE, WordPiece, Unigram).
        self._subword = backend.model
        self.algorithm = type(self._subword).__name__
        self.is_bpe = self.algorithm == "BPE"
        self.vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False) if self.is_bpe else {}
        self.byte_fallback = bool(self._subword.byte_fallback) if self.is_bpe else False
        self.unk = self._subword.unk_token if self.is_bpe else None
        self.added_tokens = dict(backend.get_added_tokens_decoder())  # id -> AddedToken
        self.added_contents = {token.content for token in self.added_tokens.values()}
        self.ids_in_use = dict(backend.get_vocab(with_added_tokens=True))  # every string -> id the base has
        # New entries take ids after EVERY id already in use: the vocabulary, the added tokens
        # (Llama 3 and Qwen keep their special tokens after the BPE vocabulary) and the
        # embedding rows no token uses yet (Qwen's embedding has more rows than its tokenizer has
        # tokens). No old id ever moves.
        in_use_end = max(self.ids_in_use.values(), default=-1) + 1
        self.first_new_id = max(in_use_end, len(tokenizer), embedding_rows or 0)
        self._normalizer = backend.normalizer
        self._pre_tokenizer = backend.pre_tokenizer
        self._decoder = backend.decoder
        # The letter "a" as BPE sees it at the start of a text ("a", or "▁a" where the tokenizer
        # adds a prefix). Written before a string, it takes whatever the tokenizer adds at the
        # start of a text, so the string after it is seen as it is in mid-text.
        self._lead_letter = "".join(self.pretokens("a"))
        self._lead_letter_text = self._decoder.decode([self._lead_letter]) if self._decoder else self._lead_letter
        # Whether a space before an added token would be left as a token of its own.
        self.space_is_a_token = len(self.text_ids("a ")) > len(self.text_ids("a"))

    def pretokens(self, text: str) -> list[str]:
        """`text` normalized and split into pre-tokens (words), as BPE strings."""
        normalized = self._normalizer.normalize_str(text) if self._normalizer else text
        if self._pre_tokenizer is None:
            return [normalized] if normalized else []
        return [piece for piece, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]

    def forms(self, term: str) -> list[Form]:
        """The start-of-text and after-a-space forms of a term (one, if the tokenizer makes them equal)."""
        start = self.pretokens(term)
        forms = [Form(term, "".join(start), len(start) == 1, True)]
        spaced = self.pretokens("a " + term)
        joined = "".join(spaced)
        if joined.startswith(self._lead_letter) and len(joined) > len(self._lead_letter):
            bpe_string = joined[len(self._lead_letter):]
            if bpe_string != forms[0].bpe_string:
                forms.append(Form(" " + term, bpe_string, spaced[-1].endswith(bpe_string), False))
        return forms

    def bpe_pieces(self, bpe_string: str) -> list[tuple[str, int]]:
        """Base BPE of one BPE string (no normalizer or pre-tokenizer), as (token string, id)."""
        return [(token.value, token.id) for token in self._subword.tokenize(bpe_string)]

    def mid_word_pieces(self, text: str) -> list[tuple[str, int]]:
        """Base pieces of `text` written right after a letter: without the space marker or prefix
        the tokenizer adds at the start of a text or word. These are the pieces an added token
        stands in for (a space before it stays a token of its own)."""
        words = self.pretokens("a" + text)
        if not words or not words[0].startswith(self._lead_letter):
            return [(token, token_id) for token, token_id in zip(self.text_tokens(text), self.text_ids(text))]
        words[0] = words[0][len(self._lead_letter):]
        return [piece for word in words if word for piece in self.bpe_pieces(word)]

    def mergeable_pieces(self, pieces: Sequence[tuple[str, int]], bpe_string: str) -> bool:
        """Whether merges can join `pieces` back into `bpe_string`: they spell it exactly, with no
        unknown or byte-fallback piece."""
        if "".join(piece for piece, _ in pieces) != bpe_string:
            return False  # unknown characters were dropped or replaced
        return not any(
            piece == self.unk or (self.byte_fallback and _BYTE_PIECE.match(piece)) for piece, _ in pieces
        )

    def decode_bpe_string(self, bpe_string: str) -> str:
        """The text a BPE string stands for. Decoded after the lead letter, so decoders that strip
        a leading space keep it."""
        if self._decoder is None:
            return bpe_string
        full = self._decoder.decode([self._lead_letter, bpe_string])
        if full.startswith(self._lead_letter_text):
            return full[len(self._lead_letter_text):]
        return self._decoder.decode([bpe_string])

    def text_ids(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def text_tokens(self, text: str) -> list[str]:
        return self.backend.encode(text, add_special_tokens=False).tokens
