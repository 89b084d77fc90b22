"""Issue 39: a terms-only job's contexts read like the user's list (its script, no English frame),
come from the user's examples first, and the held-out parts decide and judge apart; terms that
make the deciding text worse than the base are removed, and the report says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from app.cli import main
from extension.plan.options import BY_NAME
from extension.training.example_snippets import snippets_around, split_examples
from extension.training.term_prompts import TEMPLATES, conditioning_prefix, list_separator, term_prompts, writing_system
from tests.service.conftest import foldoc_documents

SMALL = ["--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000", "--warmup-steps", "0", "--checkpoint-every", "0"]
GERMAN = ["Krankenhaus", "Lungenentzündung", "Schmerzmittel", "Blutdruck", "Notaufnahme"]
CHINESE = ["道德经", "明月", "天下", "人生", "故乡"]


def test_the_writing_system_of_a_term():
    assert [writing_system(t) for t in ("Krankenhaus", "道德经", "ひらがな", "ภาษาไทย", "Ελληνικά", "C++", "")] == [
        "spaced", "cjk", "cjk", "unspaced", "spaced", "spaced", "spaced"]
    assert list_separator(CHINESE) == "、" and list_separator(GERMAN) == ", "


@pytest.mark.parametrize("terms", [GERMAN, CHINESE], ids=["german", "chinese"])
def test_prompts_are_made_of_the_list_alone(terms):
    """No word of ours around a German or Chinese term: a prompt is the term, or the term after
    other terms of the same list joined as the list's script writes a list."""
    prompts = term_prompts(terms, 4, style="list", seed=0)
    assert len(prompts) == 4 * len(terms)
    separator = list_separator(terms)
    for index, term in enumerate(terms):
        own = prompts[4 * index : 4 * index + 4]
        assert all(p.endswith(term) for p in own)
        assert own[1] == own[3] == term  # Token Distillation's prompt: the term alone
        for prompt in own[::2]:
            words = prompt.split(separator)
            assert 2 <= len(words) <= 4 and set(words) <= set(terms) and len(set(words)) == len(words)
    assert not any(re.search(r"[A-Za-z]", p) for p in prompts) if terms is CHINESE else True
    assert term_prompts(terms, 4, style="list", seed=0) == prompts != term_prompts(terms, 4, style="list", seed=1)
    assert term_prompts(terms, 2, style="term") == [t for t in terms for _ in range(2)]
    # the other terms only condition the writing: the context trained on starts at the term
    prefix = conditioning_prefix(prompts[0], terms[0], "list")
    assert prompts[0] == prefix + (" " if separator == ", " else "") + terms[0] and terms[0] not in prefix
    assert conditioning_prefix(terms[0], terms[0], "list") is None
    assert conditioning_prefix(f"The {terms[0]}", terms[0], "templates") is None
    # the earlier default, kept for benchmarks: one English frame per term
    assert term_prompts(GERMAN, 2, style="templates")[2:4] == [TEMPLATES[1].format(term=GERMAN[1])] * 2


def test_snippets_of_the_examples_hold_the_term_and_spread_over_documents():
    docs = [("Vorwort. " * 40) + "Das Krankenhaus liegt am Fluss. " + ("Mehr Text hier. " * 60),
            "Im Krankenhaus war es ruhig.", "Kein Treffer."]
    found = snippets_around("Krankenhaus", docs, limit=5)
    assert len(found) == 2 and all("Krankenhaus" in s for s in found)
    assert found[0].startswith("Vorwort.") and len(found[0]) <= 600 and not found[0].endswith(" ")
    assert snippets_around("Krankenhaus", docs, limit=1) == found[:1]
    assert split_examples(["a", "b", "c", "d", "e", "f"]) == (["a", "c", "e", "f"], ["d"], ["b"])
    assert split_examples(["a"]) == (["a"], [], [])


def _extend(capsys, model_dir: Path, out: Path, *args: str) -> tuple[str, dict]:
    capsys.readouterr()
    assert main(["extend", "--base-model", str(model_dir), "--out", str(out), *SMALL, *args]) == 0
    return capsys.readouterr().out, json.loads((out / "metrics.json").read_text())


def test_examples_train_first_and_judge_through_the_cli(tmp_path, tiny_model_dir, cli_cache, capsys):
    """`--examples FILE`: snippets around each term train before generated contexts do, one part of
    the documents decides and one judges, and the verdict says it was measured on them."""
    documents = foldoc_documents(40, skip=50)
    terms = ["computer", "program", "language"]
    assert all(any(t in d for d in documents) for t in terms)
    (tmp_path / "terms.txt").write_text("\n".join(terms) + "\n")
    (tmp_path / "examples.txt").write_text("\n\n".join(documents))
    stdout, metrics = _extend(capsys, tiny_model_dir, tmp_path / "out", "--terms", str(tmp_path / "terms.txt"),
                              "--examples", str(tmp_path / "examples.txt"), "--steps", "10")
    contexts = metrics["selection"]["contexts"]
    # --term-contexts unset: this CPU's default (10 steps x batch 2 over 3 terms read up to 7 each)
    assert contexts["per_term"] == BY_NAME["term_contexts"].default_on("cpu_bf16") == BY_NAME["term_contexts"].default == 4
    assert contexts["from_examples"] > 0
    assert contexts["deciding"] == contexts["judging"] == "examples"
    assert metrics["selection"]["validation"]["source"] == "held-out documents of your examples"
    assert metrics["selection"]["judging"]["source"] == "held-out documents of your examples, judging part"
    assert "On held-out documents of your examples (kept out of training and of every decision)" in " ".join(stdout.split())


