"""The base model's evaluation scores are kept on disk (extension/score_cache.py): the same model
on the same text is not scored again and gives the very same numbers; another text, another
model, another dtype or the extended model (new ids) are scored."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from extension.evaluate import GeneralText, evaluate_model
from extension.score_cache import ScoreCache, model_fingerprint
from tests.service.conftest import foldoc_documents

DOMAIN = foldoc_documents(12, skip=400)
GENERAL = GeneralText(foldoc_documents(12, skip=900), "foldoc-sample")
OTHER = foldoc_documents(12, skip=1300)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture()
def forwards(tiny):
    """How many batches run through the model: every forward reads its input embedding."""
    calls = []
    model, _ = tiny
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, output: calls.append(args[0].shape))
    yield calls
    hook.remove()


def _evaluate(model, tokenizer, cache, domain=DOMAIN, **kwargs):
    result = evaluate_model(model, tokenizer, domain, GENERAL, max_bytes=3000, score_cache=cache, **kwargs)
    result.pop("seconds")
    return result


def test_a_second_evaluation_of_the_same_model_and_text_reads_the_cache(tiny, tmp_path, forwards):
    model, tokenizer = tiny
    first = _evaluate(model, tokenizer, ScoreCache.for_model(tmp_path, model))
    assert len(forwards) > 0
    scored = len(forwards)
    cache = ScoreCache.for_model(tmp_path, model)  # a new job: a new cache object on the same folder
    progress = []
    second = _evaluate(model, tokenizer, cache, on_progress=lambda done, total: progress.append((done, total)))
    assert len(forwards) == scored, "the base model must not run again"
    assert second == first  # the very same numbers, domain and general
    assert cache.report() == {"hits": 2, "misses": 0}
    assert progress[-1][0] == progress[-1][1] > 0  # progress still reaches its total
    uncached = _evaluate(model, tokenizer, None)
    assert uncached == first  # and they are what scoring gives


def test_another_text_model_dtype_or_new_ids_miss(tiny, tmp_path, forwards):
    model, tokenizer = tiny
    _evaluate(model, tokenizer, ScoreCache.for_model(tmp_path, model))

    cache = ScoreCache.for_model(tmp_path, model)
    _evaluate(model, tokenizer, cache, domain=OTHER)
    assert cache.report() == {"hits": 1, "misses": 1}  # the general text hit, the other domain text did not

    other = copy.deepcopy(model)
    with torch.no_grad():  # one weight of one layer changed: a fine-tune that left the embedding alone
        other.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5
    assert model_fingerprint(other) != model_fingerprint(model)
    cache = ScoreCache.for_model(tmp_path, other)
    _evaluate(other, tokenizer, cache)
    assert cache.report() == {"hits": 0, "misses": 2}

    low = copy.deepcopy(model).to(torch.bfloat16)
    cache = ScoreCache.for_model(tmp_path, low)
    _evaluate(low, tokenizer, cache)
    assert cache.report() == {"hits": 0, "misses": 2}

    before = len(forwards)
    cache = ScoreCache.for_model(tmp_path, model)
    with_ids = _evaluate(model, tokenizer, cache, new_token_ids=[5])  # an extended model's evaluation: never cached
    assert len(forwards) > before and cache.report() == {"hits": 0, "misses": 0}
    assert with_ids["domain"]["new_tokens"] is not None


def test_a_second_job_on_the_same_base_and_corpus_skips_the_base_scoring(tmp_path, tiny_model_dir, monkeypatch):
    """Two CLI jobs with different terms on the same corpus and base model: the second reads the
    base model's domain and general scores from the cache folder, with identical numbers."""
    from app.cli import main
    from app.settings import get_settings

    monkeypatch.setenv("TIDE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIDE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(400, skip=50)))
    metrics = {}
    for name, terms in (("first", ["compiler", "interrupt"]), ("second", ["semaphore", "bytecode"])):
        (tmp_path / f"{name}.txt").write_text("\n".join(terms) + "\n")
        assert main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(tmp_path / f"{name}.txt"),
                     "--corpus", str(corpus), "--out", str(tmp_path / name), "--steps", "1", "--batch-size", "2",
                     "--seq-len", "32", "--eval-bytes", "2000", "--device", "cpu",
                         "--keep-all-terms"]) == 0  # a random tiny model's terms never pay: not what this tests
        metrics[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    get_settings.cache_clear()
    assert metrics["first"]["evaluation_cache"] == {"before": {"hits": 0, "misses": 2}}
    assert metrics["second"]["evaluation_cache"] == {"before": {"hits": 2, "misses": 0}}
    assert metrics["second"]["before"]["domain"] == metrics["first"]["before"]["domain"]
    assert metrics["second"]["before"]["general"] == metrics["first"]["before"]["general"]
    assert any((tmp_path / "cache" / "scores").rglob("*.json"))
