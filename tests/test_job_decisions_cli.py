"""Issue 26 through `tide extend` on the tiny random model (tests/conftest.py `tiny_model_dir`): what
a job decided, said in its summary and its model card — what term selection kept and gave up,
why training stopped early, and how a terms-only job compares with the base model on its
held-out contexts."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main
from extension.publishing.decisions import decision_sentences
from tests.service.conftest import foldoc_documents

SMALL = ["--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000", "--warmup-steps", "0", "--checkpoint-every", "0"]


def _extend(capsys, model_dir: Path, out: Path, *args: str) -> tuple[str, dict, str]:
    """(stdout, metrics.json, README.md) of one `tide extend` run."""
    capsys.readouterr()
    assert main(["extend", "--base-model", str(model_dir), "--out", str(out), *SMALL, *args]) == 0
    stdout = capsys.readouterr().out
    return stdout, json.loads((out / "metrics.json").read_text()), (out / "README.md").read_text()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_corpus_job_says_what_selection_kept_and_gave_up(tmp_path, tiny_model_dir, cli_cache, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(900, skip=50)))
    stdout, metrics, card = _extend(capsys, tiny_model_dir, tmp_path / "out", "--corpus", str(corpus),
                                    "--max-new-tokens", "24", "--steps", "4")
    selection = metrics["selection"]
    offered, kept = selection["rounds"][0]["new_tokens"], selection["kept"]
    assert offered == 24 and all("tokens_per_byte" in entry for entry in selection["rounds"])
    cli_sentence = next(s for s in decision_sentences(metrics, style="cli") if s.startswith("Term selection kept"))
    assert cli_sentence in _one_line(stdout)
    counted = f"kept all {offered} new tokens offered" if kept == offered else f"kept {kept} of the {offered} new tokens offered"
    assert counted in cli_sentence and "shorter in tokens" in cli_sentence
    card_sentence = next(s for s in decision_sentences(metrics, style="both") if s.startswith("Term selection kept"))
    assert card_sentence in _one_line(card)


def test_a_job_stopped_by_its_time_budget_says_so(tmp_path, tiny_model_dir, cli_cache, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(300, skip=50)))
    stdout, metrics, card = _extend(capsys, tiny_model_dir, tmp_path / "out", "--corpus", str(corpus), "--max-new-tokens",
                                    "12", "--keep-all-terms", "--steps", "100000", "--max-train-seconds", "1")
    training = metrics["training"]
    assert training["stopped"] == "time_budget" and 0 < training["steps"] < training["planned_steps"] == 100000
    line = f"Stopped early after {training['steps']} of 100000 steps: its time budget of 1 s ran out"
    assert line in stdout and line in card
    extension = json.loads((tmp_path / "out" / "tide_extension.json").read_text())
    assert extension["training"]["stopped"] == "time_budget" and extension["trained_steps"] == training["steps"]


def test_a_terms_only_job_is_compared_with_the_base_model_on_its_held_out_contexts(tmp_path, tiny_model_dir, cli_cache, capsys):
    terms = tmp_path / "terms.txt"
    terms.write_text("compiler\ninterrupt\nmultiprogramming\n")
    stdout, metrics, card = _extend(capsys, tiny_model_dir, tmp_path / "out", "--terms", str(terms), "--steps", "4")
    validation = metrics["selection"]["validation"]
    assert validation["source"] == "held-out generated contexts"
    before, after = metrics["before"]["held_out_contexts"], metrics["after"]["held_out_contexts"]
    # the base model on the base tokenizer's ids, the published rows on the extended one's: same text, in bits per byte
    assert before["bits_per_byte"] == validation["base_bits_per_byte"] and before["bytes"] == after["bytes"] == validation["bytes"]
    assert after["tokens_per_byte"] < before["tokens_per_byte"]
    row = metrics["comparison"]["held_out_contexts_bits_per_byte"]
    assert (row["before"], row["after"]) == (before["bits_per_byte"], after["bits_per_byte"])
    assert f"held_out_contexts_bits_per_byte: {row['before']:.4f} -> {row['after']:.4f}" in stdout
    assert "Held-out contexts bits per byte" in card
    worse = row["after"] > row["before"]
    said = "the extended model is WORSE than the base model" if worse else "the extended model is at or below the base model"
    assert said in _one_line(stdout) and said in _one_line(card)
