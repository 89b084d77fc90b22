"""A real Trainer run on a tiny Llama: checkpoint, extend + train the new rows, carry the AdamW
state over, and resume the user's training on the extended model."""

from __future__ import annotations

import pytest
import torch

from extension.errors import InvalidOptionError
from extension.init import NewRows
from extension.optimizer_state import carry_trainer_state, extend_optimizer_state, is_trainer_checkpoint
from extension.rows import attach
from extension.train import TokenWindows, TrainConfig, train_rows

from .conftest import tiny_llama

BASE_VOCAB, NEW = 250, 4  # 254 -> padded to 256 rows (the base checkpoint has 256 rows too)


class _Windows(torch.utils.data.Dataset):
    def __init__(self, vocab: int, count: int = 16, seq_len: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(out, steps):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out), max_steps=steps, save_steps=steps, per_device_train_batch_size=4,
        learning_rate=1e-3, weight_decay=0.01, report_to=[], use_cpu=True, logging_steps=100,
        dataloader_num_workers=0, seed=0,
    )


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def user_checkpoint(request, tmp_path_factory):
    from transformers import Trainer

    tied = request.param
    out = tmp_path_factory.mktemp("user_run")
    model = tiny_llama(vocab_size=256, tied=tied).train()
    Trainer(model=model, args=_args(out, 3), train_dataset=_Windows(BASE_VOCAB)).train()
    return tied, out / "checkpoint-3"


def test_extended_optimizer_state_resumes_the_users_training(user_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, Trainer

    tied, checkpoint = user_checkpoint
    assert is_trainer_checkpoint(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    d = model.config.hidden_size
    rows = NewRows(input=torch.randn(NEW, d) * 0.02, output=None if tied else torch.randn(NEW, d) * 0.02)
    adapter = attach(model, BASE_VOCAB, rows)
    stream = torch.randint(0, BASE_VOCAB + NEW, (2000,), generator=torch.Generator().manual_seed(1))
    config = TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1)
    trained = train_rows(model, adapter, TokenWindows(stream, base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16), config)
    adapter.merge()
    published = tmp_path / "published"
    model.save_pretrained(published)
    report = carry_trainer_state(checkpoint, published, model, base_vocab_size=BASE_VOCAB, num_new=NEW,
                                 adapter_optimizer_state=trained.optimizer_state)
    assert report["new_rows_from"] == "adapter" and report["global_step"] == 3
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"} <= set(report["files"])
    assert report["resized"] == (["model.embed_tokens.weight"] if tied else ["model.embed_tokens.weight", "lm_head.weight"])

    before = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    after = torch.load(published / "optimizer.pt", weights_only=True)
    adapter_state = trained.optimizer_state["state"][0]
    for index, entry in before["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            old, new = entry[key], after["state"][index][key]
            if old.shape[0] == 256 and old.dim() == 2:  # embedding / lm_head
                assert new.shape == (256, d)
                assert torch.equal(new[:BASE_VOCAB], old[:BASE_VOCAB])
                assert torch.all(new[BASE_VOCAB + NEW:] == 0)
                if index == 0:  # the input embedding: the adapter's moments for the new rows
                    assert torch.equal(new[BASE_VOCAB:BASE_VOCAB + NEW], adapter_state[key])
            else:
                assert torch.equal(new, old)
        assert torch.equal(after["state"][index]["step"], entry["step"])

    extended = AutoModelForCausalLM.from_pretrained(published).train()
    trainer = Trainer(model=extended, args=_args(tmp_path / "resumed", 5),
                      train_dataset=_Windows(BASE_VOCAB + NEW, seed=2))
    trainer.train(resume_from_checkpoint=str(published))
    assert trainer.state.global_step == 5
    steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {5}  # the carried state was loaded and continued, not restarted


def test_a_foreign_optimizer_state_is_refused(user_checkpoint):
    from transformers import AutoModelForCausalLM

    _, checkpoint = user_checkpoint
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    state["param_groups"] = state["param_groups"][:1]
    with pytest.raises(InvalidOptionError, match="layout"):
        extend_optimizer_state(state, model, base_vocab_size=BASE_VOCAB, num_new=NEW)
