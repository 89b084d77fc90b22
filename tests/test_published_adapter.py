"""The published PEFT adapter (issue 37, item 1): the base model plus `adapter/` must read and
predict exactly as the merged folder does, on text with new tokens, tied and untied, fp32 and bf16.
The adapter is written by `publishing.folder.publish` itself, on a real tiny Llama whose new input
and output rows differ from the base's resized rows."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from extension.publishing.folder import publish
from tests.conftest import tiny_llama

BASE_VOCAB, VOCAB = 256, 320  # 64 rows past the base: new tokens and padding, as a job publishes them
TEXT = torch.tensor([[1, 300, 5, 257, 40, 319, 258, 7, 300, 300]])  # old and new ids mixed


class _NoTokenizer:
    def save_pretrained(self, folder):  # the adapter test needs no tokenizer files
        pass


def _extended(tied: bool, dtype: torch.dtype):
    model = tiny_llama(vocab_size=BASE_VOCAB, tied=tied).to(dtype)
    base_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.resize_token_embeddings(VOCAB, mean_resizing=False)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        rows = torch.randn(VOCAB - BASE_VOCAB, model.config.hidden_size, generator=generator)
        model.get_input_embeddings().weight[BASE_VOCAB:] = rows.to(dtype)
        if not tied:  # untied: the head's new rows are their own (never the input rows)
            head = torch.randn(VOCAB - BASE_VOCAB, model.config.hidden_size, generator=generator)
            model.get_output_embeddings().weight[BASE_VOCAB:] = head.to(dtype)
    return model, base_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_base_plus_adapter_predicts_as_the_merged_folder(tmp_path, tied, dtype):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, base_state = _extended(tied, dtype)
    base_dir = tmp_path / "base"
    base = tiny_llama(vocab_size=BASE_VOCAB, tied=tied).to(dtype)
    base.load_state_dict(base_state)
    base.save_pretrained(base_dir)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PEFT's "cannot tie the adapters" must not reach a user either
        publish(out, model=model, tokenizer=_NoTokenizer(), extension={}, metrics={}, model_card="card",
                adapter_token_ids=list(range(BASE_VOCAB, VOCAB)))

    merged = AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
    assert merged.dtype == dtype
    resized = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    resized.resize_token_embeddings(VOCAB, mean_resizing=False)
    adapted = PeftModel.from_pretrained(resized, out / "adapter").eval()
    with torch.no_grad():
        expected = merged(TEXT).logits
        got = adapted(TEXT).logits
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected), (got - expected).abs().max().item()
    # the new rows' logits (the head's side) are the ones an input-only adapter got wrong
    assert expected[..., BASE_VOCAB:].abs().max() > 0

    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == (["embed_tokens"] if tied else ["embed_tokens", "lm_head"])
    assert config["token_indices"] == list(range(BASE_VOCAB, VOCAB))