def test_examples_with_a_corpus_are_refused_naming_the_fix(tmp_path, tiny_model_dir, cli_cache, capsys):
    (tmp_path / "terms.txt").write_text("computer\n")
    (tmp_path / "examples.txt").write_text("A computer.")
    (tmp_path / "corpus.txt").write_text("A computer program.")
    code = main(["extend", "--base-model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--terms",
                 str(tmp_path / "terms.txt"), "--corpus", str(tmp_path / "corpus.txt"), "--examples", str(tmp_path / "examples.txt")])
    assert code == 2 and not (tmp_path / "out").exists()
    assert "add the examples' documents to the corpus instead" in capsys.readouterr().err


def test_a_term_that_makes_the_deciding_text_worse_is_removed(tiny_model_dir):
    """Terms-only selection (the corpus path's, on the deciding held-out part): a term whose rows
    make that text worse than the base goes, the report says why, and what judges is measured
    with the kept terms only. Before issue 39 a terms-only job kept every term."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.plan.spec import Callbacks, ExtendSpec
    from extension.rows.init import NewRows, RowInitializer
    from extension.rows.stage import StartRows
    from extension.selection import build_validation
    from extension.selection.stage import choose_terms
    from extension.tokenizer import extend_tokenizer
    from extension.training.stage import JobTexts, Trained

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    terms = ["available", "information"]  # words the tiny tokenizer splits into 3+ pieces
    extended = extend_tokenizer(tokenizer, terms)
    documents = [d for d in foldoc_documents(1500, skip=50) if " available" in d or " information" in d][:120]
    validation = build_validation(model, tokenizer, documents, source="held-out generated contexts", min_bytes=2000)
    judging = build_validation(model, tokenizer, documents[::-1], source="held-out generated contexts, judging part", min_bytes=1)
    embedding = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    # "available" pays by construction: its head row is its first piece's, so it is as likely as that
    # piece alone, where the base needed the whole chain of pieces (near-uniform in a random model);
    # "information"'s head row takes the probability of a frequent word: it costs
    rows = torch.stack([head[t.base_ids[0]] for t in extended.new_tokens])
    bad = [i for i, t in enumerate(extended.new_tokens) if "information" in t.text]
    rows[bad] = head[tokenizer.convert_tokens_to_ids("Ġthe")] * 10  # where "the" is likely, "information" takes its place
    tied = model.config.tie_word_embeddings
    start = torch.stack([embedding[t.base_ids].mean(0) for t in extended.new_tokens])
    trained = Trained(rows=NewRows(input=rows if tied else start, output=None if tied else rows))
    texts = JobTexts(objective=None, validation=validation, report={"mode": "validation", "judging": judging.report()},
                     judging=judging)
    spec = ExtendSpec(base_model=str(tiny_model_dir), out_dir=Path("unused"), terms=terms)
    warnings: list[str] = []
    chosen = choose_terms(spec, model, tokenizer, extended, trained, texts, StartRows(trained.rows, "subword_mean", RowInitializer(model, tokenizer, "subword_mean"), {}),
                          None, Callbacks(on_warning=warnings.append))
    assert [t.term for t in chosen.extended.terms] == ["available"]
    assert [entry["term"] for entry in chosen.report["removed"]] == ["information"]
    assert any("'information' removed" in w and "give a corpus or examples of your text to keep it" in w for w in warnings)
    # the judging part decided nothing: it is measured with the kept term only, for the report
    assert chosen.report["judging"]["source"].endswith("judging part") and list(chosen.report["effects"]) == ["available"]


def test_the_other_terms_of_a_list_prompt_are_not_trained_on(tiny_model_dir):
    """A "list" prompt's other terms set the domain of what the base model writes, and are cut
    from the context before training: every context starts at its own term."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.tokenizer import extend_tokenizer
    from extension.training import TrainConfig
    from extension.training.term_contexts import terms_objective

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    terms = ["multiprogramming", "hypertext", "microprocessor"]
    extended = extend_tokenizer(AutoTokenizer.from_pretrained(tiny_model_dir), terms)
    built = terms_objective(model, extended, TrainConfig(steps=6, batch_size=2, seq_len=32), max_new_tokens=6)
    texts = [extended.tokenizer.decode(c.student, skip_special_tokens=True) for c in built.contexts]
    per_term = built.plan["per_term"]
    assert per_term == 4 and len(texts) == 3 * per_term
    for index, term in enumerate(terms):
        assert all(text.lstrip().startswith(term) for text in texts[index * per_term:(index + 1) * per_term]), texts


def test_every_context_is_read_after_the_token_held_out_text_is_scored_after(tiny_model_dir):
    """Held-out scoring predicts a chunk's first token after BOS (else EOS), so the term right at
    the start is scored. A training context that began with the term itself (SmolLM2's tokenizer
    adds no BOS) never had it as a target: what the check asked first was never trained."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from extension.evaluation import context_token_id
    from extension.tokenizer import extend_tokenizer
    from extension.training import TrainConfig
    from extension.training.term_contexts import terms_objective

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer("hypertext")["input_ids"][0] != context_token_id(tokenizer)  # the case this is about
    extended = extend_tokenizer(tokenizer, ["hypertext"])
    built = terms_objective(model, extended, TrainConfig(steps=4, batch_size=2, seq_len=32), max_new_tokens=6,
                            style="term")
    new_id = extended.terms[0].forms["hypertext"]
    for context in built.contexts:
        assert context.student[:2] == [context_token_id(tokenizer), new_id], context.student
        assert context.teacher[0] == context_token_id(tokenizer)
