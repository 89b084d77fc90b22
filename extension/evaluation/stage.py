"""The evaluate stage of a job: the base model, then the published rows, on the same held-out text.

Before/after on the test split (which no decision saw) and on general English, with the chosen
rows applied in between (the padding rows placed and measured); a terms-only job adds its held-out
contexts, already scored by selection. What comes out is the job's metrics.json.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..plan import corpus as corpus_io
from ..plan import devices as job_devices
from ..plan.spec import Callbacks
from ..rows.init import apply_rows, reserved_ids
from .general_text import load_general_text
from .metrics import compare, evaluate_model
from .score_cache import ScoreCache


def evaluate_job(plan, model, chosen, trained, callbacks: Callbacks, *, scores_dir: Path, scores_max_bytes: int,
                 stages_run: list[str]) -> tuple[dict, dict]:
    """(metrics, the applied rows' layout: vocab sizes, tied, padding ids). `chosen` is
    selection.stage.Chosen, `trained` training.stage.Trained; `stages_run` names the stages so far."""
    spec, extended = plan.spec, chosen.extended
    job_devices.release_cached_memory(job_devices.model_device(model))
    general = load_general_text()
    held_out = _test_documents(plan)
    # The base model's scores of this text are kept across jobs (score_cache.py).
    score_cache = ScoreCache.for_model(scores_dir, model, scores_max_bytes)
    common = dict(max_bytes=spec.eval_max_bytes, batch_tokens=plan.eval_batch_tokens)
    # Two passes over the same chunks (before, then after): one progress bar across both.
    before = evaluate_model(model, plan.tokenizer, held_out, general, score_cache=score_cache, **common,
                            on_progress=lambda done, total: callbacks.on_progress(done, 2 * total, {"unit": "chunks"}))
    layout = apply_rows(model, chosen.rows, base_vocab_size=extended.base_vocab_size,
                        pad_to_multiple_of=spec.pad_to_multiple_of, calibration_ids=_calibration_ids(plan.tokenizer, general),
                        at_ids=reserved_ids(extended))
    if layout.get("padding_probability_ok") is False:
        callbacks.on_warning(
            f"padding rows take up to {layout['padding_probability_max']:.2e} of the probability "
            "on general text (limit 1e-4); generation_config.suppress_tokens lists them"
        )
    after = evaluate_model(model, extended.tokenizer, held_out, general, new_token_ids=[t.id for t in extended.new_tokens],
                           **common, on_progress=lambda done, total: callbacks.on_progress(total + done, 2 * total, {"unit": "chunks"}))
    contexts = _held_out_contexts(chosen.report)
    if contexts is not None:  # a terms-only job: compared with the base model on its held-out contexts too
        before["held_out_contexts"], after["held_out_contexts"] = contexts
    on_model = job_devices.describe(model)
    result = trained.result
    metrics = {
        "before": before,
        "after": after,
        "comparison": compare(before, after),
        "padding": {k: v for k, v in layout.items() if k not in ("padding_ids", "reserved_ids")},
        **({"reserved_tokens": extended.reserved} if extended.reserved is not None else {}),
        # steps taken, steps planned and why it stopped (training.loop.STOP_REASONS), then the loss history
        "training": {**(result.report() if result else {"steps": 0}), "history": result.history if result else []},
        "selection": {k: v for k, v in chosen.report.items() if k != "effects"},
        "devices": {"load": on_model, **_stage_devices(stages_run, on_model, trained=result is not None),
                    "evaluate": dict(on_model), "padding_calibration": dict(on_model)},
        "memory_plan": plan.memory.to_json(),
        "evaluation_cache": {"before": score_cache.report()},
    }
    callbacks.on_event("metrics", {"comparison": metrics["comparison"]})
    return metrics, layout


def _held_out_contexts(selection: dict) -> tuple[dict, dict] | None:
    """(before, after) on a terms-only job's judging held-out contexts (those no decision saw: the
    best step was chosen on the other part): the base model reading the base tokenizer's ids and
    the published rows reading the extended tokenizer's, on the same text, in bits per byte (never
    per token: the two tokenizers cut it differently). Both were scored by selection already (the
    judging set and measure_terms): no text is scored twice. None for corpus jobs (their test split
    is the domain text) and jobs without validation."""
    judged = selection.get("judging") or {}
    if not judged or "bits_per_byte" not in selection:
        return None
    size = {"bytes": judged["bytes"], "chunks": judged["chunks"]}
    return ({"bits_per_byte": judged["base_bits_per_byte"], "tokens_per_byte": judged.get("base_tokens_per_byte"), **size},
            {"bits_per_byte": selection["bits_per_byte"], "tokens_per_byte": selection.get("tokens_per_byte"), **size})


def _stage_devices(stages_run: list[str], on_model: dict, *, trained: bool) -> dict:
    """Where each stage before evaluation did its work: the tokenizer stages on the CPU, the
    model stages on the model's device."""
    placed = {name: {"device": "cpu", "dtype": None, "work": "tokenizer"} for name in ("mine", "extend") if name in stages_run}
    placed.update({name: dict(on_model) for name in ("init", "generate", "train", "select") if name in stages_run})
    if trained:
        placed["train"]["rows_dtype"] = "float32"
    return placed


def _test_documents(plan) -> list[str]:
    """The test split: what the job reports on, which no decision saw."""
    spec = plan.spec
    if spec.corpus_path is None:
        return []
    return list(corpus_io.split_documents(spec.corpus_path, "test", text_field=spec.corpus_text_field, label=plan.corpus_label()))


def _calibration_ids(tokenizer, general) -> torch.Tensor | None:
    text = "\n\n".join(general.documents)[:4000] if general else ""
    if not text:
        return None
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[:, :512]
