"""Init 'distill' (extension/training/input_distillation.py): the new INPUT rows are trained so the model
reads the text after a new token as it reads it after the token's original pieces; nothing else
moves. Tiny random models for the mechanism, `tide extend --init distill` for the door."""

from __future__ import annotations

import json

import torch

from app.cli import main
from extension.rows.init import NewRows, subword_mean_rows
from extension.training.input_distillation import DISTILLED_NAME, batch_loss, distill_input_rows, window_contexts
from extension.rows.adapter import attach
from extension.tokenizer import NewToken
from tests.conftest import tiny_llama
from tests.service.conftest import foldoc_documents

BASE = 256
PIECES = {BASE: [5, 9], BASE + 1: [17, 3, 40], BASE + 2: [100, 101]}


def _stream(seed: int = 0, length: int = 4000) -> torch.Tensor:
    """Random base ids with the new ids sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, BASE, (length,), generator=g)
    at = torch.randperm(length, generator=g)[:300]
    tokens[at] = BASE + torch.arange(300) % len(PIECES)
    return tokens


def _adapter(tied: bool):
    model = tiny_llama(BASE, tied=tied)
    tokens = [NewToken(id=i, token=f"t{i}", text=f"t{i}", base_ids=ids, kind="form", term=f"t{i}") for i, ids in PIECES.items()]
    rows = subword_mean_rows(model, tokens, BASE)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}
    return model, frozen, attach(model, BASE, rows, pad_to_multiple_of=1)


def test_window_contexts_take_up_to_n_per_new_token_around_it():
    tokens = _stream()
    contexts = window_contexts(tokens, BASE, per_token=5, before=4, after=6)
    assert len(contexts) == 15 and all(sum(1 for c in contexts if i in c) >= 5 for i in PIECES)
    assert all(len(c) <= 11 and any(t >= BASE for t in c) for c in contexts)


def test_distillation_moves_only_the_input_rows_and_brings_the_student_closer_to_the_teacher():
    for tied in (True, False):
        model, frozen, adapter = _adapter(tied)
        output_before = None if tied else adapter.output_rows.detach().clone()
        contexts = window_contexts(_stream(), BASE, per_token=16)
        with torch.no_grad():
            before = float(batch_loss(adapter, contexts, PIECES, pad=0))
        report = distill_input_rows(adapter, contexts, PIECES, lr=1e-2, pad=0, epochs=4)
        with torch.no_grad():
            after = float(batch_loss(adapter, contexts, PIECES, pad=0))
        assert report.contexts == len(contexts) == 48 and report.steps == 8
        assert after < 0.8 * before, (tied, before, after)
        if not tied:
            assert torch.equal(adapter.output_rows, output_before)
        adapter.detach()
        for name, p in model.named_parameters():
            assert torch.equal(p, frozen[name]), name
            assert p.requires_grad  # the model's own flags are back


def _logit_change(adapter, contexts, start: torch.Tensor) -> float:
    """Largest change of a new row's logit at the hidden states the base model reads the contexts with."""
    from extension.training.term_contexts import expand

    with torch.no_grad():
        teacher = [expand(c, BASE, PIECES).teacher for c in contexts]
        width = max(len(t) for t in teacher)
        hidden = adapter.hidden(torch.tensor([t + [0] * (width - len(t)) for t in teacher])).float()
        read = torch.cat([hidden[b, : len(t)] for b, t in enumerate(teacher)])
        return float((read @ (adapter.input_rows - start).T).abs().max())


