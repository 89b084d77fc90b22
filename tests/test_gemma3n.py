"""Gemma 3n's per-layer embeddings (issue 40 item 1): a tiny random Gemma3nForCausalLM with the
real Gemma tokenizer through `tide extend`. The per-layer table (`embed_tokens_per_layer`) is
indexed by token id up to `vocab_size_per_layer_input`; ids past it get row 0 in the model's own
forward (and in the multimodal class go to the vision/audio embedders), so new tokens must take
reserved `<unusedN>` ids below it (new_ids 'auto' picks those; 'append' is refused), their
per-layer rows start at their pieces' mean and train with the input rows, and every other row of
every vocab-indexed table stays bit-identical."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main

PER_LAYER_ROWS = 262144  # Gemma 3n's text ids; 262,144..262,399 are its soft (vision/audio) tokens
VOCAB = 262400
PLAIN = "The cat sat on the mat because it was warm there."  # no new term in it


def _extend(folder, base, out, *extra):
    torch.set_num_threads(1)
    # --precision checkpoint: a CPU with bf16 in hardware would otherwise start the rows from the
    # bf16 model's tables, and the rows could not be compared with the fp32 files' means exactly
    # --term-context-tokens 16: writing contexts with a 262,400-id head is most of a job's time on a
    # CPU, and nothing checked here depends on their length
    return main(["extend", "--base-model", str(base), "--terms", str(folder / "terms.txt"), "--eval-bytes", "1000",
                 "--precision", "checkpoint", "--term-context-tokens", "16", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def gemma3n_base(model_sources, tmp_path_factory):
    """The model-family matrix's Gemma 3n text layout (tests/model_families.GEMMA3N; AltUp's
    correct_output_scale set to 1: transformers initialises it to zeros, which would multiply the
    per-layer path by 0), built once per machine, and a folder for this module's jobs."""
    from tests.model_families import GEMMA3N, base_checkpoint

    folder = tmp_path_factory.mktemp("gemma3n")
    (folder / "terms.txt").write_text("ciprofloxacin\nimmunohistochemistry\n")
    return folder, base_checkpoint(GEMMA3N, model_sources)


@pytest.fixture(scope="module")
def extended(gemma3n_base):
    folder, base = gemma3n_base
    # Before the memory plan read a per-layer intermediate_size list, this exited on int(list).
    assert _extend(folder, base, folder / "out", "--steps", "0", "--init", "subword_mean") == 0
    return base, folder / "out"


@pytest.fixture(scope="module")
def trained(gemma3n_base):
    """The matrix's Gemma 3n job: 2 steps on a small corpus, every term kept (the matrix leaves
    this case to this file, see tests/model_families.CHECKED_ELSEWHERE)."""
    from tests.model_families import GEMMA3N, extend_case

    folder, base = gemma3n_base
    torch.set_num_threads(1)
    (folder / "trained").mkdir()
    extend_case(GEMMA3N, base, folder / "trained" / "out")
    return base, folder / "trained" / "out"


def _tensors(folder):
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _new_tokens(out):
    return json.loads((out / "tide_extension.json").read_text())["new_tokens"]


def _per_layer_name(tensors):
    return next(n for n in tensors if n.endswith("embed_tokens_per_layer.weight"))


def _pieces_mean(table, token):
    return table[token["base_ids"]].float().mean(0)


def test_a_gemma3n_job_keeps_every_row_but_the_taken_reserved_ids_of_every_vocab_indexed_table(extended):
    base, out = extended
    old, new = _tensors(base), _tensors(out)
    taken = [token["id"] for token in _new_tokens(out)]
    kept = torch.ones(VOCAB, dtype=torch.bool)
    kept[taken] = False
    assert set(new) == set(old)
    for name, tensor in old.items():
        assert new[name].shape == tensor.shape, name
        if tensor.shape[0] in (VOCAB, PER_LAYER_ROWS) and tensor.dim() == 2:  # input, head, per-layer tables
            assert torch.equal(new[name][kept[: tensor.shape[0]]], tensor[kept[: tensor.shape[0]]]), name
        else:
            assert torch.equal(new[name], tensor), name


def test_the_published_gemma3n_runs_text_with_new_tokens(extended):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out = extended
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("ciprofloxacin and immunohistochemistry", return_tensors="pt").input_ids
    assert set(ids[0].tolist()) & {token["id"] for token in _new_tokens(out)}
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert model(ids).logits.isfinite().all()


def test_new_gemma3n_tokens_are_ids_the_model_routes_as_text_and_old_ids_route_as_before(extended):
    base, out = extended
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size_per_layer_input"] == PER_LAYER_ROWS  # old soft tokens still get row 0
    assert config["vocab_size"] == VOCAB
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(out)(" ciprofloxacin", add_special_tokens=False).input_ids
    assert len(ids) == 1 and ids[0] < PER_LAYER_ROWS


