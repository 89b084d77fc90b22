"""Memory planning (extension/plan/memory.py): the estimate's parts, and a job that cannot fit is
refused before its weights are read, with the figures and what to change."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from app.cli import main
from extension.plan import memory as memory_plan
from extension.plan.devices import Placement
from extension.plan.memory import GIB, InsufficientMemoryError, check_plan, plan_job

CPU = Placement(torch.device("cpu"))
# SmolLM2-135M's shape (the real config's numbers), tied
SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True)


def test_the_plan_counts_weights_activations_loss_rows_and_evaluation():
    plan = plan_job(SMOLLM2, placement=CPU, dtype=torch.float32, batch_size=4, seq_len=128, steps=10,
                    new_rows=300, available=64 * GIB)
    parameters = memory_plan.count_parameters(SMOLLM2)
    assert 134_000_000 < parameters < 135_000_000  # tied: the embedding counted once
    parts = plan.parts
    assert parts["weights"] == parameters * 4
    factor = 8 + 4 * 1536 / 576
    assert parts["training_activations"] == int(4 * 128 * 30 * 576 * factor * 4)
    assert parts["new_rows_and_adamw"] == 300 * 576 * 4 * 4
    # one loss chunk of fp32 logits, never [batch, seq, vocab] at once for big batches
    big = plan_job(SMOLLM2, placement=CPU, dtype=torch.float32, batch_size=64, seq_len=2048, steps=1, new_rows=300,
                   available=GIB, parameters=parameters)
    assert big.parts["training_loss"] == 3 * memory_plan.LOSS_CHUNK_ELEMENTS * 4 + 2 * 64 * 2048 * 576 * 4
    assert big.parts["training_loss"] < 64 * 2048 * 49152 * 4 / 20  # the full fp32 logits would be 24 GiB
    assert plan.needed == parts["weights"] + max(parts["training_activations"] + parts["training_loss"]
                                                 + parts["new_rows_and_adamw"], parts["evaluation"], parts["vocabulary_resize"])
    assert plan.fits
    # bf16 halves weights and activations; no training: no activations, rows or optimizer
    half = plan_job(SMOLLM2, placement=CPU, dtype=torch.bfloat16, batch_size=4, seq_len=128, steps=0, new_rows=300,
                    available=GIB, parameters=parameters)
    assert half.parts["weights"] == parameters * 2 and "training_activations" not in half.parts


def test_a_cpu_job_computing_in_bf16_counts_the_checkpoint_copy_it_publishes():
    """bf16 on an AMX CPU, fp32 checkpoint: publishing loads the fp32 weights beside the bf16
    ones and resizes those (publishing.stage._publishable), so the plan's last phase holds both."""
    parameters = memory_plan.count_parameters(SMOLLM2)
    same = plan_job(SMOLLM2, placement=CPU, dtype=torch.bfloat16, batch_size=4, seq_len=128, steps=10, new_rows=300,
                    available=64 * GIB, parameters=parameters)
    mixed = plan_job(SMOLLM2, placement=CPU, dtype=torch.bfloat16, batch_size=4, seq_len=128, steps=10, new_rows=300,
                     available=64 * GIB, parameters=parameters, stored_dtype=torch.float32)
    resized = (49152 + 300 + 64) * 576
    assert same.parts["vocabulary_resize"] == resized * 2
    assert mixed.parts["vocabulary_resize"] == parameters * 4 + resized * 4
    assert mixed.parts["weights"] == parameters * 2
    assert mixed.needed == mixed.parts["weights"] + mixed.parts["vocabulary_resize"] > same.needed
    assert any("publishing loads the checkpoint's float32 weights" in note for note in mixed.notes)


def test_a_batch_that_does_not_fit_is_refused_naming_batch_size_seq_len_and_what_fits():
    plan = plan_job(SMOLLM2, placement=CPU, dtype=torch.float32, batch_size=64, seq_len=2048, steps=10,
                    new_rows=300, available=8 * GIB)
    assert not plan.fits
    with pytest.raises(InsufficientMemoryError) as caught:
        check_plan(plan, base_model="smollm2-135m", batch_size=64, seq_len=2048)
    error = caught.value
    assert error.code == "insufficient_memory" and error.option == "batch_size"
    assert error.problem.startswith(f"64 with seq_len 2048 needs about {plan.needed / GIB:.2f} GiB on cpu (weights 0.50 GiB, ")
    assert "more than the 8.00 GiB available there; lower the batch size or the sequence length" in error.problem
    fits = (plan.available - plan.batch_independent) // plan.per_sequence
    assert 0 < fits < 64 and f"at most about {fits} sequences of 2048 tokens would fit" in error.problem
    smaller = plan_job(SMOLLM2, placement=CPU, dtype=torch.float32, batch_size=fits, seq_len=2048, steps=10,
                       new_rows=300, available=8 * GIB)
    assert smaller.fits  # the advice is right: that many do fit
    check_plan(smaller, base_model="smollm2-135m", batch_size=fits, seq_len=2048)


