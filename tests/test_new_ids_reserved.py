"""`--new-ids reserved` (issue 40 item 2) through the product's doors: new terms take the base
tokenizer's reserved unused tokens (Gemma's <unusedN>, Llama 3's <|reserved_special_token_N|>), the
embedding keeps its size, every row but the taken ones stays bit-identical, and a job that needs
more than are free is refused before any weights are read. Tiny random models with the real
tokenizers; the published folder is read with stock transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main

TERMS = "ciprofloxacin\nimmunohistochemistry\n"
TEXT = "Staining by immunohistochemistry showed that ciprofloxacin works."


def _tiny(tokenizer_dir: Path, folder: Path, model_type: str, *, tied: bool) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    config = AutoConfig.for_model(
        model_type, vocab_size=max(tokenizer.get_vocab().values()) + 1, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=tied, **{k: v for k, v in ids.items() if v is not None})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _extend(base: Path, out: Path, terms: Path, *extra: str, capsys=None) -> int:
    torch.set_num_threads(1)
    # --term-context-tokens 16: the contexts a terms-only job writes token by token are most of its
    # time on a CPU, and what is checked here does not depend on their length
    return main(["extend", "--base-model", str(base), "--terms", str(terms), "--eval-bytes", "1000",
                 "--term-context-tokens", "16", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def llama3_base(tmp_path_factory, model_sources):
    from tests.model_families import family_tokenizer_dir

    folder = tmp_path_factory.mktemp("llama3-reserved")
    return _tiny(family_tokenizer_dir("llama3-original", model_sources), folder / "base", "llama", tied=False)


@pytest.fixture(scope="module")
def llama3_jobs(llama3_base, tmp_path_factory):
    """The same job twice, appended and on reserved ids (2 training steps, no selection)."""
    folder = tmp_path_factory.mktemp("llama3-jobs")
    terms = folder / "terms.txt"
    terms.write_text(TERMS)
    common = ["--steps", "2", "--batch-size", "1", "--seq-len", "32", "--selection", "none"]
    assert _extend(llama3_base, folder / "append", terms, *common) == 0
    assert _extend(llama3_base, folder / "reserved", terms, *common, "--new-ids", "reserved", "--json") == 0
    return llama3_base, folder / "append", folder / "reserved"


def test_reserved_job_keeps_the_embedding_size_and_every_row_but_the_taken_ones(llama3_jobs):
    base, _, out = llama3_jobs
    old, new = _tensors(base), _tensors(out)
    report = json.loads((out / "tide_extension.json").read_text())
    taken = [entry["id"] for entry in report["reserved_tokens"]]
    assert taken and all(128002 <= i < 128256 for i in taken)
    assert report["vocab"]["vocab_size"] == 128256 and report["vocab"]["new_ids"] == "reserved"
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert new[name].shape == old[name].shape
        others = torch.ones(old[name].shape[0], dtype=torch.bool)
        others[taken] = False
        assert torch.equal(new[name][others], old[name][others])
        assert not torch.equal(new[name][taken], old[name][taken])
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 128256


def test_reserved_terms_encode_to_their_reserved_ids_in_stock_transformers(llama3_jobs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, out = llama3_jobs
    report = json.loads((out / "tide_extension.json").read_text())
    by_token = {entry["token"]: entry for entry in report["reserved_tokens"]}
    tokenizer = AutoTokenizer.from_pretrained(out)
    for term in ("ciprofloxacin", "immunohistochemistry"):
        ids = tokenizer(" " + term, add_special_tokens=False).input_ids
        assert ids == [by_token["Ġ" + term]["id"]]
        assert by_token["Ġ" + term]["reserved"].startswith("<|reserved_special_token_")
        assert tokenizer.convert_ids_to_tokens(ids) == ["Ġ" + term]
    taken = by_token["Ġciprofloxacin"]["reserved"]
    assert taken not in tokenizer.get_vocab()  # the reserved string is gone, its id is the term's
    assert "<|reserved_special_token_250|>" in tokenizer.get_vocab()  # untaken ones stay
    assert len(tokenizer) == 128256
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert model(tokenizer(TEXT, return_tensors="pt").input_ids).logits.isfinite().all()


def test_reserved_job_gives_the_appended_jobs_logits_on_the_reserved_ids(llama3_jobs):
    """Training ran on appended ids in both jobs: the reserved job's model is the appended one with
    its new rows moved, so its logits are the appended model's, column for column (the columns of
    the taken reserved tokens hold the new tokens' logits), and the model the job evaluated."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, appended, reserved = llama3_jobs
    tok_a, tok_r = AutoTokenizer.from_pretrained(appended), AutoTokenizer.from_pretrained(reserved)
    ids_a, ids_r = tok_a(TEXT, return_tensors="pt").input_ids, tok_r(TEXT, return_tensors="pt").input_ids
    report = json.loads((reserved / "tide_extension.json").read_text())
    appended_report = json.loads((appended / "tide_extension.json").read_text())
    moved = {a["id"]: r["id"] for a, r in zip(appended_report["new_tokens"], report["new_tokens"])}
    assert [moved.get(i, i) for i in ids_a[0].tolist()] == ids_r[0].tolist()
    with torch.no_grad():
        logits_a = AutoModelForCausalLM.from_pretrained(appended).eval()(ids_a).logits[0]
        logits_r = AutoModelForCausalLM.from_pretrained(reserved).eval()(ids_r).logits[0]
    assert logits_r.shape[-1] == 128256
    columns = torch.arange(128256)
    columns[list(moved.values())] = torch.tensor(list(moved.keys()))
    torch.testing.assert_close(logits_r, logits_a[:, columns], rtol=1e-5, atol=1e-5)


