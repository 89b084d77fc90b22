"""Read a domain corpus as documents, streamed, and split it into train / held-out by hash.

One function set used by mining, training and evaluation alike, so no held-out document is
ever seen by mining or training. A document is a block of text between blank lines (plain
text) or one record (JSONL). About `HELD_OUT_FRACTION` of documents, chosen by a hash of their
text, are held out: the split is stable across runs, machines and corpus order, and a document
keeps its split when other documents are added or removed. The held-out part is cut in two by
the same hash: a validation part (every decision a job makes: which training step, which terms)
and a test part (only the numbers the job reports, which no decision saw).

Small corpora: the split is per document, so a corpus of a few hundred documents may have an
empty or tiny validation or test part; `split_sizes` tells, and the pipeline says in its report
what it skipped (see extension/selection/plan.py for the minimum validation size).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InvalidCorpusError

HELD_OUT_FRACTION = 0.10  # validation + test
TEST_FRACTION = 0.05  # the lower half of the held-out hash range; validation is the upper half
SPLITS = ("train", "validation", "test")
_CHUNK = 1 << 16


@dataclass(frozen=True)
class CorpusFormat:
    jsonl: bool
    text_field: str = "text"


def detect_format(path: Path, text_field: str = "text") -> CorpusFormat:
    return CorpusFormat(jsonl=path.suffix.lower() in {".jsonl", ".ndjson"}, text_field=text_field)


def _label(path: Path, label: str | None) -> str:
    return label if label is not None else f"corpus {path.name}"


def _check_text(line: bytes, offset: int, label: str) -> str:
    if b"\x00" in line:
        raise InvalidCorpusError(
            f"{label} looks binary: NUL byte at byte offset {offset + line.index(0)}; "
            "upload UTF-8 text or JSONL",
            param="corpus",
        )
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidCorpusError(
            f"{label} is not UTF-8: invalid byte at byte offset {offset + exc.start}; "
            "re-encode it as UTF-8 (e.g. iconv -t UTF-8)",
            param="corpus",
        ) from None


def _lines(path: Path, label: str) -> Iterator[tuple[int, int, str]]:
    """(line number from 1, byte offset, decoded line) — streamed, never the whole file."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, offset, _check_text(raw, offset, label)
            offset += len(raw)


def iter_documents(path: Path, *, text_field: str = "text", fmt: CorpusFormat | None = None, label: str | None = None) -> Iterator[str]:
    """Every non-empty document of the corpus, in file order. Raises InvalidCorpusError.

    `label` is how error messages call the corpus (default "corpus <file name>"): the service
    passes the name its client gave, so no server file name or path reaches a client."""
    path = Path(path)
    label = _label(path, label)
    if not path.is_file():
        raise InvalidCorpusError(f"{label} does not exist (no such file)", param="corpus")
    fmt = fmt or detect_format(path, text_field)
    if fmt.jsonl:
        for number, _offset, line in _lines(path, label):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidCorpusError(
                    f"{label} line {number} is not valid JSON ({exc.msg}); each line of a "
                    "JSONL corpus must be one JSON object",
                    param="corpus",
                ) from None
            if not isinstance(record, dict) or not isinstance(record.get(fmt.text_field), str):
                raise InvalidCorpusError(
                    f"{label} line {number} has no string field {fmt.text_field!r}; give each "
                    "record that field or choose the field name with the text-field option",
                    param="corpus",
                )
            if record[fmt.text_field].strip():
                yield record[fmt.text_field]
        return
    block: list[str] = []
    for _number, _offset, line in _lines(path, label):
        if line.strip():
            block.append(line)
        elif block:
            yield "".join(block).rstrip("\n")
            block = []
    if block:
        yield "".join(block).rstrip("\n")


