"""Gemma 3n's per-layer embeddings (issue 40 item 1): a tiny random Gemma3nForCausalLM with the
real Gemma tokenizer through `tide extend`. The per-layer table (`embed_tokens_per_layer`) is
indexed by token id up to `vocab_size_per_layer_input`; ids past it get row 0 in the model's own
forward (and in the multimodal class go to the vision/audio embedders)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main

PER_LAYER_ROWS = 262144  # Gemma 3n's text ids; 262,144..262,399 are its soft (vision/audio) tokens


@pytest.fixture(scope="module")
def extended(gemma3_tokenizer_path, tmp_path_factory):
    from transformers import AutoTokenizer, Gemma3nForCausalLM, Gemma3nTextConfig

    folder = tmp_path_factory.mktemp("gemma3n")
    tokenizer = AutoTokenizer.from_pretrained(gemma3_tokenizer_path)
    config = Gemma3nTextConfig(
        vocab_size=262400, vocab_size_per_layer_input=PER_LAYER_ROWS, hidden_size=32, hidden_size_per_layer_input=4,
        num_hidden_layers=2, intermediate_size=[64, 64], num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0, laurel_rank=4, altup_num_inputs=2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Gemma3nForCausalLM(config).save_pretrained(folder / "base")
    tokenizer.save_pretrained(folder / "base")
    (folder / "terms.txt").write_text("ciprofloxacin\nimmunohistochemistry\n")
    torch.set_num_threads(1)
    # Before the memory plan read a per-layer intermediate_size list, this exited on int(list).
    code = main(["extend", "--base-model", str(folder / "base"), "--terms", str(folder / "terms.txt"), "--steps", "0",
                 "--eval-bytes", "1000", "--out", str(folder / "out")])
    assert code == 0
    return folder / "base", folder / "out"


def _tensors(folder):
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_a_gemma3n_job_publishes_and_keeps_every_old_per_layer_row(extended):
    base, out = extended
    old, new = _tensors(base), _tensors(out)
    name = next(n for n in old if n.endswith("embed_tokens_per_layer.weight"))
    assert torch.equal(new[name][:PER_LAYER_ROWS], old[name])


def test_the_published_gemma3n_runs_text_with_new_tokens(extended):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out = extended
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("ciprofloxacin and immunohistochemistry", return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert model(ids).logits.isfinite().all()


@pytest.mark.xfail(strict=True, reason="issue 40 item 1, not built yet: new terms are appended after 262,400 and "
                   "transformers' resize grows the per-layer table with random rows, so the old soft-token ids "
                   "262,144..262,399 lose their row-0 routing and new tokens' per-layer rows are neither "
                   "initialised from their pieces nor trained; needs new ids on reserved <unusedN> ids")
def test_new_gemma3n_tokens_are_ids_the_model_routes_as_text_and_old_ids_route_as_before(extended):
    import json

    base, out = extended
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size_per_layer_input"] == PER_LAYER_ROWS  # old soft tokens still get row 0
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(out)(" ciprofloxacin", add_special_tokens=False).input_ids
    assert len(ids) == 1 and ids[0] < PER_LAYER_ROWS
