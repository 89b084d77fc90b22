"""Growing an AdamW state for new rows (extension/training/optimizer_state.py) on tiny models: the bias-
correction rescale, and every state that cannot be carried refused with its reason. The real
Trainer runs (saved checkpoint through the CLI, live callback) are in test_training_runs.py."""

from __future__ import annotations

import pytest
import torch

from extension.errors import UnsupportedCheckpointError
from extension.training.optimizer_state import grow_live_optimizer, grow_moments, trainer_checkpoint

from .conftest import tiny_llama

BASE_VOCAB, NEW = 250, 4


def _adam_entry(rows: int, dim: int, step: float, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"step": torch.tensor(step), "exp_avg": torch.randn(rows, dim, generator=g),
            "exp_avg_sq": torch.rand(rows, dim, generator=g)}


def test_new_rows_read_back_as_the_moments_tide_ended_with():
    """Under the run's own step and betas, AdamW's bias-corrected moments of the new rows equal
    TIDE's corrected moments, though the two were counted in different steps with other betas."""
    run = _adam_entry(BASE_VOCAB, 8, step=1000.0)
    rows = {**_adam_entry(NEW, 8, step=7.0, seed=1), "betas": (0.9, 0.95)}
    run_betas = (0.9, 0.999)
    grown = grow_moments(run, 256, BASE_VOCAB, rows, run_betas)
    assert torch.equal(grown["exp_avg"][:BASE_VOCAB], run["exp_avg"])
    assert torch.equal(grown["exp_avg_sq"][:BASE_VOCAB], run["exp_avg_sq"])
    assert grown["step"] is run["step"]
    new = slice(BASE_VOCAB, BASE_VOCAB + NEW)
    for key, (b_run, b_rows) in {"exp_avg": (0.9, 0.9), "exp_avg_sq": (0.999, 0.95)}.items():
        read_by_run = grown[key][new].double() / (1 - b_run**1000)
        ended_with = rows[key].double() / (1 - b_rows**7)
        torch.testing.assert_close(read_by_run, ended_with, rtol=1e-6, atol=1e-9)
    assert torch.all(grown["exp_avg"][BASE_VOCAB + NEW:] == 0) and torch.all(grown["exp_avg_sq"][BASE_VOCAB + NEW:] == 0)


def test_untrained_new_rows_get_zero_moments():
    grown = grow_moments(_adam_entry(BASE_VOCAB, 8, step=3.0), 256, BASE_VOCAB, None, (0.9, 0.999))
    assert torch.all(grown["exp_avg"][BASE_VOCAB:] == 0) and grown["exp_avg"].shape == (256, 8)


def test_live_optimizer_swaps_the_parameter_and_keeps_other_groups():
    old = torch.nn.Parameter(torch.zeros(BASE_VOCAB, 8))
    other = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([{"params": [other]}, {"params": [old], "lr": 5e-3, "weight_decay": 0.0}])
    (old.sum() + other.sum()).backward()
    optimizer.step()
    other_state = {k: v.clone() for k, v in optimizer.state[other].items()}
    new = torch.nn.Parameter(torch.zeros(256, 8))
    report = grow_live_optimizer(optimizer, [(old, new, "input_rows")], base_vocab_size=BASE_VOCAB, adapter_optimizer_state=None)
    assert report["resized"] == ["input_rows"] and optimizer.param_groups[1]["params"] == [new]
    assert old not in optimizer.state and optimizer.state[new]["exp_avg"].shape == (256, 8)
    assert all(torch.equal(optimizer.state[other][k], v) for k, v in other_state.items())
    new.grad = torch.ones_like(new)
    optimizer.step()  # the grown state is one AdamW accepts


