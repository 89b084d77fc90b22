"""The composition init (extension/rows/composition.py, init.RowInitializer): fitted on the base
vocabulary's merges, applied along each new token's own merges, and the fallbacks to the mean.

Tiny models get a composition PLANTED in their rows (each merge's row is a fixed linear map of its
parts' rows), so the fit has a known answer; the real SmolLM2 shows the fit is better than the mean
on held-out merges of a real vocabulary.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from extension.rows.composition import base_merge_ids, fit_composition
from extension.rows.init import RowInitializer, subword_mean_rows
from extension.tokenizer import extend_tokenizer, extend_with_merges
from tests.conftest import tiny_llama

TERMS = ["hexadecimal", "microprocessor", "multitasking"]


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer with about 900 merges, trained on FOLDOC text (test_tokenizer's fixture)."""
    from tests.test_tokenizer import _train

    return _train("byte_level")


def _maps(hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    left = torch.linalg.qr(torch.randn(hidden, hidden, generator=g))[0] / 2**0.5
    right = torch.linalg.qr(torch.randn(hidden, hidden, generator=g))[0] / 2**0.5
    return left, right


@torch.no_grad()
def _plant(matrix: torch.Tensor, merges: list[tuple[int, int, int]], left: torch.Tensor, right: torch.Tensor) -> None:
    """row(result) = row(l) @ left + row(r) @ right, in merge order (parts before results)."""
    for l, r, result in merges:
        matrix[result] = matrix[l] @ left + matrix[r] @ right


def _planted_model(tokenizer, tied: bool):
    model = tiny_llama(len(tokenizer), tied=tied)
    merges = base_merge_ids(tokenizer)
    maps = {"input": _maps(32, 1), "output": _maps(32, 2)}
    _plant(model.get_input_embeddings().weight, merges, *maps["input"])
    if not tied:
        _plant(model.get_output_embeddings().weight, merges, *maps["output"])
    return model, maps


def _expected(matrix: torch.Tensor, extended, vocab: dict[str, int], left, right) -> torch.Tensor:
    """Each new token's row under the planted map, along its own merges."""
    made_by = {l + r: (l, r) for l, r in extended.merges}

    def row(string):
        if string in vocab:
            return matrix[vocab[string]].float()
        l, r = made_by[string]
        return row(l) @ left + row(r) @ right

    return torch.stack([row(t.token) for t in extended.new_tokens])


def test_the_fit_recovers_a_planted_composition(bpe_tokenizer):
    model, maps = _planted_model(bpe_tokenizer, tied=True)
    merges = base_merge_ids(bpe_tokenizer)
    assert len(merges) > 800
    fit, why_not = fit_composition(model.get_input_embeddings().weight, merges)
    assert why_not is None
    assert fit.held_out_cosine > 0.999 > 0.9 > fit.mean_cosine
    assert abs(fit.scale - 1) < 0.1  # little to shrink when the map is exact (only the ridge)


@pytest.mark.parametrize("tied", [True, False])
def test_new_rows_follow_their_own_merges_on_each_matrix(bpe_tokenizer, tied):
    model, maps = _planted_model(bpe_tokenizer, tied=tied)
    initializer = RowInitializer(model, bpe_tokenizer)
    assert initializer.method == "composition" and initializer.fallback_reason is None
    extended = extend_tokenizer(bpe_tokenizer, TERMS)
    assert any(len(t.base_ids) > 2 for t in extended.new_tokens)  # some are composed through intermediates
    rows = initializer(model, extended)
    vocab = bpe_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    want = _expected(model.get_input_embeddings().weight, extended, vocab, *maps["input"])
    assert F.cosine_similarity(rows.input, want, dim=1).min() > 0.99  # fit errors compound along long merges
    if tied:
        assert rows.output is None
        assert set(initializer.report()) == {"method", "input"}
    else:
        want_out = _expected(model.get_output_embeddings().weight, extended, vocab, *maps["output"])
        assert F.cosine_similarity(rows.output, want_out, dim=1).min() > 0.99
        assert F.cosine_similarity(rows.output, want, dim=1).max() < 0.9  # the head's own fit, not the input's
        assert set(initializer.report()) == {"method", "input", "output"}


def test_mined_merges_are_composed_too(bpe_tokenizer):
    model, maps = _planted_model(bpe_tokenizer, tied=True)
    vocab = bpe_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    first, second = bpe_tokenizer.tokenize(" hexadecimal")[:2]
    assert first + second not in vocab
    extended = extend_with_merges(bpe_tokenizer, [(first, second)])
    rows = RowInitializer(model, bpe_tokenizer)(model, extended)
    embedding = model.get_input_embeddings().weight
    want = embedding[vocab[first]] @ maps["input"][0] + embedding[vocab[second]] @ maps["input"][1]
    assert F.cosine_similarity(rows.input[0], want, dim=0) > 0.999


def test_rows_without_structure_fall_back_to_the_mean_and_say_why(bpe_tokenizer):
    model = tiny_llama(len(bpe_tokenizer))  # random rows: nothing composes
    initializer = RowInitializer(model, bpe_tokenizer)
    assert initializer.method == "subword_mean"
    assert "no better than their mean" in initializer.fallback_reason
    extended = extend_tokenizer(bpe_tokenizer, TERMS)
    rows = initializer(model, extended)
    assert torch.equal(rows.input, subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size).input)
    assert initializer.report()["asked"] == "composition"


def test_a_tokenizer_without_merges_falls_back_to_the_mean():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["hex", "##adec", "##imal", "micro", "##proc"])}}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    initializer = RowInitializer(tiny_llama(len(fast)), fast)
    assert initializer.method == "subword_mean"
    assert "0 merges" in initializer.fallback_reason


def test_the_real_vocabulary_composes_better_than_the_mean(smollm2_path, smollm2_tokenizer):
    from safetensors import safe_open

    with safe_open(str(smollm2_path / "model.safetensors"), framework="pt") as handle:
        embedding = handle.get_tensor("model.embed_tokens.weight")
    fit, why_not = fit_composition(embedding, base_merge_ids(smollm2_tokenizer))
    assert why_not is None
    # measured 0.715 against 0.434 (held-out tenth of SmolLM2's 48,900 merges)
    assert fit.held_out_cosine > fit.mean_cosine + 0.2
    assert 1.2 < fit.scale < 1.5  # least squares shrinks: 0.75x the real norms


def test_unknown_method_is_refused(bpe_tokenizer):
    with pytest.raises(ValueError, match="composition, subword_mean"):
        RowInitializer(tiny_llama(len(bpe_tokenizer)), bpe_tokenizer, "random")