def test_weights_that_do_not_fit_at_any_batch_size_name_the_base_model():
    plan = plan_job(SMOLLM2, placement=CPU, dtype=torch.float32, batch_size=1, seq_len=128, steps=10,
                    new_rows=300, available=256 * 1024**2)
    with pytest.raises(InsufficientMemoryError) as caught:
        check_plan(plan, base_model="smollm2-135m", batch_size=1, seq_len=128)
    assert caught.value.param == "base_model" and caught.value.option is None
    assert caught.value.message.startswith("base model 'smollm2-135m' needs about")
    assert "whatever the batch size" in caught.value.message and "device_map auto" in caught.value.message


def test_a_gpu_plan_counts_the_cuda_context():
    plan = plan_job(SMOLLM2, placement=Placement(torch.device("cuda:0")), dtype=torch.bfloat16, batch_size=16,
                    seq_len=512, steps=1000, new_rows=2400, available=140 * GIB)
    assert plan.parts["cuda_context"] == memory_plan.CUDA_CONTEXT_BYTES and plan.fits
    assert plan.device == "cuda:0" and plan.dtype == "bfloat16"


def test_the_cli_refuses_a_batch_that_cannot_fit_before_loading_the_weights(tmp_path, smollm2_path, monkeypatch, capsys):
    """SmolLM2 at 1024 x 8192 (its whole context): terabytes of activations on any machine here."""
    from app.settings import get_settings
    from extension import pipeline

    monkeypatch.setenv("TIDE_CACHE_DIR", str(smollm2_path.parent.parent))
    monkeypatch.setenv("TIDE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()

    def no_load(*_args, **_kwargs):
        raise AssertionError("the weights must not be loaded for a job that cannot fit")

    monkeypatch.setattr(pipeline, "load_model", no_load)
    terms = tmp_path / "terms.txt"
    terms.write_text("kernel\n")
    code = main(["extend", "--base-model", "smollm2-135m", "--terms", str(terms), "--out", str(tmp_path / "out"),
                 "--batch-size", "1024", "--seq-len", "8192", "--device", "cpu", "--steps", "1"])
    get_settings.cache_clear()
    assert code == 2
    err = capsys.readouterr().err
    assert "tide: error (--batch-size): --batch-size 1024 with seq_len 8192 needs about" in err
    assert "lower the batch size or the sequence length" in err
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_model_bigger_than_the_available_memory(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A fake small 'available' figure for the whole job: refused, naming the model."""
    from app.settings import get_settings
    from extension import pipeline

    monkeypatch.setenv("TIDE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIDE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    monkeypatch.setattr(memory_plan, "available_memory", lambda placement: 100_000)
    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("loaded a model that cannot fit"))
    terms = tmp_path / "terms.txt"
    terms.write_text("kernel\n")
    code = main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(terms), "--out", str(tmp_path / "out")])
    get_settings.cache_clear()
    assert code == 2
    err = capsys.readouterr().err
    assert f"tide: error (base_model): base model {str(tiny_model_dir)!r} needs about" in err
    assert "more than the 0.00 GiB available there, whatever the batch size" in err


def test_parameters_come_from_the_files_when_the_architecture_cannot_be_built(tiny_model_dir, monkeypatch):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    built = memory_plan.estimate_parameters(config, tiny_model_dir)

    def cannot(_config):
        raise ValueError("unknown architecture")

    monkeypatch.setattr(memory_plan, "count_parameters", cannot)
    assert memory_plan.estimate_parameters(config, tiny_model_dir) == built  # tied: stored once in the file
    assert memory_plan.estimate_parameters(config, None) > 0  # the formula, from the config's sizes


def test_a_per_layer_intermediate_size_is_planned_at_its_largest_layer():
    """Gemma 3n stores intermediate_size as one value per layer (issue 40 item 1); before, int() of
    the list raised TypeError before any weights were read."""
    from transformers import Gemma3nTextConfig

    config = Gemma3nTextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=64,
                               hidden_size_per_layer_input=8, num_hidden_layers=2, intermediate_size=[96, 128],
                               num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                               layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0,
                               laurel_rank=8, altup_num_inputs=4)
    plan = plan_job(config, placement=CPU, dtype=torch.float32, batch_size=2, seq_len=16, steps=2, new_rows=4,
                    parameters=1000, available=GIB)
    assert "8 + 4 x intermediate/hidden" in plan.notes[0] and "16.0" in plan.notes[0]  # 8 + 4 * 128 / 64
