"""Every model family of tests/model_families.py through `tide extend`: real tokenizers of
Llama 3, Qwen 2, Llama 2 / Mistral, Phi-3, DeepSeek, Falcon, GPT-2, GPT-NeoX and the built-ins,
tiny random models of their architectures, tied and untied, fp32 and bf16, one file and sharded,
padded embeddings, and the embedding layouts of issue 40 (BLOOM's embedding LayerNorm, OPT's
projection, scaled logits, Mamba, Gemma 3n's per-layer table, Gemma 3 / Qwen2-VL / LLaVA
multimodal), and new terms on reserved ids (Gemma 3 and Llama 3 tokenizers). Each published folder
must pass every check of `check_published`."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.model_families import CASES, TERMS, base_checkpoint, check_published, corpus_text, extend_args, work_folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("family-inputs")
    (folder / "terms.txt").write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    (folder / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    return folder / "terms.txt", folder / "corpus.txt"


@pytest.fixture(scope="module")
def published(inputs, cli_env, model_sources, tmp_path_factory):
    """`published(case)`: the case's base and its folder from `tide extend`, made once per module
    (two tests read the Gemma 3n case's folder; each extension is most of a test's time)."""
    folders: dict[str, tuple] = {}

    def extend(case):
        if case.id not in folders:
            terms_file, corpus_file = inputs
            base = base_checkpoint(case, model_sources)
            out = tmp_path_factory.mktemp("family") / "out"
            # shorter held-out contexts than the benchmark's: writing them is most of an untrained
            # case's time, and no check depends on their length
            assert main([*extend_args(case, base, out, terms_file, corpus_file), "--term-context-tokens", "16"]) == 0
            folders[case.id] = base, out
        return folders[case.id]

    return extend


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_family_is_extended_without_moving_an_old_id(case, published):
    base, out = published(case)
    checks = check_published(case, base, out, work_folder(out))
    failed = {check: why for check, why in checks.items() if why not in ("", "n/a")}
    assert not failed, failed
    assert (checks["trained_rows"] == "") == case.train
    # a processor to check wherever one can be built here (Qwen2-VL's needs torchvision)
    assert (checks["processor"] == "") == (case.architecture in ("LlavaForConditionalGeneration",
                                                                 "Gemma3ForConditionalGeneration"))
    extension = json.loads((out / "tide_extension.json").read_text())
    assert {term["term"] for term in extension["terms"]} | {s["term"] for s in extension["skipped"]} == set(TERMS)


def test_a_tokenizer_the_model_cannot_hold_is_refused_before_its_weights_are_read(inputs, cli_env, model_sources,
                                                                                  tmp_path, monkeypatch, capsys):
    """A tokenizer with ids past the model's embedding rows: exit 2, the problem named, nothing
    written, and no weights read. The weights stay in the folder (without them another error
    would come first, and the test would pass with the check gone); loading any is recorded."""
    import shutil

    import transformers

    from extension.errors import UnsupportedTokenizerError
    from extension.plan.job import plan_inputs, plan_model
    from extension.plan.spec import ExtendSpec

    terms_file, _ = inputs
    case = next(case for case in CASES if case.family == "smollm2")
    base = tmp_path / "base"
    shutil.copytree(base_checkpoint(case, model_sources), base)
    assert list(base.glob("*.safetensors"))
    config = json.loads((base / "config.json").read_text())
    config["vocab_size"] = 49_000
    (base / "config.json").write_text(json.dumps(config))
    loads: list[str] = []

    def no_weights(*args, **kwargs):
        loads.append(str(args[:1]))
        raise AssertionError("weights were read")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(base), "--terms", str(terms_file), "--steps", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tide: error (base_model): the tokenizer " in err, err
    assert "uses id 49151" in err and "but the model has only 49000 embedding rows" in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["base"] and loads == []

    spec = ExtendSpec(base_model=str(base), out_dir=out, terms=["hypertext"], steps=0, allow_local_paths=True)
    with pytest.raises(UnsupportedTokenizerError) as refused:
        plan_model(plan_inputs(spec), model_sources)
    assert refused.value.code == "unsupported_tokenizer" and refused.value.param == "base_model"
    assert "resize the model's embeddings to cover every token id" in refused.value.message and loads == []


def test_the_checks_read_gemma3n_per_layer_table(published, tmp_path):
    """The Gemma 3n case's checks cover its per-layer table, which has fewer rows than the input
    table (262,144 of 262,400) and so is not found by the input's row count: an old per-layer row
    changed in the published files fails old_rows, and new per-layer rows put back where training
    started fail trained_rows. Checks that missed the table would pass both folders."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from extension.training.input_distillation import DISTILLED_NAME

    case = next(case for case in CASES if case.architecture == "Gemma3nForCausalLM")
    base, out = published(case)
    new_ids = [token["id"] for token in json.loads((out / "tide_extension.json").read_text())["new_tokens"]]
    suffix = "embed_tokens_per_layer.weight"
    shard = next(path.name for path in out.glob("*.safetensors") if any(n.endswith(suffix) for n in load_file(path)))

    def published_with(name, change):
        folder = tmp_path / name
        shutil.copytree(out, folder)
        tensors = load_file(folder / shard)
        change(next(tensor for key, tensor in tensors.items() if key.endswith(suffix)))
        save_file(tensors, folder / shard, metadata={"format": "pt"})
        return check_published(case, base, folder, work_folder(out))

    assert 100 not in new_ids
    changed = published_with("old-row-changed", lambda table: table[100].add_(1.0))
    assert suffix in changed["old_rows"], changed["old_rows"]
    start = torch.load(work_folder(out) / DISTILLED_NAME, map_location="cpu", weights_only=False)["per_layer"]

    def back_to_start(table):
        table[new_ids] = start.to(table.dtype)

    untrained = published_with("per-layer-untrained", back_to_start)
    assert "no per_layer row moved" in untrained["trained_rows"], untrained["trained_rows"]
    assert untrained["old_rows"] == ""  # new rows may move; only old ones must not


def test_the_fused_loss_check_fails_where_training_would_miss_the_models_logit_scale(published, monkeypatch):
    """Granite divides its logits by `logits_scaling`: the published folder passes fused_loss, and
    the same folder fails it once training's head transform is made neutral (as it was before
    issue 40), so the check reads the transform training uses and is not met by any loss."""
    import extension.rows.adapter
    from extension.rows.logits import LogitTransform

    case = next(case for case in CASES if case.architecture == "GraniteForCausalLM")
    base, out = published(case)
    assert check_published(case, base, out, work_folder(out))["fused_loss"] == ""
    monkeypatch.setattr(extension.rows.adapter, "check_head", lambda model, base_vocab_size: LogitTransform())
    missed = check_published(case, base, out, work_folder(out))["fused_loss"]
    assert missed.startswith("the fused training loss "), missed
