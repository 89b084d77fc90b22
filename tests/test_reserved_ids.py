"""Reserved ids new terms may take (issue 40 item 2, extension/tokenizer/reserved.py): Gemma's
<unusedN> tokens, never an id the config names, never an id Gemma 3n does not route as text, and a
refusal that says how many are free. Read from tokenizer.json and the config, before any weights."""

from __future__ import annotations

import json

import pytest

from extension.errors import InvalidOptionError
from extension.tokenizer.reserved import (config_named_ids, free_reserved_tokens, take_reserved,
                                          text_id_limit)


@pytest.fixture(scope="module")
def gemma_json(gemma3_tokenizer_path):
    return json.loads((gemma3_tokenizer_path / "tokenizer.json").read_text())


def test_gemma_reserves_its_6242_unused_tokens(gemma_json):
    free = free_reserved_tokens(gemma_json)
    assert len(free) == 6242
    assert free[0].content == "<unused0>" and free[0].id == 6
    assert free[-1].id < 262144 and all(t.content.startswith("<unused") for t in free)


def test_an_id_the_config_names_is_never_free(gemma_json):
    from transformers import Gemma3nConfig

    config = Gemma3nConfig()
    named = config_named_ids(config)
    assert {config.image_token_id, config.audio_token_id, config.boi_token_id, config.eoi_token_id} <= named
    taken_by_config = {t.id for t in free_reserved_tokens(gemma_json)} & named
    free = free_reserved_tokens(gemma_json, config, other_named_ids=[7])
    assert 7 not in {t.id for t in free} and not taken_by_config & {t.id for t in free}


def test_gemma3n_takes_only_ids_it_routes_as_text(gemma_json):
    from transformers import Gemma3nTextConfig

    config = Gemma3nTextConfig(vocab_size=300, vocab_size_per_layer_input=200, hidden_size=32,
                               hidden_size_per_layer_input=4, num_hidden_layers=2, intermediate_size=[64, 64],
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0)
    assert text_id_limit(config) == 200
    free = free_reserved_tokens(gemma_json, config)
    assert free and max(t.id for t in free) < 200


def test_asking_for_more_than_are_free_says_how_many_are(gemma_json):
    free = free_reserved_tokens(gemma_json)[:3]
    assert [t.content for t in take_reserved(free, 2, base_model="gemma3-270m")] == ["<unused0>", "<unused1>"]
    with pytest.raises(InvalidOptionError, match=r"5 new terms .* only 3 free reserved tokens .*--new-ids append"):
        take_reserved(free, 5, base_model="gemma3-270m")
    with pytest.raises(InvalidOptionError, match="no free reserved tokens"):
        take_reserved([], 1, base_model="smollm2-135m")


def test_llama3_reserves_its_251_reserved_special_tokens(model_sources):
    from tests.model_families import family_tokenizer_dir

    tokenizer_json = json.loads((family_tokenizer_dir("llama3-original", model_sources) / "tokenizer.json").read_text())
    free = free_reserved_tokens(tokenizer_json)
    assert len(free) == 251
    assert (free[0].id, free[0].content) == (128002, "<|reserved_special_token_0|>")
    assert (free[-1].id, free[-1].content) == (128255, "<|reserved_special_token_250|>")
