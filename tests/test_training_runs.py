"""Extending a real training run in progress: real SmolLM2 (tied, and untied with a cloned head),
a real transformers.Trainer on real FOLDOC text, a collator that tokenizes on the fly.

1. A saved Trainer checkpoint goes through `tide extend --base-model CHECKPOINT`; the published
   folder is itself a checkpoint the user's run resumes from.
2. A live run (untied) is extended at a chosen step by the callback (extension.live) and carries on.

In both, every old row's exp_avg / exp_avg_sq and every other parameter's AdamW state stay
bit-identical to the run's, the new rows get moments from TIDE's training, the new tokens are
single tokens in the batches after the extension, and training continues.
"""

from __future__ import annotations

import json

import pytest
import torch

from .service.conftest import foldoc_documents

TERMS = ["semaphore", "bytecode", "multithreading", "recursion"]
SEQ_LEN = 48


class OnTheFly:
    """Tokenizes each batch when it is drawn, with whatever tokenizer `current()` gives then."""

    def __init__(self, current):
        self.current = current
        self.max_id_seen = -1

    def __call__(self, rows):
        tokenizer = self.current()
        batch = tokenizer([row["text"] for row in rows], truncation=True, max_length=SEQ_LEN,
                          padding="max_length", return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        self.max_id_seen = max(self.max_id_seen, int(batch["input_ids"].max()))
        return {**batch, "labels": labels}


def _texts() -> list[dict]:
    """FOLDOC entries that use the terms (so batches after the extension contain new tokens)."""
    docs = foldoc_documents(20_000)
    chosen = [d for d in docs if any(t in d for t in TERMS)]
    return [{"text": d[:400]} for d in chosen[:40]]


def _args(out, max_steps: int, save: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=2, learning_rate=1e-4,
        weight_decay=0.01, report_to=[], use_cpu=True, logging_steps=1000, seed=0,
        save_strategy="steps" if save else "no", save_steps=max_steps, remove_unused_columns=False,
        dataloader_num_workers=0,
    )


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path).train(), AutoTokenizer.from_pretrained(path)


def _assert_carried(before: dict, after: dict, vocab_names: set[str], base_vocab: int, new_end: int):
    """before/after: parameter name -> AdamW state. Old rows and other parameters bit-identical."""
    assert set(before) == set(after)
    for name, old in before.items():
        new = after[name]
        assert torch.equal(new["step"], old["step"]), name
        for key in ("exp_avg", "exp_avg_sq"):
            if name in vocab_names:
                assert torch.equal(new[key][:base_vocab], old[key][:base_vocab]), (name, key)
                assert new[key][base_vocab:new_end].abs().sum() > 0, f"{name} {key}: new rows have no moments"
                assert torch.all(new[key][new_end:] == 0), f"{name} {key}: padding rows must have none"
            else:
                assert torch.equal(new[key], old[key]), (name, key)


def _vocab_names(model) -> set[str]:
    from extension.training.optimizer_state import vocab_parameters

    roles = vocab_parameters(model)
    return {name for name, p in model.named_parameters() if id(p) in roles}


@pytest.fixture(scope="module", params=["tied", "untied"])
def base_path(request, smollm2_path, smollm2_untied_path):
    return request.param, smollm2_path if request.param == "tied" else smollm2_untied_path


