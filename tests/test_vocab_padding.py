"""Issue 40 item 6: a base whose embedding is padded to a multiple of 128 (Megatron's default,
Llama 3's 128,256 rows, Qwen 2.5's 151,936) keeps that multiple when it grows; other bases keep
the option's multiple (64 by default), and `--pad-to-multiple-of 1` still means no padding."""

from __future__ import annotations

import torch

from extension.rows.init import NewRows, apply_rows, padded_vocab_size

from .conftest import tiny_llama


def test_the_base_multiple_of_128_is_kept():
    assert padded_vocab_size(400, 384, 64) == 512  # 384 = 3 x 128: a base padded to 128
    assert padded_vocab_size(400, 320, 64) == 448  # 320 = 5 x 64 only: the option's 64
    assert padded_vocab_size(400, 384, 256) == 512  # a larger asked multiple wins
    assert padded_vocab_size(400, 384, 1) == 400  # no padding asked: none


def test_a_model_padded_to_128_comes_back_padded_to_128():
    model = tiny_llama(vocab_size=384, tied=False)
    rows = NewRows(input=torch.randn(100, 32), output=torch.randn(100, 32))
    report = apply_rows(model, rows, base_vocab_size=300)
    assert model.get_input_embeddings().weight.shape[0] == 512 == model.config.vocab_size
    assert report["vocab_size"] == 512 and report["pad_to_multiple_of"] == 128
