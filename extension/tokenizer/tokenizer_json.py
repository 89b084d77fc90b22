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

from ..errors import UnsupportedTokenizerError
from .base_view import BaseView
from .merge_plan import MergePlan


@dataclass
class NewVocab:
    """The ids of one candidate extension: merge tokens first, in the order their merges made
    them, then added tokens (each term's bare form, then its form after a space)."""

    plan: MergePlan
    added_terms: list[str]  # terms added as added tokens
    merge_token_ids: dict[str, int]  # new BPE vocab string -> id
    added_token_ids: dict[str, int]  # added-token content ("term" or " term") -> id

    def added_forms(self, term: str) -> dict[str, int]:
        """An added-token term's forms: its bare text and, where the tokenizer has one, its form
        after a space, as one token each (no lone space token in front of the term)."""
        return {text: self.added_token_ids[text] for text in (term, " " + term) if text in self.added_token_ids}

    def owners(self) -> dict[int, str]:
        """Every new id -> the term it belongs to (an intermediate: the term that created it)."""
        owners = {token_id: term for term in self.added_terms for token_id in self.added_forms(term).values()}
        for term, forms in self.plan.term_forms.items():
            for bpe_string in forms.values():
                owners[self.merge_token_ids[bpe_string]] = term
        for string, term in self.plan.creator.items():
            owners.setdefault(self.merge_token_ids[string], term)
        return owners


def assign_ids(view: BaseView, plan: MergePlan, added_terms: list[str]) -> NewVocab:
    created = sorted(plan.table.created.items(), key=lambda item: item[1])
    first = view.first_new_id
    merge_token_ids = {string: first + order for order, (string, _) in enumerate(created)}
    contents = [text for term in added_terms for text in added_token_contents(view, term)]
    first_added = first + len(merge_token_ids)
    added_token_ids = {content: first_added + i for i, content in enumerate(contents)}
    return NewVocab(plan, list(added_terms), merge_token_ids, added_token_ids)


