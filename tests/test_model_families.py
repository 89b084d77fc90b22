"""Every model family of tests/model_families.py through `tide extend`: real tokenizers of
Llama 3, Qwen 2, Llama 2 / Mistral, Phi-3, DeepSeek, Falcon, GPT-2, GPT-NeoX and the built-ins,
tiny random models of their architectures, tied and untied, fp32 and bf16, one file and sharded,
padded embeddings, and the embedding layouts of issue 40 (BLOOM's embedding LayerNorm, OPT's
projection, scaled logits, Mamba, Gemma 3n's per-layer table, Gemma 3 / Qwen2-VL / LLaVA
multimodal), and new terms on reserved ids (Llama 3's tokenizer). Each published folder must pass
every check of `check_published`. Gemma 3n's case and Gemma 3's on reserved ids run the same job
and checks in their own files (tests/test_gemma3n.py, tests/test_new_ids_reserved.py)."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.model_families import (
    CASES, MATRIX_CASES, TERMS, assert_every_check_passes, base_checkpoint, check_published, extend_case, work_folder,
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("family-inputs")
    (folder / "terms.txt").write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    return folder / "terms.txt"


@pytest.fixture(scope="module")
def published(cli_env, model_sources, tmp_path_factory):
    """`published(case)`: the case's base and its folder from `tide extend`, made once per module
    (a test below reads the Granite case's folder again; each extension is most of a test's time)."""
    folders: dict[str, tuple] = {}

    def extend(case):
        if case.id not in folders:
            base = base_checkpoint(case, model_sources)
            out = tmp_path_factory.mktemp("family") / "out"
            extend_case(case, base, out)
            folders[case.id] = base, out
        return folders[case.id]

    return extend


@pytest.mark.parametrize("case", MATRIX_CASES, ids=lambda case: case.id)
def test_a_family_is_extended_without_moving_an_old_id(case, published):
    assert_every_check_passes(case, *published(case))


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

    terms_file = inputs
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
