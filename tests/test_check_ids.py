"""`check_ids` (extension/tokenizer/tokenizer_json.py), the last guard before a tokenizer is
published: an old id that moved and an id held by two tokens are refused (issue 37, item 6), on
the real SmolLM2 tokenizer rebuilt from edited tokenizer.json text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from extension.errors import UnsupportedTokenizerError
from extension.tokenizer.base_view import BaseView
from extension.tokenizer.tokenizer_json import check_ids, extended_tokenizer_json, load_like


def _source(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def _built(base, spec: dict, added: dict[str, int]):
    text = extended_tokenizer_json(json.dumps(spec), {}, [], added)
    return load_like(base, text), SimpleNamespace(merge_token_ids={}, added_token_ids=added)


def test_a_clean_extension_passes(smollm2_tokenizer):
    view = BaseView(smollm2_tokenizer)
    extended, new_vocab = _built(smollm2_tokenizer, _source(smollm2_tokenizer), {"hypertextual": view.first_new_id})
    check_ids(view, extended, new_vocab)


def test_an_old_id_that_moved_is_refused(smollm2_tokenizer):
    view = BaseView(smollm2_tokenizer)
    spec = _source(smollm2_tokenizer)
    vocab = spec["model"]["vocab"]
    first, second = "the", "Ġthe"
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two old tokens swap ids
    extended, new_vocab = _built(smollm2_tokenizer, spec, {"hypertextual": view.first_new_id})
    with pytest.raises(UnsupportedTokenizerError) as refused:
        check_ids(view, extended, new_vocab)
    assert refused.value.code == "unsupported_tokenizer"
    message = refused.value.message
    assert "would change token ids: old tokens moved" in message and f"'{first}' {view.ids_in_use[first]} -> " in message
    assert "ids with two tokens" not in message and "nothing was written" in message


def test_an_id_held_by_two_tokens_is_refused(smollm2_tokenizer):
    view = BaseView(smollm2_tokenizer)
    taken = view.ids_in_use["the"]
    # a new token given an old token's id: the old token keeps it, so nothing "moved", but two share it
    extended, new_vocab = _built(smollm2_tokenizer, _source(smollm2_tokenizer), {"hypertextual": taken})
    with pytest.raises(UnsupportedTokenizerError) as refused:
        check_ids(view, extended, new_vocab)
    message = refused.value.message
    assert "ids with two tokens" in message and str(taken) in message and "hypertextual" in message