def test_an_optimizer_without_adam_moments_is_refused():
    param = torch.nn.Parameter(torch.zeros(BASE_VOCAB, 4))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.sum().backward()
    optimizer.step()
    with pytest.raises(UnsupportedCheckpointError, match="only Adam/AdamW states"):
        grow_live_optimizer(optimizer, [(param, torch.nn.Parameter(torch.zeros(256, 4)), "input_rows")],
                            base_vocab_size=BASE_VOCAB, adapter_optimizer_state=None)


def _fake_trainer_checkpoint(folder, model, groups):
    """An optimizer.pt laid out as `groups` (lists of parameter names) with AdamW moments."""
    from transformers import Trainer

    named = dict(model.named_parameters())
    state, param_groups, index = {}, [], 0
    for names in groups:
        ids = []
        for name in names:
            state[index] = _adam_entry(*named[name].shape, step=2.0) if named[name].dim() == 2 else {
                "step": torch.tensor(2.0), "exp_avg": torch.zeros_like(named[name]), "exp_avg_sq": torch.zeros_like(named[name])}
            ids.append(index)
            index += 1
        param_groups.append({"params": ids, "betas": (0.9, 0.999), "lr": 1e-3, "weight_decay": 0.0})
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state": state, "param_groups": param_groups}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    decay = set(Trainer.get_decay_parameter_names(None, model))
    return [[n for n in named if n in decay], [n for n in named if n not in decay]]


def test_trainer_layout_is_read_and_a_foreign_one_refused_naming_the_parameter(tmp_path):
    model = tiny_llama(vocab_size=256)
    default = _fake_trainer_checkpoint(tmp_path / "ok", model, [])
    _fake_trainer_checkpoint(tmp_path / "ok", model, default)
    assert trainer_checkpoint(tmp_path / "ok", model).global_step == 2
    # the same parameters, the embedding moved into a group of its own: positions no longer match
    embedding = "model.embed_tokens.weight"
    custom = [[n for n in default[0] if n != embedding], default[1] + [embedding]]
    _fake_trainer_checkpoint(tmp_path / "custom", model, custom)
    with pytest.raises(UnsupportedCheckpointError) as caught:
        trainer_checkpoint(tmp_path / "custom", model)
    assert caught.value.param == "base_model"
    assert caught.value.message.startswith(f"the base checkpoint's optimizer.pt does not match Trainer's layout at {embedding}")
    assert "live callback" in caught.value.message


def test_a_model_only_folder_is_no_checkpoint(tmp_path):
    model = tiny_llama(vocab_size=256)
    model.save_pretrained(tmp_path)
    assert trainer_checkpoint(tmp_path, model) is None


@pytest.mark.parametrize("marker, kind", [("zero_to_fp32.py", "DeepSpeed ZeRO"), ("optimizer_0", "FSDP"),
                                          ("pytorch_model_fsdp_0", "FSDP")])
def test_sharded_optimizer_states_are_refused(tmp_path, marker, kind):
    model = tiny_llama(vocab_size=256)
    model.save_pretrained(tmp_path)
    (tmp_path / marker).mkdir() if "." not in marker else (tmp_path / marker).write_text("")
    with pytest.raises(UnsupportedCheckpointError, match=kind):
        trainer_checkpoint(tmp_path, model)


def test_amsgrad_state_grows_too():
    old = torch.nn.Parameter(torch.zeros(BASE_VOCAB, 8))
    optimizer = torch.optim.AdamW([old], amsgrad=True)
    old.sum().backward()
    optimizer.step()
    before = optimizer.state[old]["max_exp_avg_sq"].clone()
    new = torch.nn.Parameter(torch.zeros(256, 8))
    grow_live_optimizer(optimizer, [(old, new, "input_rows")], base_vocab_size=BASE_VOCAB, adapter_optimizer_state=None)
    grown = optimizer.state[new]["max_exp_avg_sq"]
    assert grown.shape == (256, 8) and torch.equal(grown[:BASE_VOCAB], before) and torch.all(grown[BASE_VOCAB:] == 0)
    new.grad = torch.ones_like(new)
    optimizer.step()
