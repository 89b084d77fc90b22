"""Subword-mean initialisation, resizing, tying and padding rows (tiny random models)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from extension.init import (
    PADDING_PROBABILITY_LIMIT,
    apply_rows,
    is_tied,
    padding_probability,
    subword_mean_rows,
)
from extension.tokenizer import NewToken
from tests.conftest import tiny_gemma3, tiny_gpt2, tiny_llama

BASE = 256
PIECES = [[5, 9], [17, 3, 40], [200]]


def new_tokens(pieces=PIECES) -> list[NewToken]:
    return [
        NewToken(id=BASE + i, token=f"tok{i}", text=f" tok{i}", base_ids=ids, kind="form", term=f"tok{i}")
        for i, ids in enumerate(pieces)
    ]


def extend(model, pad=64, calibration=None):
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = subword_mean_rows(model, new_tokens(), BASE)
    report = apply_rows(model, rows, base_vocab_size=BASE, pad_to_multiple_of=pad, calibration_ids=calibration)
    return before, rows, report


def test_tied_llama_rows_are_subword_means_and_old_rows_untouched():
    model = tiny_llama(BASE, tied=True)
    before, rows, report = extend(model)
    weight = model.get_input_embeddings().weight
    assert rows.output is None
    for i, ids in enumerate(PIECES):
        assert torch.equal(weight[BASE + i], before["model.embed_tokens.weight"][ids].mean(0))
    assert torch.equal(weight[:BASE], before["model.embed_tokens.weight"])
    for name, value in model.state_dict().items():
        if "embed_tokens" not in name and "lm_head" not in name:
            assert torch.equal(value, before[name]), name
    assert is_tied(model)
    assert report["vocab_size"] == 320 and model.config.vocab_size == 320
    assert report["padding_ids"] == list(range(BASE + 3, 320))
    assert model.generation_config.suppress_tokens == report["padding_ids"]


def test_untied_llama_head_gets_its_own_means():
    model = tiny_llama(BASE, tied=False)
    before, rows, _ = extend(model)
    assert not is_tied(model)
    head = model.get_output_embeddings().weight
    for i, ids in enumerate(PIECES):
        assert torch.equal(head[BASE + i], before["lm_head.weight"][ids].mean(0))
        assert torch.equal(model.get_input_embeddings().weight[BASE + i], before["model.embed_tokens.weight"][ids].mean(0))
    assert not torch.equal(rows.input, rows.output)
    assert torch.equal(head[:BASE], before["lm_head.weight"])


def test_gpt2_tied_and_no_padding_when_disabled():
    model = tiny_gpt2(BASE)
    _, _, report = extend(model, pad=1)
    assert is_tied(model)
    assert report["vocab_size"] == BASE + 3 and report["padding_ids"] == []


def test_tied_stays_tied_after_save_and_reload(tmp_path):
    model = tiny_llama(BASE, tied=True)
    extend(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert is_tied(reloaded)
    assert reloaded.config.vocab_size == 320
    assert torch.equal(reloaded.get_input_embeddings().weight, model.get_input_embeddings().weight)


def test_gemma_scaled_embeddings_store_unscaled_rows():
    model = tiny_gemma3(BASE)
    extend(model)
    embed = model.get_input_embeddings()  # multiplies by sqrt(hidden) inside its forward
    for i, ids in enumerate(PIECES):
        new_input = embed(torch.tensor([BASE + i]))[0]
        pieces_input = embed(torch.tensor(ids)).mean(0)
        assert torch.allclose(new_input, pieces_input, rtol=1e-6, atol=0)
        assert not torch.allclose(new_input, model.get_input_embeddings().weight[BASE + i])


def test_padding_rows_get_negligible_probability_on_tiny_model():
    model = tiny_llama(BASE, tied=True)
    text = torch.randint(0, BASE, (2, 64), generator=torch.Generator().manual_seed(0))
    _, _, report = extend(model, calibration=text)
    assert report["padding_probability_max"] == padding_probability(model, text, report["padding_ids"])
    # A random tiny model has nearly flat logits, so the bound is 61/320; a trained model is far
    # lower (see test_real_smollm2_extension.py). Here: each padding row <= 1/V of the mass.
    assert report["padding_probability_max"] <= len(report["padding_ids"]) / BASE
    assert PADDING_PROBABILITY_LIMIT == 1e-4