def test_a_logit_penalty_holds_tied_rows_logits_while_their_input_side_is_distilled():
    """Init 'subword_mean_distill': a tied row is also the head's row, so distilling its input side
    alone moves its logits everywhere (benchmarks/results/terms_only_foldoc_td25.md). With the
    penalty the logits at the states the model produces barely move, and the input side still learns."""
    contexts = window_contexts(_stream(), BASE, per_token=16)
    moved = {}
    for penalty in (0.0, 10000.0):
        _, _, adapter = _adapter(True)
        start = adapter.input_rows.detach().clone()
        with torch.no_grad():
            before = float(batch_loss(adapter, contexts, PIECES, pad=0))
        report = distill_input_rows(adapter, contexts, PIECES, lr=1e-2, pad=0, epochs=4, logit_penalty=penalty)
        with torch.no_grad():
            after = float(batch_loss(adapter, contexts, PIECES, pad=0))
        assert report.logit_penalty == penalty and after < before, (penalty, before, after)
        assert not torch.equal(adapter.input_rows, start)
        moved[penalty] = _logit_change(adapter, contexts, start)
        adapter.detach()
    assert moved[10000.0] < 0.2 * moved[0.0], moved
    # an untied model's head rows never move here, so there is nothing to hold: no penalty applied
    _, _, adapter = _adapter(False)
    assert distill_input_rows(adapter, contexts, PIECES, lr=1e-2, pad=0, logit_penalty=1000.0).logit_penalty == 0.0
    adapter.detach()


def test_no_contexts_leaves_the_rows_as_they_were():
    _, _, adapter = _adapter(True)
    start = adapter.input_rows.detach().clone()
    report = distill_input_rows(adapter, [[1, 2, 3]], PIECES, lr=1e-2, pad=0)
    assert report.steps == 0 and torch.equal(adapter.input_rows, start)


def test_tide_extend_init_distill_distils_then_trains(tmp_path, tiny_model_dir, cli_cache, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(300, skip=50)))
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(tiny_model_dir), "--out", str(out), "--corpus", str(corpus),
                 "--max-new-tokens", "12", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000",
                 "--keep-all-terms", "--init", "distill", "--distill-contexts", "2"]) == 0
    report = json.loads((out / "tide_extension.json").read_text())
    init = report["init"]
    # what ran is recorded (issue 37 item 5: it said "composition"), and what the distillation started from
    assert init["method"] == "distill" and (init["starts_from"] == "composition" or init.get("fallback_reason"))
    distilled = init["distillation"]
    assert distilled["contexts"] > 0 and distilled["steps"] > 0 and distilled["loss_last"] is not None
    assert distilled["contexts"] <= 2 * len(report["new_tokens"])  # --distill-contexts: at most 2 per new token


def test_a_rerun_in_the_same_work_folder_reuses_the_distilled_rows(tmp_path, tiny_model_dir, cli_cache, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(foldoc_documents(300, skip=50)))
    args = ["extend", "--base-model", str(tiny_model_dir), "--corpus", str(corpus), "--max-new-tokens", "12",
            "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--eval-bytes", "1000", "--keep-all-terms",
            "--init", "distill", "--work-dir", str(tmp_path / "work")]
    assert main([*args, "--out", str(tmp_path / "first")]) == 0
    assert (tmp_path / "work" / DISTILLED_NAME).exists()
    assert main([*args, "--out", str(tmp_path / "second")]) == 0
    first, second = (json.loads((tmp_path / name / "tide_extension.json").read_text())["init"]["distillation"]
                     for name in ("first", "second"))
    assert second.get("resumed") is True and not first.get("resumed")
    assert second["loss_last"] == first["loss_last"] and second["contexts"] == first["contexts"]
    # other distillation settings: distilled afresh, never the kept rows
    assert main([*args, "--distill-contexts", "1", "--out", str(tmp_path / "third")]) == 0
    third = json.loads((tmp_path / "third" / "tide_extension.json").read_text())["init"]["distillation"]
    assert not third.get("resumed")


def test_tide_extend_init_subword_mean_norm(tmp_path, tiny_model_dir, cli_cache):
    terms = tmp_path / "terms.txt"
    terms.write_text("compiler\nmultiprogramming\n")
    out = tmp_path / "out"
    assert main(["extend", "--base-model", str(tiny_model_dir), "--out", str(out), "--terms", str(terms), "--steps", "0",
                 "--init", "subword_mean_norm", "--eval-bytes", "1000"]) == 0
    assert json.loads((out / "tide_extension.json").read_text())["init"]["method"] == "subword_mean_norm"
