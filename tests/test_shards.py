"""The published weights are sharded like the base (issue 37, item 2): a sharded hub base's shard
size comes from its index wherever the model came from (here a hub cache, offline), and a base
without one gets transformers' default shard size rather than one file of any size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extension.publishing.folder import publish, shard_limit
from tests.conftest import tiny_llama

REPO_ID = "tide-test/tiny-sharded"


def _hub_cache(cache: Path, tiny_model_dir: Path) -> Path:
    """A hub cache holding REPO_ID: the service tests' tiny Llama saved in 3+ shards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = cache / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / ("0" * 40)
    (snapshot.parent.parent / "refs").mkdir(parents=True)
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(snapshot, max_shard_size="100KB")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(snapshot)
    assert len(list(snapshot.glob("*.safetensors"))) >= 3
    return snapshot


@pytest.fixture()
def offline_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hub"


def test_a_sharded_hub_base_is_published_in_shards_of_its_size(offline_hub, tiny_model_dir, tmp_path):
    from extension.plan.job import plan_inputs, plan_model
    from extension.plan.models import ModelSources
    from extension.plan.spec import ExtendSpec

    snapshot = _hub_cache(offline_hub, tiny_model_dir)
    largest = max(path.stat().st_size for path in snapshot.glob("*.safetensors"))
    assert shard_limit(None, hub_id=REPO_ID) == largest
    sources = ModelSources(cache_dir=tmp_path / "cache", allow_hub=True)
    plan = plan_model(plan_inputs(ExtendSpec(base_model=REPO_ID, out_dir=tmp_path / "out", terms=["hypertext"], steps=0)),
                      sources)
    assert plan.resolved.kind == "hub" and plan.max_shard_bytes == largest
    # not on the hub, or unreachable: the default, never an error
    assert shard_limit(None, hub_id="tide-test/not-there") is None


class _NoTokenizer:
    def save_pretrained(self, folder):
        pass


def test_without_a_shard_size_publish_uses_transformers_default(tmp_path, monkeypatch):
    """A base whose shard size is unknown (one file, or a hub model offline) is published with
    save_pretrained's own default, so a 140 GB model is never one 140 GB file."""
    import inspect

    model = tiny_llama()
    default = inspect.signature(type(model).save_pretrained).parameters["max_shard_size"].default
    seen = []
    original = type(model).save_pretrained

    def recording(self, folder, **kwargs):
        seen.append(kwargs.get("max_shard_size", default))
        return original(self, folder, **kwargs)

    monkeypatch.setattr(type(model), "save_pretrained", recording)
    publish(tmp_path / "one", model=model, tokenizer=_NoTokenizer(), extension={}, metrics={}, model_card="card")
    publish(tmp_path / "sharded", model=model, tokenizer=_NoTokenizer(), extension={}, metrics={}, model_card="card",
            max_shard_bytes=20_000)
    assert seen == [default, 20_000]
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    assert json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
