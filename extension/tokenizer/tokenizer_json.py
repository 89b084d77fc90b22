"""Writing the extended tokenizer.json and loading it as a transformers tokenizer.

The new entries go in through the JSON structure: vocab strings and merges appended to the BPE
model, added tokens to `added_tokens`. Every other field — normalizer, pre-tokenizer, decoder,
post-processor, special tokens — is the base's, untouched.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .base_view import BaseView
from .merge_plan import MergePlan


@dataclass
class NewVocab:
    """The ids of one candidate extension: merge tokens first, in the order their merges made
    them, then added tokens."""

    plan: MergePlan
    added_terms: list[str]  # terms added as added tokens (their content is the term)
    merge_token_ids: dict[str, int]  # new BPE vocab string -> id
    added_token_ids: dict[str, int]  # added-token content -> id


def assign_ids(view: BaseView, plan: MergePlan, added_terms: list[str]) -> NewVocab:
    created = sorted(plan.table.created.items(), key=lambda item: item[1])
    merge_token_ids = {string: view.size + order for order, (string, _) in enumerate(created)}
    first_added = view.size + len(merge_token_ids)
    added_token_ids = {term: first_added + i for i, term in enumerate(added_terms)}
    return NewVocab(plan, list(added_terms), merge_token_ids, added_token_ids)


def build_tokenizer(view: BaseView, new_vocab: NewVocab):
    """The extended tokenizer, as a transformers tokenizer of the base's own class."""
    text = extended_tokenizer_json(
        view.source, new_vocab.merge_token_ids, new_vocab.plan.table.merges, new_vocab.added_token_ids
    )
    return load_like(view.tokenizer, text)


def extended_tokenizer_json(
    base_json: str,
    vocab: Mapping[str, int],
    merges: Sequence[tuple[str, str]],
    added_tokens: Mapping[str, int],
) -> str:
    """`base_json` (a tokenizer.json) with `vocab` and `merges` appended to its BPE model and
    `added_tokens` (content -> id) appended as word-boundary added tokens."""
    spec = json.loads(base_json)
    model = spec["model"]
    if vocab:
        model["vocab"].update(vocab)
    if merges:
        if model["merges"] and isinstance(model["merges"][0], str):  # the old "left right" format
            model["merges"] = [merge.split(" ", 1) for merge in model["merges"]]
        model["merges"] += [[left, right] for left, right in merges]
    spec["added_tokens"] += [added_token_entry(content, token_id) for content, token_id in added_tokens.items()]
    return json.dumps(spec, ensure_ascii=False)


def added_token_entry(content: str, token_id: int) -> dict:
    # single_word: the token matches only as a whole word, never inside another one.
    return {"id": token_id, "content": content, "single_word": True, "lstrip": False, "rstrip": False,
            "normalized": False, "special": False}


def load_like(tokenizer, tokenizer_json: str):
    """A tokenizer of `tokenizer`'s own class reading `tokenizer_json`: special tokens, chat
    template and init options carry over; `tokenizer` is left untouched. (Loading from a file
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