def test_saved_checkpoint_extended_by_the_cli_resumes(base_path, tmp_path):
    from transformers import Trainer

    from app.cli import main
    from extension.rows.init import is_tied

    kind, path = base_path
    model, tokenizer = _load(path)
    assert is_tied(model) == (kind == "tied")
    texts = _texts()
    Trainer(model=model, args=_args(tmp_path / "run", 2, save=True), train_dataset=texts,
            data_collator=OnTheFly(lambda: tokenizer), processing_class=tokenizer).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"

    terms = tmp_path / "terms.txt"
    terms.write_text("\n".join(TERMS) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(t["text"] for t in texts * 3))
    out = tmp_path / "extended"
    assert main(["extend", "--base-model", str(checkpoint), "--terms", str(terms), "--corpus", str(corpus),
                 "--out", str(out), "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000"]) == 0

    published = json.loads((out / "tide_extension.json").read_text())
    carried = published["trainer_checkpoint"]
    assert carried["from_step"] == 2 and carried["new_rows_from"] == "adapter"
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin", "rng_state.pth"} <= set(carried["files"])
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= {p.name for p in out.iterdir()}
    base_vocab = published["vocab"]["base_vocab_size"]
    new_end = base_vocab + published["counts"]["new_vocab_entries"]

    extended, new_tokenizer = _load(out)
    for term in TERMS:
        assert len(new_tokenizer.tokenize(" " + term)) == 1, term
    names = [[n for n, _ in group] for group in [list(extended.named_parameters())]][0]
    saved_before = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    saved_after = torch.load(out / "optimizer.pt", weights_only=True)
    from extension.training.optimizer_state import trainer_parameter_order

    order = [name for group in trainer_parameter_order(extended) for name in group]
    assert sorted(order) == sorted(names)
    by_name = lambda saved: {order[i]: saved["state"][i] for i in saved["state"]}  # noqa: E731
    _assert_carried(by_name(saved_before), by_name(saved_after), _vocab_names(extended), base_vocab, new_end)

    collate = OnTheFly(lambda: new_tokenizer)
    trainer = Trainer(model=extended, args=_args(tmp_path / "resumed", 4, save=False), train_dataset=texts,
                      data_collator=collate, processing_class=new_tokenizer)
    trainer.train(resume_from_checkpoint=str(out))
    assert trainer.state.global_step == 4
    assert collate.max_id_seen >= base_vocab  # the resumed run's batches hold new tokens
    steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {4}  # the carried state was loaded and continued, not restarted


class _Snapshot:
    """A TrainerCallback that copies the optimizer state (by parameter name) at one step."""

    def __init__(self, at_step: int):
        from transformers import TrainerCallback

        self.at_step, self.state = at_step, None
        snapshot = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
                if state.global_step == snapshot.at_step:
                    inner = getattr(optimizer, "optimizer", optimizer)
                    snapshot.state = {name: {k: v.clone() for k, v in inner.state[p].items()}
                                      for name, p in model.named_parameters() if p in inner.state}

        self.callback = _Callback()


def test_live_run_is_extended_at_a_step_and_carries_on(smollm2_untied_path, tmp_path):
    """Untied only: a tied model's one vocab parameter is this case's input side, grown by the same
    grow_live_optimizer (tests/test_optimizer_state.py), and a real tied run is the checkpoint test's."""
    from transformers import Trainer

    from extension.live import extend_during_training

    model, tokenizer = _load(smollm2_untied_path)
    texts = _texts()
    base_vocab = len(tokenizer)
    trainer = Trainer(model=model, args=_args(tmp_path / "run", 5, save=False), train_dataset=texts,
                      processing_class=tokenizer)
    before, after = _Snapshot(2), _Snapshot(2)
    trainer.add_callback(before.callback)
    extension = extend_during_training(trainer, at_step=2, terms=TERMS, corpus=_corpus(tmp_path, texts),
                                       steps=3, batch_size=2, seq_len=32)
    trainer.add_callback(after.callback)
    collate = OnTheFly(lambda: extension.tokenizer)
    trainer.data_collator = collate
    trainer.train()

    assert trainer.state.global_step == 5
    report = extension.report
    assert report["trained_steps"] == 3 and report["optimizer"]["new_rows_from"] == "adapter"
    # steps given: the device decides only the time budget left unset (the run's own device: this CPU)
    assert report["device_defaults"]["options"] == {"max_train_seconds": 7200, "term_contexts": 4, "term_context_tokens": 64}
    assert set(report["optimizer"]["resized"]) == {"input_rows", "output_rows"}
    new_end = base_vocab + report["counts"]["new_vocab_entries"]
    _assert_carried(before.state, after.state, _vocab_names(trainer.model), base_vocab, new_end)
    for term in TERMS:
        assert len(extension.tokenizer.tokenize(" " + term)) == 1, term
    assert collate.max_id_seen >= base_vocab  # batches after step 2 hold new tokens
    assert trainer.model.get_input_embeddings().weight.shape[0] == report["vocab"]["vocab_size"]
    assert any("tide_extension" in entry for entry in trainer.state.log_history)


def _corpus(tmp_path, texts):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(t["text"] for t in texts * 3))
    return corpus
