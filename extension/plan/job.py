"""A job's decisions, made once, before any weights are read.

`plan_inputs` checks what needs no model (the options, the output folder, the corpus) and decides
where the job runs, filling in the options its device decides (`steps`). `plan_model` then
resolves the base model and reads its tokenizer and config: the dtypes, whether the tokenizer
can be extended, the context limit, whether the job fits its device (the memory plan), the
evaluation batch and the published shard size. `pipeline.run` carries the plan out and decides
nothing of this again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from . import corpus as corpus_io
from .spec import mines_corpus
from .devices import Placement, check_device_map, checkpoint_dtype, eval_batch_tokens_for, resolve_placement
from ..errors import InvalidOptionError
from .memory import MemoryPlan, check_plan, plan_for_spec
from .models import ModelSources, ResolvedModel, load_config, load_tokenizer, resolve_model
from .options import check_options, device_decisions
from ..publishing.folder import check_output_dir, shard_limit


@dataclass(frozen=True)
class JobPlan:
    spec: Any  # the ExtendSpec, with the options its device decides filled in
    placement: Placement
    device_defaults: dict  # the options the job left to its device, as that device set them
    corpus_documents: int
    resolved: ResolvedModel | None = None
    tokenizer: Any = None
    config: Any = None
    stored_dtype: torch.dtype | None = None  # the checkpoint's own: what is published
    compute_dtype: torch.dtype | None = None  # what the job computes in (bf16 on a GPU)
    memory: MemoryPlan | None = None
    eval_batch_tokens: int | None = None
    max_shard_bytes: int | None = None  # shard the published weights like the base (None: transformers' default)
    # new_ids 'reserved': the free reserved tokens (tokenizer.reserved), enough for the job; None: 'append'
    reserved: list | None = None
    # new_ids 'auto' that chose 'reserved' (plan.new_ids): why, for the job's report; None otherwise
    new_ids_reason: str | None = None

    @property
    def model_path(self) -> str | None:
        """The base model's local folder (None for a hub model, which lives in the hub's cache)."""
        return self.resolved.path if self.resolved.kind != "hub" else None

    def corpus_label(self) -> str:
        return corpus_io.corpus_label(self.spec)

    @property
    def mines_corpus(self) -> bool:
        """A corpus and no terms: the job mines its terms (stage "mine" instead of "extend")."""
        return mines_corpus(self.spec)


def validate_spec(spec) -> None:
    """Cheap checks that need no model; the context-length limit is checked in plan_model."""
    if not spec.terms and spec.corpus_path is None:
        raise InvalidOptionError("give terms, a corpus, or both", param="terms")
    corpus_io.check_examples(spec.examples, has_corpus=spec.corpus_path is not None)
    check_options(spec)


def plan_inputs(spec) -> JobPlan:
    """The options, the output folder and the corpus checked, and the one device decision."""
    validate_spec(spec)
    placement = resolve_placement(spec.device, spec.device_map, spec.precision)
    device_defaults = device_decisions(spec, placement.defaults_kind)
    spec = replace(spec, **device_defaults)
    check_output_dir(spec.out_dir, force=spec.force)
    documents = 0
    if spec.corpus_path is not None:
        documents, _ = corpus_io.check_corpus(spec.corpus_path, text_field=spec.corpus_text_field, label=corpus_io.corpus_label(spec))
    return JobPlan(spec=spec, placement=placement, device_defaults=device_defaults, corpus_documents=documents)


def plan_model(plan: JobPlan, sources: ModelSources) -> JobPlan:
    """The decisions that need the model's tokenizer and config (never its weights). Raises the
    error of a tokenizer TIDE cannot extend, a seq_len past the model's context, a device map
    that offloads the embedding, and a job that cannot fit its device."""
    from ..tokenizer import check_extendable
    from ..tokenizer.reserved import check_reserved_job
    from .new_ids import resolve_new_ids
    from ..training.loop import TrainConfig, max_positions

    spec = plan.spec
    resolved = resolve_model(spec.base_model, sources, allow_local_paths=spec.allow_local_paths)
    tokenizer = load_tokenizer(resolved, sources)
    config = load_config(resolved, sources)
    check_extendable(tokenizer, embedding_rows=(config.get_text_config() or config).vocab_size)
    TrainConfig.from_spec(spec).validate(max_positions=max_positions(SimpleNamespace(config=config)))
    check_device_map(config, plan.placement.device_map)
    model_path = resolved.path if resolved.kind != "hub" else None
    # 'auto' becomes 'append' or 'reserved' here, from the config: the rest of the job (and its
    # record) sees only what it runs with
    new_ids, new_ids_reason = resolve_new_ids(spec.new_ids, config, base_model=spec.base_model)
    spec = replace(spec, new_ids=new_ids)
    reserved = check_reserved_job(spec, tokenizer, config, model_folder=model_path)
    stored = checkpoint_dtype(config, model_path)
    dtype = plan.placement.compute_dtype(stored)
    eval_tokens = eval_batch_tokens_for(plan.placement.device, config, dtype)
    memory = plan_for_spec(spec, config, placement=plan.placement, dtype=dtype, eval_batch_tokens=eval_tokens,
                           model_path=model_path, stored_dtype=stored)
    check_plan(memory, base_model=spec.base_model, batch_size=spec.batch_size, seq_len=spec.seq_len)
    # the published shard size: the base's, local or hub (None: transformers' default)
    shards = shard_limit(model_path, hub_id=resolved.path if resolved.kind == "hub" else None, token=sources.hub_token)
    return replace(plan, spec=spec, resolved=resolved, tokenizer=tokenizer, config=config, stored_dtype=stored,
                   compute_dtype=dtype, memory=memory, eval_batch_tokens=eval_tokens, max_shard_bytes=shards,
                   reserved=reserved, new_ids_reason=new_ids_reason)


def offload_folder(plan: JobPlan, work_dir: Path | None) -> Path | None:
    """Where accelerate may put weights it offloads to disk: in the job's work folder when it has
    one (the service removes it with the job), else a temporary folder; either is removed when the
    process exits (the offloaded copy can be as big as the model)."""
    if plan.placement.device_map is None:
        return None
    import atexit
    import shutil
    import tempfile

    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="offload-" if work_dir else "tide-offload-", dir=work_dir))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