def added_token_contents(view: BaseView, term: str) -> list[str]:
    """The added tokens a term needs: itself, and " term" where the base tokenizer would make the
    space in front of it a token of its own ("Ġ", "▁"), a token the model almost never read
    before a word — unless that text is already taken."""
    spaced = " " + term
    if spaced in view.ids_in_use or not view.space_is_a_token:
        return [term]
    return [term, spaced]


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
    `added_tokens` (content -> id) appended as added tokens, every old id where it was."""
    spec = json.loads(base_json)
    model = spec["model"]
    if vocab:
        model["vocab"].update(vocab)
    if merges:
        if model["merges"] and isinstance(model["merges"][0], str):  # the old "left right" format
            model["merges"] = [merge.split(" ", 1) for merge in model["merges"]]
        model["merges"] += [[left, right] for left, right in merges]
    spec["added_tokens"] += [added_token_entry(content, token_id) for content, token_id in added_tokens.items()]
    _pin_added_tokens(spec)
    return json.dumps(spec, ensure_ascii=False)


def _pin_added_tokens(spec: dict) -> None:
    """Write every added token the model's vocabulary lacks into it, at its id.

    The tokenizers library does not read an added token's id from tokenizer.json: it gives one
    the model's vocabulary lacks the id (vocabulary size + its place among such tokens). Llama 3
    and Qwen keep their special tokens there, after the BPE vocabulary, so appending new entries
    to the vocabulary would shift every one of them onto a new entry's id. In the vocabulary
    they keep their ids; BPE never produces them there (no merge makes their strings), so text
    encodes as before. A vocabulary that is a list (Unigram) cannot hold ids: there the built
    tokenizer's ids are checked (check_ids) and a shift is refused.
    """
    vocab = spec["model"].get("vocab")
    if not isinstance(vocab, dict):
        return
    for token in spec["added_tokens"]:
        vocab.setdefault(token["content"], token["id"])


def added_token_entry(content: str, token_id: int) -> dict:
    # single_word: the bare form matches only as a whole word, never inside another one. The
    # form after a space cannot use it (its match starts at the space, after a letter), so it
    # matches wherever its text, space included, occurs.
    return {"id": token_id, "content": content, "single_word": not content.startswith(" "), "lstrip": False,
            "rstrip": False, "normalized": False, "special": False}


def check_extendable(tokenizer, *, embedding_rows: int | None = None) -> None:
    """Refuse, before any weights are read, a tokenizer whose new tokens could not get the ids
    their rows will have, naming the tokenizer and what is missing."""
    view = BaseView(tokenizer, embedding_rows=embedding_rows)
    kind = f"{type(tokenizer).__name__} ({view.algorithm} model)"
    last_string, last_id = max(view.ids_in_use.items(), key=lambda item: item[1])
    if embedding_rows is not None and last_id >= embedding_rows:
        raise UnsupportedTokenizerError(
            f"the tokenizer {kind} uses id {last_id} ({last_string!r}) but the model has only {embedding_rows} "
            "embedding rows, so that token has no row; use the tokenizer saved with this model, or resize "
            "the model's embeddings to cover every token id before extending it",
        )
    if view.algorithm == "Unigram":
        # Its vocabulary is a list with no ids of its own: an added token gets the next free one.
        model_size = view.backend.get_vocab_size(with_added_tokens=False)
        outside = sum(1 for token_id in view.added_tokens if token_id >= model_size)
        natural = model_size + outside
        if natural != view.first_new_id:
            raise UnsupportedTokenizerError(
                f"the tokenizer {kind} cannot give new tokens the ids after the model's {view.first_new_id} "
                f"embedding rows: its vocabulary is a list whose next id is {natural}, and TIDE never moves old "
                "ids; a BPE tokenizer (tokenizer.json with a vocab object) can be extended",
            )


def check_ids(view: BaseView, extended, new_vocab: NewVocab) -> None:
    """Refuse a built tokenizer in which an old id moved, two tokens share an id, or a new token
    is not at the id its row will have. Checked on every build, before anything is published."""
    ids = dict(extended.backend_tokenizer.get_vocab(with_added_tokens=True))
    moved = [(s, i, ids.get(s)) for s, i in view.ids_in_use.items() if ids.get(s) != i]
    expected = {**new_vocab.merge_token_ids, **new_vocab.added_token_ids}
    misplaced = [(s, i, ids.get(s)) for s, i in expected.items() if ids.get(s) != i]
    owners: dict[int, list[str]] = {}
    for string, token_id in ids.items():
        owners.setdefault(token_id, []).append(string)
    shared = {i: strings for i, strings in owners.items() if len(strings) > 1}
    if moved or misplaced or shared:
        def show(rows):
            return ", ".join(f"{s!r} {want} -> {got}" for s, want, got in rows[:3])
        problems = [f"old tokens moved ({show(moved)})" if moved else "",
                    f"new tokens off their ids ({show(misplaced)})" if misplaced else "",
                    f"ids with two tokens ({list(shared.items())[:3]})" if shared else ""]
        raise UnsupportedTokenizerError(
            f"extending this {view.algorithm} tokenizer would change token ids: "
            f"{'; '.join(p for p in problems if p)}; nothing was written. TIDE keeps every old id, so "
            "it cannot extend this tokenizer layout",
        )


def load_like(tokenizer, tokenizer_json: str, init_kwargs: dict | None = None):
    """A tokenizer of `tokenizer`'s own class reading `tokenizer_json`: special tokens, chat
    template and init options (`init_kwargs` where given, else its own) carry over; `tokenizer` is
    left untouched. (Loading from a file parses the JSON once; handing over a `tokenizers.Tokenizer`
    object would deep-copy it.)"""
    kwargs = dict(tokenizer.init_kwargs if init_kwargs is None else init_kwargs)
    for key in ("tokenizer_object", "tokenizer_file", "vocab", "merges", "vocab_file", "merges_file"):
        kwargs.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="tide-tokenizer-") as folder:
        path = Path(folder) / "tokenizer.json"
        path.write_text(tokenizer_json, encoding="utf-8")
        new = type(tokenizer)(tokenizer_file=str(path), **kwargs)
    if getattr(tokenizer, "chat_template", None) is not None:
        new.chat_template = tokenizer.chat_template
    return new
