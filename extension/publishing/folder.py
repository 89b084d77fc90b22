"""Write the extended checkpoint, atomically.

Everything is written into a hidden staging folder beside the target and renamed into place at
the end, so a reader (a download, a user's script) never sees a half-written model. The folder:

    model.safetensors, config.json, generation_config.json   the merged model (base dtype)
    tokenizer.json, tokenizer_config.json, chat_template...   the extended tokenizer
    adapter/                                                   PEFT Trainable Tokens adapter
    tide_extension.json                                        what was added and how
    metrics.json, README.md, loss_curve.png                    the evidence
    manifest.json                                              size + sha256 of every file
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..errors import OutputExistsError
from ..rows.per_layer import per_layer_table

MANIFEST = "manifest.json"


def check_output_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse an existing target before any work is done (the CLI's --force overrides)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise OutputExistsError(
            f"output folder {str(out_dir)!r} already exists; choose another --out or pass --force "
            "to replace it",
            param="out",
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputExistsError(f"--out {str(out_dir)!r} is a file, not a folder", param="out")


INDEX = "model.safetensors.index.json"


def shard_limit(model_path: str | Path | None, *, hub_id: str | None = None, token: str | None = None) -> int | None:
    """The largest safetensors shard of a sharded base checkpoint, in bytes (its shard size
    limit was at least that), so the published weights are sharded alike: a local folder's, or
    (`hub_id`) a hub model's, its index read from the hub (or its cache) and each shard's size
    from the cache or the hub's file listing. None for a base in one file, or one whose shard
    sizes cannot be known: publish then uses transformers' default shard size."""
    if hub_id is not None:
        return _hub_shard_limit(hub_id, token)
    if model_path is None or not (Path(model_path) / INDEX).exists():
        return None
    return max(path.stat().st_size for path in Path(model_path).glob("*.safetensors"))


