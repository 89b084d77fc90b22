"""Extend the vocabulary of a `transformers.Trainer` run while it trains.

    trainer = Trainer(model=model, args=args, train_dataset=texts, data_collator=collate,
                      processing_class=tokenizer)
    extension = extend_during_training(trainer, at_step=500, terms=["immunohistochemistry", ...])
    trainer.train()   # at step 500: new tokens, rows trained briefly, optimizer grown; training goes on

At the chosen step (after that step's optimizer update) the callback runs the same stages as
`tide extend` between load and evaluate (mine or extend, init, generate, train, select: each
package's stage.py, here on the live model itself), writes the rows into the resized model, and grows the live
optimizer's state in place with optimizer_state.grow_live_optimizer: every old row's moments and
every other parameter's state untouched, the new rows' moments from TIDE's own training. The
Trainer's `processing_class` becomes the extended tokenizer, so later checkpoints save it; a
collator that tokenizes on the fly should read `extension.tokenizer` so later batches use the new
tokens. The optimizer may have any parameter groups (the embedding in its own group is fine): the
live optimizer is matched by parameter object, not by position.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from transformers import TrainerCallback

from .errors import InvalidCorpusError, InvalidOptionError, UnsupportedCheckpointError, UnsupportedModelError
from .plan.new_ids import appended_ids_not_text
from .rows.init import apply_rows
from .training.optimizer_state import grow_live_optimizer, vocab_parameters
from .plan.options import defaults_for_device
from .plan.job import validate_spec
from .mining.stage import mine_corpus
from .plan.spec import Callbacks, ExtendSpec, mines_corpus
from .rows.stage import start_rows
from .selection.stage import Chosen, choose_terms
from .tokenizer.stage import extend_with_terms
from .training.stage import Trained, train_new_rows, write_texts


class ExtendVocabularyCallback(TrainerCallback):
    """Runs `extend_live_run` once, at the end of step `at_step`. `report` holds what it did."""

    def __init__(self, trainer, spec: ExtendSpec, at_step: int, callbacks: Callbacks | None = None):
        self.trainer, self.spec, self.at_step = trainer, spec, at_step
        self.callbacks = callbacks or Callbacks()
        self.report: dict | None = None

    @property
    def tokenizer(self):
        """The tokenizer batches should use now: the base one before the extension, then the extended one."""
        return self.trainer.processing_class

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at_step and self.report is None:
            try:
                self.report = extend_live_run(self.trainer, self.spec, self.callbacks)
            except InvalidCorpusError as exc:
                # No mined term paid for itself on validation: nothing of the run was touched yet
                # (the rows trained on a detachable adapter), so the run goes on unextended.
                self.callbacks.on_warning(f"vocabulary not extended at step {state.global_step}: {exc.message}")
                self.report = {"counts": {}, "not_extended": exc.message}
            state.log_history.append({"step": state.global_step, "tide_extension": self.report["counts"]})
        return control


def extend_during_training(trainer, *, at_step: int, terms: list[str] | None = None, corpus: str | Path | None = None,
                           callbacks: Callbacks | None = None, **options) -> ExtendVocabularyCallback:
    """Add a callback to `trainer` that extends its vocabulary at step `at_step`.

    `terms` and/or `corpus` (a file; with only a corpus the terms are mined from it) and any
    option of extension.plan.options (steps, batch_size, seq_len, lr, ...) as for `tide extend`.
    Everything that can be checked now is checked now, before the run starts."""
    if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 1:
        raise InvalidOptionError(f"at_step must be a step number >= 1, got {at_step!r}", param="at_step")
    spec = ExtendSpec(base_model="(live Trainer run)", out_dir=Path("."), terms=terms,
                      corpus_path=Path(corpus) if corpus is not None else None, **options)
    validate_spec(spec)
    if spec.new_ids == "reserved":
        # The live run's model, optimizer and collator all follow appended ids; moving rows onto
        # reserved ids mid-run is not built.
        raise InvalidOptionError(option="new_ids", problem=(
            "is 'reserved', which extend_during_training does not support: a live run's new tokens are appended; "
            "leave new_ids unset or 'append', or extend the saved checkpoint with `tide extend --new-ids reserved`"))
    _check_trainer(trainer)
    not_text = appended_ids_not_text(getattr(trainer.model, "config", None))
    if not_text:  # Gemma 3n: a live run can only append, and there an appended id is not text
        raise UnsupportedModelError(
            f"extend_during_training appends the new tokens, but {not_text}: extend a saved checkpoint with "
            "`tide extend` instead, which puts them on reserved ids for this model", param=None)
    callback = ExtendVocabularyCallback(trainer, spec, at_step, callbacks)
    trainer.add_callback(callback)
    return callback


def _check_trainer(trainer) -> None:
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or trainer.args.world_size > 1:
        raise UnsupportedCheckpointError(
            "this run is distributed (DeepSpeed, FSDP or several processes): its optimizer state is sharded "
            "across processes and TIDE would have to grow every shard in step; extend a single-process run, "
            "or a saved checkpoint with a full optimizer.pt", param=None,
        )
    tokenizer = trainer.processing_class
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise InvalidOptionError(
            "the Trainer needs its fast tokenizer as processing_class (Trainer(..., processing_class=tokenizer)): "
            "TIDE extends that tokenizer and gives the extended one back to the Trainer", param="processing_class",
        )


def extend_live_run(trainer, spec: ExtendSpec, callbacks: Callbacks | None = None) -> dict:
    """Extend the running `trainer`'s model, tokenizer and optimizer now (see the module docstring)."""
    callbacks = callbacks or Callbacks()
    model = trainer.accelerator.unwrap_model(trainer.model)
    device_defaults = defaults_for_device(spec, model.device.type)  # the run's own device decides
    spec = replace(spec, **device_defaults)
    before = _vocab_params(model)
    was_training = model.training
    # The user's run keeps its own random stream: TIDE's seeded sampling must not shift it.
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            chosen, trained = _new_rows(spec, model, trainer.processing_class, callbacks)
        finally:
            model.train(was_training)
    extended = chosen.extended
    rows_report = apply_rows(model, chosen.rows, base_vocab_size=extended.base_vocab_size,
                             pad_to_multiple_of=spec.pad_to_multiple_of)
    after = _vocab_params(model)  # resizing made new parameter objects
    for role, param in after.items():
        param.requires_grad_(before[role].requires_grad)  # a frozen embedding stays frozen
    optimizer_report = grow_live_optimizer(
        trainer.optimizer, [(before[role], after[role], role) for role in after],
        base_vocab_size=extended.base_vocab_size,
        adapter_optimizer_state=chosen.optimizer_state,
    )
    trainer.processing_class = extended.tokenizer
    report = extended.to_json()
    return {
        "counts": report["counts"],
        "new_tokens": report["new_tokens"],
        "skipped": report["skipped"],
        "vocab": {k: rows_report[k] for k in ("base_vocab_size", "vocab_size", "tied")},
        "trained_steps": trained.result.steps_done if trained.result else 0,
        "device_defaults": {"device": model.device.type, "options": device_defaults},
        "selection": {k: v for k, v in chosen.report.items() if k != "effects"},
        "optimizer": optimizer_report,
    }


def _new_rows(spec: ExtendSpec, model, tokenizer, callbacks: Callbacks) -> tuple[Chosen, Trained]:
    """The stages of `tide extend` from mine / extend to select, trained on `model` itself, where
    it is (never a copy of it)."""
    rows_in_use = model.get_input_embeddings().weight.shape[0]
    mined = mine_corpus(spec, tokenizer, callbacks, documents=0, embedding_rows=rows_in_use) if mines_corpus(spec) else None
    extended = mined.extended if mined else extend_with_terms(spec, tokenizer, callbacks, embedding_rows=rows_in_use)
    start = start_rows(spec, model, tokenizer, extended, callbacks)
    texts = write_texts(spec, model, tokenizer, extended, callbacks, init=start.method)
    trained = train_new_rows(spec, model, extended, start, texts, callbacks)
    return choose_terms(spec, model, tokenizer, extended, trained, texts, start, mined, callbacks), trained


def _vocab_params(model) -> dict[str, torch.nn.Parameter]:
    """role (input_rows / output_rows / output_bias) -> the model's vocab-sized parameter."""
    by_id = {id(p): p for p in model.parameters()}
    return {role: by_id[key] for key, role in vocab_parameters(model).items()}