def test_reserved_job_reports_the_taken_tokens(llama3_jobs, capsys):
    _, _, out = llama3_jobs
    metrics = json.loads((out / "metrics.json").read_text())
    assert [entry["reserved"] for entry in metrics["reserved_tokens"]][:2] == [
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]
    card = (out / "README.md").read_text()
    taken = metrics["reserved_tokens"]
    assert f"Reserved tokens taken ({len(taken)})" in card and "<\\|reserved_special_token_0\\|>" in card
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["token_indices"] == [entry["id"] for entry in taken]


def test_the_adapter_on_the_unresized_base_is_the_published_model(llama3_jobs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, _, out = llama3_jobs
    ids = AutoTokenizer.from_pretrained(out)(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        published = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "adapter").eval()(ids).logits
    torch.testing.assert_close(adapted, published)


def test_the_cli_summary_names_the_taken_tokens(llama3_base, tmp_path, capsys):
    terms = tmp_path / "terms.txt"
    terms.write_text("ciprofloxacin\n")
    assert _extend(llama3_base, tmp_path / "out", terms, "--steps", "0", "--selection", "none",
                   "--new-ids", "reserved") == 0
    out = capsys.readouterr().out
    assert "reserved tokens taken" in out and "<|reserved_special_token_0|> (128002)" in out


def test_more_terms_than_free_reserved_tokens_is_refused_before_loading(llama3_base, tmp_path, capsys, monkeypatch):
    import extension.pipeline as pipeline

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(pipeline, "load_model", no_weights)
    terms = tmp_path / "terms.txt"
    terms.write_text("\n".join(f"zqxterm{i}word" for i in range(200)) + "\n")
    code = _extend(llama3_base, tmp_path / "out", terms, "--steps", "0", "--new-ids", "reserved")
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists()
    assert "--new-ids is 'reserved'" in err and "only 251 free reserved tokens" in err
    assert "--new-ids append" in err and "fewer terms" in err


def test_a_corpus_job_may_mine_only_as_many_as_are_free(llama3_base, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("ciprofloxacin immunohistochemistry\n\n" * 20)
    torch.set_num_threads(1)
    code = main(["extend", "--base-model", str(llama3_base), "--corpus", str(corpus), "--new-ids", "reserved",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists()
    assert "up to 300 new vocabulary entries" in err and "--max-new-tokens 251" in err


def test_a_tokenizer_without_reserved_tokens_is_refused(tiny_model_dir, tmp_path, capsys):
    terms = tmp_path / "terms.txt"
    terms.write_text("ciprofloxacin\n")
    code = _extend(tiny_model_dir, tmp_path / "out", terms, "--steps", "0", "--new-ids", "reserved")
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists()
    assert "no free reserved tokens" in err and "--new-ids append" in err


def test_gemma_takes_unused_tokens_and_never_an_id_the_config_names(model_sources, tmp_path):
    """The model-family matrix's Gemma 3 case on reserved ids (tests/model_families.GEMMA3_RESERVED,
    left to this file) with an id its config names: every check of the matrix holds, and the named
    id is never taken."""
    import shutil

    from transformers import AutoTokenizer

    from tests.model_families import GEMMA3_RESERVED, assert_every_check_passes, base_checkpoint, extend_case

    base = tmp_path / "base"
    shutil.copytree(base_checkpoint(GEMMA3_RESERVED, model_sources), base)
    config = json.loads((base / "config.json").read_text())
    config["image_token_id"] = 6  # <unused0> named by the config: never taken
    (base / "config.json").write_text(json.dumps(config))
    torch.set_num_threads(1)
    out = tmp_path / "out"
    extend_case(GEMMA3_RESERVED, base, out)
    assert_every_check_passes(GEMMA3_RESERVED, base, out)
    report = json.loads((out / "tide_extension.json").read_text())
    taken = [entry["id"] for entry in report["reserved_tokens"]]
    assert 6 not in taken and report["reserved_tokens"][0]["reserved"] == "<unused1>"
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer(" ciprofloxacin", add_special_tokens=False).input_ids) == 1
    assert tokenizer(" ciprofloxacin", add_special_tokens=False).input_ids[0] in taken
    old, new = _tensors(base), _tensors(out)
    name = next(n for n in old if n.endswith("embed_tokens.weight"))
    assert new[name].shape == old[name].shape
    others = torch.ones(old[name].shape[0], dtype=torch.bool)
    others[taken] = False
    assert torch.equal(new[name][others], old[name][others])


def test_a_corpus_job_mines_onto_reserved_ids(llama3_base, tmp_path):
    from transformers import AutoTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Patient {i} got ciprofloxacin after immunohistochemistry." for i in range(60)))
    torch.set_num_threads(1)
    code = main(["extend", "--base-model", str(llama3_base), "--corpus", str(corpus), "--new-ids", "reserved",
                 "--max-new-tokens", "8", "--steps", "0", "--selection", "none", "--eval-bytes", "1000",
                 "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "tide_extension.json").read_text())
    taken = {entry["token"]: entry["id"] for entry in report["reserved_tokens"]}
    assert taken and all(128002 <= i < 128256 for i in taken.values())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert len(tokenizer) == 128256
    assert set(tokenizer(corpus.read_text(), add_special_tokens=False).input_ids) & set(taken.values())


def test_trainer_moments_stay_in_place_and_the_taken_rows_get_the_new_rows(tmp_path):
    from extension.training.optimizer_state import grow_moments

    old = {"step": torch.tensor(100.0), "exp_avg": torch.randn(10, 4), "exp_avg_sq": torch.rand(10, 4)}
    new = {"step": torch.tensor(100.0), "exp_avg": torch.ones(2, 4), "exp_avg_sq": torch.full((2, 4), 2.0),
           "betas": (0.9, 0.999)}
    grown = grow_moments(old, 10, 10, new, (0.9, 0.999), at_ids=[3, 7])
    keep = [i for i in range(10) if i not in (3, 7)]
    for key in ("exp_avg", "exp_avg_sq"):
        assert grown[key].shape == old[key].shape and torch.equal(grown[key][keep], old[key][keep])
    torch.testing.assert_close(grown["exp_avg"][[3, 7]], torch.ones(2, 4))
    torch.testing.assert_close(grown["exp_avg_sq"][[3, 7]], torch.full((2, 4), 2.0))
    assert torch.equal(grow_moments(old, 10, 10, None, (0.9, 0.999), at_ids=[3])["exp_avg"][3], torch.zeros(4))


def test_ids_the_processor_or_the_tokenizer_names_are_never_free(gemma3_tokenizer_path, tmp_path):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from extension.tokenizer.reserved import check_reserved_job

    tokenizer = AutoTokenizer.from_pretrained(gemma3_tokenizer_path)
    tokenizer.pad_token = "<unused1>"  # a fine-tune's pad token: generation and collators read it
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "X", "image_token": "<unused0>",
                                                                "audio": {"boa_token": "<unused2>"}}))
    spec = SimpleNamespace(new_ids="reserved", base_model="gemma", terms=None, corpus_path="corpus", max_new_tokens=3)
    free = check_reserved_job(spec, tokenizer, None, model_folder=tmp_path)
    assert [token.content for token in free[:2]] == ["<unused3>", "<unused4>"]
    assert check_reserved_job(SimpleNamespace(new_ids="append"), tokenizer, None) is None


def test_a_trainer_checkpoint_on_reserved_ids_keeps_its_moments_in_place_and_resumes(llama3_base, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from extension.training.optimizer_state import trainer_parameter_order, vocab_parameters

    tokenizer = AutoTokenizer.from_pretrained(llama3_base)
    texts = [{"text": f"Case {i}: ciprofloxacin after immunohistochemistry of the sample."} for i in range(8)]

    def collate(rows, tokenizer_now=None):
        batch = (tokenizer_now or tokenizer)([row["text"] for row in rows], return_tensors="pt")
        return {**batch, "labels": batch["input_ids"]}

    def args(out, steps, save):
        return TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=2, report_to=[],
                                 use_cpu=True, save_strategy="steps" if save else "no", save_steps=steps,
                                 remove_unused_columns=False, dataloader_num_workers=0, logging_steps=1000)

    torch.set_num_threads(1)
    Trainer(model=AutoModelForCausalLM.from_pretrained(llama3_base), args=args(tmp_path / "run", 2, True),
            train_dataset=texts, data_collator=collate, processing_class=tokenizer).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    terms = tmp_path / "terms.txt"
    terms.write_text("ciprofloxacin\n")
    assert _extend(checkpoint, tmp_path / "out", terms, "--steps", "2", "--batch-size", "1", "--seq-len", "32",
                   "--selection", "none", "--new-ids", "reserved") == 0
    out = tmp_path / "out"
    taken = [entry["id"] for entry in json.loads((out / "tide_extension.json").read_text())["reserved_tokens"]]
    model = AutoModelForCausalLM.from_pretrained(out)
    order = [name for group in trainer_parameter_order(model) for name in group]
    vocab = {name for name, p in model.named_parameters() if id(p) in vocab_parameters(model)}
    before = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    after = torch.load(out / "optimizer.pt", weights_only=True)["state"]
    others = torch.ones(128256, dtype=torch.bool)
    others[taken] = False
    for index, old in before.items():
        for key in ("exp_avg", "exp_avg_sq"):
            new = after[index][key]
            assert new.shape == old[key].shape
            if order[index] in vocab:
                assert torch.equal(new[others], old[key][others]) and new[taken].abs().sum() > 0
            else:
                assert torch.equal(new, old[key])
    new_tokenizer = AutoTokenizer.from_pretrained(out)
    trainer = Trainer(model=model.train(), args=args(tmp_path / "resumed", 3, False), train_dataset=texts,
                      data_collator=lambda rows: collate(rows, new_tokenizer))
    trainer.train(resume_from_checkpoint=str(out))
    assert trainer.state.global_step == 3