def _hub_shard_limit(repo_id: str, token: str | None) -> int | None:
    import huggingface_hub

    try:
        index = json.loads(Path(huggingface_hub.hf_hub_download(repo_id, INDEX, token=token)).read_text())
    except Exception:  # noqa: BLE001 - no index (one file), or the hub unreachable: the default
        return None
    files = sorted(set(index.get("weight_map", {}).values()))
    sizes = {}
    for name in files:
        cached = huggingface_hub.try_to_load_from_cache(repo_id, name)
        if isinstance(cached, str):
            sizes[name] = os.path.getsize(cached)
    missing = [name for name in files if name not in sizes]
    if missing:
        try:
            for info in huggingface_hub.HfApi(token=token).get_paths_info(repo_id, missing):
                if getattr(info, "size", None):
                    sizes[info.path] = info.size
        except Exception:  # noqa: BLE001 - offline with the shards not yet cached: the default
            return None
    return max(sizes.values()) if files and len(sizes) == len(files) else None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(folder: Path) -> list[dict[str, Any]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    return [
        {"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in files
    ]


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def adapter_targets(model, input_module: str) -> list[str]:
    """The modules the adapter must carry new rows for: the input embedding, for an untied model
    the output embedding too (its new rows are its own; an input-only adapter leaves the base's
    resized head rows in place and predicts differently from the merged folder), and Gemma 3n's
    per-layer table (its new ids' rows likewise)."""
    head = model.get_output_embeddings()
    # Gemma 3n: the new ids' per-layer rows (rows/per_layer.py) are part of what the merged folder reads
    per_layer = [name.rsplit(".", 1)[-1] for name, module in model.named_modules() if module is per_layer_table(model)]
    if head is None or head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr():
        return [input_module, *per_layer]
    names = [name for name, module in model.named_modules() if module is head]
    return [input_module, names[0].rsplit(".", 1)[-1] if names else "lm_head", *per_layer]


def save_adapter(model, folder: Path, token_ids: list[int], target_module: str) -> None:
    """A PEFT Trainable Tokens adapter holding every row past the base vocab (new + padding).

    Written with PEFT itself so it loads with `PeftModel.from_pretrained` on the base model
    resized to the new vocab size. `target_module` is the input embedding's name; an untied
    model's head is targeted too (adapter_targets), a tied one's shares the embedding's rows.
    PEFT warns that it cannot tie the adapters on any tied model (a generic check in
    tuners_utils); Trainable Tokens then ties the head's layer to the embedding's itself
    (TrainableTokensModel.inject_adapter), which is checked here before the warning is dropped.
    PEFT's warnings (that one, its use of transformers' deprecated `is_gradient_checkpointing`)
    go to the log, never to a user's console.
    """
    import logging
    import warnings

    from peft import TrainableTokensConfig, get_peft_model
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

    targets = adapter_targets(model, target_module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = get_peft_model(model, TrainableTokensConfig(token_indices=token_ids, target_modules=targets))
    try:
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
        if len(targets) == 1 and head is not None and not (
                isinstance(head, TrainableTokensLayer) and head.tied_adapter is embedding):
            raise RuntimeError("PEFT did not tie the adapter's head to its embedding on a tied model; "
                               "the adapter would predict differently from the merged checkpoint")
        # PEFT would add the whole resized embedding matrix by default; the adapter is the rows only.
        with warnings.catch_warnings(record=True) as saving:
            warnings.simplefilter("always")
            peft_model.save_pretrained(folder, save_embedding_layers=False)
    finally:
        peft_model.unload()
    log = logging.getLogger(__name__)
    for warning in [*caught, *saving]:
        log.debug("PEFT while writing the adapter: %s: %s", warning.category.__name__, warning.message)


def plot_loss_curve(history: list[dict], path: Path) -> bool:
    if not history:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    ax.plot(steps, [h["loss"] for h in history], label="train loss")
    evals = [h for h in history if "eval_loss" in h]
    if evals:
        ax.plot([h["step"] for h in evals], [h["eval_loss"] for h in evals], "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title("Training the new rows")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def publish(
    out_dir: Path,
    *,
    model,
    tokenizer,
    extension: dict,
    metrics: dict,
    model_card: str,
    history: list[dict] | None = None,
    adapter_token_ids: list[int] | None = None,
    adapter_target_module: str = "embed_tokens",
    write_extra: Callable[[Path], None] | None = None,
    force: bool = False,
    max_shard_bytes: int | None = None,
    base_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Write everything into a staging folder, then rename it to `out_dir`. Returns the manifest.
    `write_extra(staging)` writes further files (a carried-over optimizer state) before the manifest.
    `max_shard_bytes`: shard the weights like a sharded base (see shard_limit); None: transformers'
    default shard size (a base in one file under it stays in one file)."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        # like a sharded base (shard_limit), else transformers' default shard size
        model.save_pretrained(staging, **({"max_shard_size": max_shard_bytes} if max_shard_bytes else {}))
        tokenizer.save_pretrained(staging)
        carry_processor_files(base_dir if base_dir is not None else getattr(model, "name_or_path", None), staging)
        write_json(staging / "tide_extension.json", extension)
        write_json(staging / "metrics.json", metrics)
        if plot_loss_curve(history or [], staging / "loss_curve.png"):
            model_card += "\n## Loss curve\n\n![loss curve](loss_curve.png)\n"
        (staging / "README.md").write_text(model_card, encoding="utf-8")
        if adapter_token_ids:
            save_adapter(model, staging / "adapter", adapter_token_ids, adapter_target_module)
        if write_extra is not None:
            write_extra(staging)
        manifest = build_manifest(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the API may serve it as another user
        write_json(staging / MANIFEST, {"files": manifest})
        _replace_dir(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


# What a multimodal base's folder holds for AutoProcessor beside the tokenizer (Gemma 3 4B+,
# Qwen2-VL, LLaVA): the processor's and the image/video/audio preprocessors' configs and chat
# templates. None of them holds a token id the extension changes; the tokenizer is the extended one.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                   "feature_extractor_config.json", "chat_template.json", "chat_template.jinja")
PROCESSOR_FOLDERS = ("additional_chat_templates",)


def carry_processor_files(base_dir: str | Path | None, staging: Path) -> list[str]:
    """Copy the base folder's processor files (PROCESSOR_FILES) that the published folder lacks,
    so AutoProcessor loads it as it loads the base. Returns the names copied."""
    if base_dir is None or not Path(base_dir).is_dir():
        return []
    base_dir, copied = Path(base_dir), []
    for name in PROCESSOR_FILES + PROCESSOR_FOLDERS:
        source, target = base_dir / name, staging / name
        if target.exists() or not source.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
        copied.append(name)
    return copied


def _replace_dir(staging: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    # --force: move the old folder aside first; a rename is the only step a reader can observe.
    trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.replace(out_dir, trash / "old")
    try:
        os.replace(staging, out_dir)
    except OSError:
        os.replace(trash / "old", out_dir)
        raise
    finally:
        shutil.rmtree(trash, ignore_errors=True)
