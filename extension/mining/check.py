"""Encode every document with the base and the extended tokenizer: the no-longer guarantee and
the tokens-per-byte numbers, in one streamed pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from ..plan.corpus import is_held_out
from ..errors import JobCancelled

_BATCH = 256
_EXAMPLES = 5


@dataclass
class SplitCounts:
    documents: int = 0
    bytes: int = 0
    tokens_before: int = 0
    tokens_after: int = 0

    def to_json(self) -> dict:
        def per_byte(tokens: int) -> float | None:
            return round(tokens / self.bytes, 6) if self.bytes else None

        return {
            "documents": self.documents,
            "bytes": self.bytes,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "tokens_per_byte_before": per_byte(self.tokens_before),
            "tokens_per_byte_after": per_byte(self.tokens_after),
            "relative_change": (
                round(self.tokens_after / self.tokens_before - 1, 6) if self.tokens_before else None
            ),
        }


@dataclass
class EncodingCheck:
    train: SplitCounts = field(default_factory=SplitCounts)
    held_out: SplitCounts = field(default_factory=SplitCounts)
    longer: int = 0
    examples: list[dict] = field(default_factory=list)
    culprit_ids: set[int] = field(default_factory=set)  # new ids seen in documents that got longer
    held_out_new_ids: set[int] = field(default_factory=set)

    @property
    def documents(self) -> int:
        return self.train.documents + self.held_out.documents

    def guarantee(self) -> dict:
        return {
            "documents_checked": self.documents,
            "documents_longer": self.longer,
            "passed": self.longer == 0,
            "examples": self.examples,
        }


def _batches(documents: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in documents:
        batch.append(doc)
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode(backend, batch: list[str]) -> list:
    # encode_batch_fast skips the offsets, which this pass never reads (tokenizers >= 0.21).
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return encode(batch, add_special_tokens=False)


def compare_encodings(
    base_backend,
    extended_backend,
    documents: Iterable[str],
    *,
    base_vocab_size: int,
    should_cancel: Callable[[], bool] | None = None,
) -> EncodingCheck:
    """Every document encoded twice (special tokens off: they are not the text's cost)."""
    check = EncodingCheck()
    index = 0
    for batch in _batches(documents):
        if should_cancel is not None and should_cancel():
            raise JobCancelled("cancelled while checking the mined tokenizer")
        before = _encode(base_backend, batch)
        after = _encode(extended_backend, batch)
        for doc, enc_before, enc_after in zip(batch, before, after):
            held = is_held_out(doc)
            split = check.held_out if held else check.train
            split.documents += 1
            split.bytes += len(doc.encode("utf-8"))
            split.tokens_before += len(enc_before.ids)
            split.tokens_after += len(enc_after.ids)
            if held:
                check.held_out_new_ids.update(i for i in enc_after.ids if i >= base_vocab_size)
            if len(enc_after.ids) > len(enc_before.ids):
                check.longer += 1
                check.culprit_ids.update(i for i in enc_after.ids if i >= base_vocab_size)
                if len(check.examples) < _EXAMPLES:
                    check.examples.append({
                        "document": index,
                        "tokens_before": len(enc_before.ids),
                        "tokens_after": len(enc_after.ids),
                        "text": doc[:120],
                    })
            index += 1
    return check