def _hash_position(document: str) -> float:
    """Where the document's sha256 falls in [0, 1): the one number every split is cut from."""
    digest = hashlib.sha256(document.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_held_out(document: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    return _hash_position(document) < fraction


def split_of(document: str) -> str:
    """'test' (hash in [0, TEST_FRACTION)), 'validation' (up to HELD_OUT_FRACTION) or 'train'."""
    position = _hash_position(document)
    if position < TEST_FRACTION:
        return "test"
    return "validation" if position < HELD_OUT_FRACTION else "train"


def train_documents(path: Path, **kwargs) -> Iterator[str]:
    return (doc for doc in iter_documents(path, **kwargs) if not is_held_out(doc))


def split_documents(path: Path, split: str, **kwargs) -> Iterator[str]:
    """The documents of one of SPLITS ('train', 'validation', 'test'), in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return (doc for doc in iter_documents(path, **kwargs) if split_of(doc) == split)


# Any letter or digit but the Hangul fillers (letters that show as blanks), found by the C regex
# engine: real text is settled by its first characters.
_WORD_CHARACTER = re.compile(r"[^\W_\u115f\u1160\u3164\uffa0]")
# Controls, whitespace and the common format characters (zero-width, bidi, word joiners, BOM),
# also removed by the regex engine, so a corpus made of them is judged without a Python loop.
_COMMON_INVISIBLE = re.compile(r"[\x00-\x20\x7f-\xa0\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\s]+")


def _visible(document: str) -> bool:
    """Whether the document holds a letter, digit, punctuation mark or symbol: something a
    tokenizer can turn into a term. Control, format, private-use and unassigned characters,
    separators and lone combining marks are not."""
    if _WORD_CHARACTER.search(document):
        return True
    rest = _COMMON_INVISIBLE.sub("", document)
    return any(unicodedata.category(char)[0] in "PS" for char in rest)


def _first_invisible(document: str) -> str:
    char = next((c for c in document if not c.isspace()), document[0])
    return f"U+{ord(char):04X} ({unicodedata.category(char)})"


def check_corpus(path: Path, **kwargs) -> tuple[int, int]:
    """Validate the whole file once up front (so a job fails fast, not mid-training).

    Returns (documents, bytes). An empty corpus is an error, and so is one whose documents hold
    only invisible characters (controls, format characters): mining would find nothing in it.
    """
    count = size = 0
    visible = False
    first_document = ""
    for doc in iter_documents(path, **kwargs):
        count += 1
        size += len(doc.encode("utf-8"))
        if not visible:
            visible = _visible(doc)
            first_document = first_document or doc
    label = _label(Path(path), kwargs.get("label"))
    if count == 0:
        raise InvalidCorpusError(
            f"{label} is empty (no non-blank text); give a UTF-8 text file with "
            "documents separated by blank lines, or JSONL with a text field",
            param="corpus",
        )
    if not visible:
        raise InvalidCorpusError(
            f"{label} has no visible text: its {count} document{'s' if count != 1 else ''} hold only control, format or "
            f"other invisible characters (the first is {_first_invisible(first_document)}), so no term can be mined "
            "from it; give UTF-8 text with words in it",
            param="corpus",
        )
    return count, size


def corpus_label(spec) -> str:
    """How messages name a job's corpus: the name its owner gave it, never the file's own name."""
    return f"corpus {spec.corpus_name!r}" if spec.corpus_name else "the corpus"


# A terms-only job's examples (extension/training/example_snippets.py): a few documents, not a corpus.
MAX_EXAMPLE_DOCUMENTS = 1000
MAX_EXAMPLE_CHARS = 1_000_000


def check_examples(examples, *, has_corpus: bool) -> None:
    """Refuse examples that are not a short list of non-empty texts, or that come with a corpus
    (a corpus job trains and judges on its corpus: put the examples' text in it)."""
    if examples is None:
        return
    if has_corpus:
        raise InvalidCorpusError("examples are for a list of terms without a corpus; with a corpus, add the "
                                 "examples' documents to the corpus instead", param="examples")
    if not isinstance(examples, list) or not all(isinstance(doc, str) for doc in examples):
        raise InvalidCorpusError("examples must be a list of texts (one document each)", param="examples")
    empty = [index for index, doc in enumerate(examples) if not doc.strip()]
    if empty:
        raise InvalidCorpusError(f"examples[{empty[0]}] is empty: give each document some text, or leave it out",
                                 param="examples")
    if len(examples) > MAX_EXAMPLE_DOCUMENTS or sum(len(doc) for doc in examples) > MAX_EXAMPLE_CHARS:
        raise InvalidCorpusError(
            f"examples hold {len(examples):,} documents and {sum(len(d) for d in examples):,} characters; the limit is "
            f"{MAX_EXAMPLE_DOCUMENTS:,} documents and {MAX_EXAMPLE_CHARS:,} characters: give more text as a corpus",
            param="examples")