def test_unset_new_ids_takes_reserved_ids_on_gemma3n_and_the_report_says_why(extended):
    _, out = extended
    record = json.loads((out / "tide_extension.json").read_text())
    assert record["vocab"]["new_ids"] == "reserved" and "per-layer" in record["vocab"]["new_ids_reason"]
    assert all(entry["reserved"].startswith("<unused") for entry in record["reserved_tokens"])
    assert "Chosen by the job" in (out / "README.md").read_text()


def test_new_per_layer_rows_start_at_the_mean_of_their_pieces_per_layer_rows(extended):
    base, out = extended
    old, new = _tensors(base), _tensors(out)
    name = _per_layer_name(old)
    for token in _new_tokens(out):
        expected = _pieces_mean(old[name], token).to(new[name].dtype)
        assert torch.allclose(new[name][token["id"]], expected, atol=1e-6), token["token"]
        assert not torch.equal(new[name][token["id"]], old[name][token["id"]])  # the reserved token's row is gone


def test_old_token_logits_on_plain_text_are_the_base_models(extended):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, out = extended
    ids = AutoTokenizer.from_pretrained(out)(PLAIN, return_tensors="pt").input_ids
    assert torch.equal(ids, AutoTokenizer.from_pretrained(base)(PLAIN, return_tensors="pt").input_ids)
    kept = torch.ones(VOCAB, dtype=torch.bool)
    kept[[token["id"] for token in _new_tokens(out)]] = False
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
        after = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    assert after.shape == before.shape
    assert torch.equal(after[..., kept], before[..., kept])


def test_the_trained_gemma3n_job_passes_every_check_of_the_family_matrix(trained):
    from tests.model_families import GEMMA3N, assert_every_check_passes

    assert_every_check_passes(GEMMA3N, *trained)


def test_trained_per_layer_rows_move_from_their_start_and_old_rows_do_not(trained):
    from extension.training.input_distillation import DISTILLED_NAME
    from tests.model_families import work_folder

    base, out = trained
    old, new = _tensors(base), _tensors(out)
    name = _per_layer_name(old)
    record = json.loads((out / "tide_extension.json").read_text())
    assert record["trained_steps"] == 2 and record["init"]["per_layer"] == "subword_mean"
    tokens = _new_tokens(out)
    # where training started them (the init-only job above checks that start: the pieces' mean)
    start = torch.load(work_folder(out) / DISTILLED_NAME, map_location="cpu", weights_only=False)["per_layer"]
    moved = [not torch.allclose(new[name][t["id"]].float(), start[k].float(), atol=1e-6) for k, t in enumerate(tokens)]
    assert any(moved), "no per-layer row of a new token moved in training"
    kept = torch.ones(PER_LAYER_ROWS, dtype=torch.bool)
    kept[[t["id"] for t in tokens]] = False
    assert torch.equal(new[name][kept], old[name][kept])


def test_the_checks_read_gemma3n_per_layer_table(trained, tmp_path):
    """The Gemma 3n case's checks cover its per-layer table, which has fewer rows than the input
    table (262,144 of 262,400) and so is not found by the input's row count: an old per-layer row
    changed in the published files fails old_rows, and new per-layer rows put back where training
    started fail trained_rows. Checks that missed the table would pass both folders."""
    import shutil

    from safetensors.torch import save_file

    from extension.training.input_distillation import DISTILLED_NAME
    from tests.model_families import GEMMA3N as case, check_published, work_folder

    base, out = trained
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


def test_explicit_append_on_gemma3n_is_refused_before_anything_is_written(gemma3n_base, capsys):
    folder, base = gemma3n_base
    out = folder / "appended"
    assert _extend(folder, base, out, "--steps", "0", "--new-ids", "append") == 2
    error = capsys.readouterr().err
    assert "--new-ids reserved" in error and "262,144" in error
    assert not out.exists()


def test_which_configs_route_appended_ids_away_from_text():
    from transformers import Gemma3nConfig, Gemma3nTextConfig, LlamaConfig

    from extension.errors import InvalidOptionError
    from extension.plan.new_ids import resolve_new_ids

    # the multimodal config: its text_config's per-layer table, and its vision / audio embedders
    assert resolve_new_ids("auto", Gemma3nConfig(), base_model="m")[0] == "reserved"
    assert resolve_new_ids("auto", LlamaConfig(), base_model="m") == ("append", None)
    grows = Gemma3nTextConfig(vocab_size=1000, vocab_size_per_layer_input=1000)  # a table that grows as text
    assert resolve_new_ids("auto", grows, base_model="m") == ("append", None)
    assert resolve_new_ids("reserved", Gemma3nConfig(), base_model="m") == ("reserved", None)
    with pytest.raises(InvalidOptionError, match="new-ids reserved"):
        resolve_new_ids("append", Gemma3nConfig(), base_model="m")


def test_the_adapter_on_the_base_model_predicts_as_the_published_folder(extended):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, out = extended
    ids = AutoTokenizer.from_pretrained(out)("ciprofloxacin and immunohistochemistry", return_tensors="pt").input_ids
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
        # reserved ids: the adapter applies to the base as it is, per-layer rows included
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "adapter").eval()(ids).logits
    assert torch.allclose(adapted, merged, atol=1e-5)
