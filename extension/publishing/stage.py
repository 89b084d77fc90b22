"""The publish stage of a job: the checkpoint, adapter, tokenizer, card and manifest, and the
result the CLI prints and the worker records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..plan import devices as job_devices
from ..plan.models import load_model
from ..rows.init import apply_rows, reserved_ids
from .card import model_card
from .decisions import decision_sentences, precision_record, precision_sentence
from .folder import publish


@dataclass
class PipelineResult:
    out_dir: Path
    metrics: dict
    manifest: list[dict]
    extension: dict
    mined_terms: list[dict] | None = None
    seconds: dict = field(default_factory=dict)

    def summary(self) -> str:
        counts = self.extension.get("counts", {})
        lines = [
            f"Extended model written to {self.out_dir}",
            f"  terms added: {counts.get('terms_added', '?')}, new vocabulary entries: "
            f"{counts.get('new_vocab_entries', '?')}, skipped: {counts.get('skipped', 0)}",
        ]
        reserved = self.extension.get("reserved_tokens")
        if reserved is not None:
            lines.append(f"  new ids: {len(reserved)} reserved tokens taken, the embedding keeps its "
                         f"{self.extension['vocab']['vocab_size']:,} rows: {reserved_summary(reserved)}")
        why = self.extension.get("vocab", {}).get("new_ids_reason")
        if why:  # new_ids 'auto' chose reserved ids: the user did not ask for them, so say why
            lines.append(f"  {why}")
        for key, row in self.metrics.get("comparison", {}).items():
            if "before" in row:
                lines.append(f"  {key}: {row['before']:.4f} -> {row['after']:.4f}")
        # right under the figures it qualifies: a bf16 job's figures are not the fp32 download's
        scored_in = precision_sentence(self.metrics)
        lines += [f"  {scored_in}"] if scored_in else []
        lines += [f"  {sentence}" for sentence in decision_sentences(self.metrics, style="cli", precision=False)]
        lines.append("  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items()))
        return "\n".join(lines)


def publish_job(plan, model, sources, *, chosen, trained, start, mined, metrics: dict, layout: dict,
                checkpoint) -> PipelineResult:
    """Write the job's folder. The published weights are in the base checkpoint's dtype with the
    old rows bit-identical to its files: the job's model when it holds exactly those (a CPU job),
    else the checkpoint loaded again on the CPU with the same rows written in (a bf16 job of an
    fp32 checkpoint, or a model spread with weights offloaded). `checkpoint` is the base's
    Trainer checkpoint (training.optimizer_state.TrainerCheckpoint) or None."""
    spec, extended = plan.spec, chosen.extended
    at_ids = reserved_ids(extended)
    model = _publishable(model, plan, sources, chosen.rows, extended.base_vocab_size, at_ids)
    metrics["devices"]["publish"] = job_devices.describe(model)
    steps_done = trained.result.steps_done if trained.result else 0
    init = {**start.report, **({"distillation": trained.distillation} if trained.distillation is not None else {})}
    extension = {
        "base_model": {"name": spec.base_model, "source": plan.resolved.kind},
        # corpus_path is where the file lay on the machine that ran the job: corpus_name says which corpus it was
        "spec": {k: v for k, v in spec.to_json().items() if k not in {"terms", "out_dir", "force", "corpus_path"}},
        # the options the job left to its device, and what that device made them
        "device_defaults": {"device": plan.placement.defaults_kind, "options": plan.device_defaults},
        "init": init,
        "trained_steps": steps_done,
        "training": {k: v for k, v in metrics["training"].items() if k != "history"},
        "published_step": chosen.report.get("best_step", steps_done),
        "vocab": {k: layout[k] for k in ("base_vocab_size", "vocab_size", "tied")} | {"new_ids": spec.new_ids}
        | ({"new_ids_reason": plan.new_ids_reason} if plan.new_ids_reason else {}),
        "padding_ids": layout["padding_ids"],
        **extended.to_json(),
        "selection": chosen.report,
        # a bf16 job scores the bf16 model and publishes the checkpoint's dtype: say which was scored
        "evaluation_precision": precision_record(metrics),
    }
    if mined is not None:
        extension["mining"] = mined.to_json()
    write_extra = None
    if checkpoint is not None:
        optimizer_state, carried = checkpoint.extend(model, base_vocab_size=extended.base_vocab_size,
                                                     adapter_optimizer_state=chosen.optimizer_state, at_ids=at_ids)
        carried["files"] = checkpoint.write_list()
        extension["trainer_checkpoint"] = carried
        write_extra = lambda staging: checkpoint.write(staging, optimizer_state)  # noqa: E731
    history = metrics["training"]["history"]
    manifest = publish(
        spec.out_dir, model=model, tokenizer=extended.tokenizer, extension=extension, metrics=metrics,
        model_card=model_card(spec, extension, metrics, history), history=history,
        adapter_token_ids=at_ids if at_ids is not None else list(range(extended.base_vocab_size, layout["vocab_size"])),
        adapter_target_module=embedding_module_name(model), write_extra=write_extra, force=spec.force,
        max_shard_bytes=plan.max_shard_bytes,
    )
    return PipelineResult(out_dir=Path(spec.out_dir), metrics=metrics, manifest=manifest, extension=extension,
                          mined_terms=list(extension["mining"].get("terms", [])) if mined else None)


def _publishable(model, plan, sources, rows, base_vocab_size: int, at_ids: list[int] | None = None):
    """The model to publish: `model` when its weights are the checkpoint's own (same dtype, none
    offloaded), else the checkpoint loaded on the CPU in its dtype with `rows` applied (at the
    reserved ids `at_ids` where the new tokens took those)."""
    if model.get_input_embeddings().weight.dtype == plan.stored_dtype and not job_devices.offloaded(model):
        return model
    job_devices.release_cached_memory(job_devices.model_device(model))
    copy = load_model(plan.resolved, sources).eval()  # CPU, dtype "auto": the checkpoint's own
    apply_rows(copy, rows, base_vocab_size=base_vocab_size, pad_to_multiple_of=plan.spec.pad_to_multiple_of, at_ids=at_ids)
    return copy


def embedding_module_name(model) -> str:
    embedding = model.get_input_embeddings()
    for name, module in model.named_modules():
        if module is embedding:
            return name.rsplit(".", 1)[-1]
    return "embed_tokens"


def reserved_summary(reserved: list[dict], shown: int = 8) -> str:
    """The reserved tokens a job took, for a line: '<unused0> (6) -> "▁term", ...'."""
    parts = [f"{entry['reserved']} ({entry['id']}) -> {entry['token']!r}" for entry in reserved[:shown]]
    more = f", and {len(reserved) - shown} more (tide_extension.json lists them)" if len(reserved) > shown else ""
    return ", ".join(parts) + more
