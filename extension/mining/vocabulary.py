"""The miner's view of a base tokenizer: its words, their base pieces, and what a piece spells.

Mining must split text exactly as the tokenizer will, so it uses the tokenizer's own normalizer
and pre-tokenizer. Some tokenizers (Gemma's) do not split words at all — BPE runs over the whole
normalized text — so for those a document is cut at word starts instead; merges are only ever
mined inside such a segment, and the full-document check afterwards confirms the effect on real
encodings.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import regex

from ..errors import InvalidOptionError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _has_type(node, name: str) -> bool:
    if isinstance(node, dict):
        if node.get("type") == name:
            return True
        return any(_has_type(child, name) for child in node.values())
    if isinstance(node, list):
        return any(_has_type(child, name) for child in node)
    return False


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


class TokenizerView:
    """Words, base pieces and piece texts of one fast BPE tokenizer."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise InvalidOptionError(
                "mining needs a fast tokenizer (tokenizer.json); load the base model's tokenizer "
                "with AutoTokenizer so it is a fast one",
                param="base_model",
            )
        model = backend.model
        if type(model).__name__ != "BPE":
            raise InvalidOptionError(
                f"mining continues BPE merges, but this tokenizer's model is {type(model).__name__!r}; "
                "give the new terms as a terms list instead of a corpus",
                param="corpus",
            )
        self.tokenizer = tokenizer
        self.backend = backend
        self._normalizer = backend.normalizer
        self._pre_tokenizer = backend.pre_tokenizer
        self._model = model
        # Only the small parts of the tokenizer's JSON: the whole of it (a 262k vocab and 500k
        # merges for Gemma) takes seconds to serialise and parse.
        self.byte_level = any(
            component is not None and _has_type(json.loads(component.__getstate__()), "ByteLevel")
            for component in (backend.pre_tokenizer, backend.decoder)
        )
        self.byte_fallback = bool(model.byte_fallback)
        self.unk_token = model.unk_token
        # A space after normalization: " " for byte-level tokenizers, "▁" for SentencePiece-style.
        self.space = self.normalize(" ") or " "
        self.splits_words = len(self._pre_tokenize(self.normalize("a b"))) > 1
        # GPT-2-style word pattern with the normalized space: an optional space, then a run of
        # letters, of digits, or of other symbols; a run of spaces leaves its last space to the
        # word after it; other whitespace runs stand alone.
        s = regex.escape(self.space)
        self._segment = regex.compile(
            rf"{s}?\p{{L}}[\p{{L}}\p{{M}}]*|{s}?\p{{N}}+|{s}?[^\s\p{{L}}\p{{N}}{s}]+"
            rf"|{s}+(?![^\s{s}])|{s}+|\s+"
        )

    def normalize(self, text: str) -> str:
        return self._normalizer.normalize_str(text) if self._normalizer is not None else text

    def _pre_tokenize(self, text: str) -> list[str]:
        if self._pre_tokenizer is None:
            return [text]
        return [word for word, _span in self._pre_tokenizer.pre_tokenize_str(text)]

    def words(self, text: str) -> list[str]:
        """The pre-tokens BPE will see for `text`, in the model's alphabet (e.g. 'Ġword', '▁word')."""
        words = self._pre_tokenize(self.normalize(text))
        if self.splits_words:
            return words
        return [seg for word in words for seg in self._segment.findall(word)]

    def token_id(self, token: str) -> int | None:
        """Id of a vocabulary string (added tokens included), or None."""
        return self.backend.token_to_id(token)

    def pieces(self, word: str) -> list[tuple[int, str]]:
        """Base (id, token) pieces of one pre-token."""
        return [(token.id, token.value) for token in self._model.tokenize(word)]

    def mergeable(self, token: str) -> bool:
        """Byte-fallback and unknown pieces are not in the merge alphabet: no merge can use them."""
        if token == self.unk_token:
            return False
        return not (self.byte_fallback and _BYTE_TOKEN.match(token))

    def token_bytes(self, token: str) -> bytes:
        """The UTF-8 bytes a token spells in decoded text."""
        if self.byte_level:
            decoder = _byte_decoder()
            return bytes(decoder[char] for char in token if char in decoder)
        match = _BYTE_TOKEN.match(token)
        if self.byte_fallback and match:
            return bytes([int(match.group(1), 16)])
        return token.replace(self.space, " ").encode("utf-8") if self.space != " " else token.encode("utf-8")

    def token_text(self, token: str) -> str:
        """Readable text of a token; bytes of a cut-off UTF-8 character show as \\xNN escapes."""
        return self.token_bytes(token).decode("utf-8", errors="backslashreplace")
