"""The base model's evaluation scores are kept on disk (extension/evaluation/score_cache.py): the same model
on the same text is not scored again and gives the very same numbers; another text, another
model, another dtype or the extended model (new ids) are scored."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from extension.evaluation import GeneralText, evaluate_model
from extension.evaluation.score_cache import ScoreCache, model_fingerprint
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


def _entries(folder) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in folder.glob("*/*.json")}


def test_the_cache_stays_under_its_limit_and_evicts_the_least_recently_used(tiny, tmp_path):
    """Issue 25 item 9: TIDE_CACHE_DIR/scores had no size limit. Past its limit the entry used
    longest ago goes, where a read counts as a use: an entry written first but read since stays."""
    import time

    model, tokenizer = tiny
    third = foldoc_documents(12, skip=1700)
    # Entry names depend on the model and the text only: learn each text's entry in a folder of its own.
    names = {}
    measure = tmp_path / "measure"
    for label, domain in (("general", None), ("domain", DOMAIN), ("other", OTHER)):
        before = set(_entries(measure)) if measure.exists() else set()
        _evaluate(model, tokenizer, ScoreCache.for_model(measure, model), domain=domain)
        (names[label],) = set(_entries(measure)) - before
    sizes = sorted(_entries(measure).values())
    limit = sum(sizes) + sizes[0] // 2  # three entries fit, a fourth does not

    folder = tmp_path / "scores"

    def evaluate(domain) -> tuple[dict, set[str]]:
        time.sleep(0.05)  # file times step by a clock tick at least: each use is later than the last
        cache = ScoreCache.for_model(folder, model, max_bytes=limit)
        _evaluate(model, tokenizer, cache, domain=domain)
        entries = _entries(folder)
        assert sum(entries.values()) <= limit, (entries, limit)
        return cache.report(), set(entries)

    evaluate(DOMAIN)  # writes the domain entry, then the general one
    evaluate(OTHER)  # writes the other domain entry, reads the general one
    report, kept = evaluate(DOMAIN)  # reads the domain entry: OTHER's is now the one used longest ago
    assert report == {"hits": 2, "misses": 0} and kept == {names["domain"], names["general"], names["other"]}

    report, kept = evaluate(third)  # a fourth entry does not fit: one goes
    assert report == {"hits": 1, "misses": 1}
    assert len(kept) == 3 and names["other"] not in kept
    assert names["domain"] in kept  # written before OTHER's entry, but read since
    report, _kept = evaluate(OTHER)
    assert report == {"hits": 1, "misses": 1}  # the evicted text is scored again


def test_the_limit_setting_reaches_the_jobs_cache(tmp_path, tiny_model_dir, monkeypatch):
    """TIDE_SCORE_CACHE_MAX_BYTES, through the settings, bounds what a real job (the CLI's) keeps:
    at 0 the job still scores its base model but leaves no entry behind."""
    from app.cli import main
    from app.settings import get_settings

    monkeypatch.setenv("TIDE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIDE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TIDE_SCORE_CACHE_MAX_BYTES", "0")
    get_settings.cache_clear()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(400, skip=50)))
    (tmp_path / "terms.txt").write_text("compiler\ninterrupt\n")
    try:
        assert main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(tmp_path / "terms.txt"),
                     "--corpus", str(corpus), "--out", str(tmp_path / "out"), "--steps", "1", "--batch-size", "2",
                     "--seq-len", "32", "--eval-bytes", "2000", "--device", "cpu", "--keep-all-terms"]) == 0
    finally:
        get_settings.cache_clear()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["evaluation_cache"] == {"before": {"hits": 0, "misses": 2}}
    assert (tmp_path / "cache" / "scores").is_dir() and not any((tmp_path / "cache" / "scores").rglob("*.json"))
