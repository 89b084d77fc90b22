"""Subword-mean initialisation, resizing, tying and padding rows (tiny random models)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from extension.rows.init import apply_rows, is_tied, subword_mean_rows
from extension.tokenizer import NewToken
from tests.conftest import tiny_gemma3, tiny_gpt2, tiny_llama

BASE = 256
PIECES = [[5, 9], [17, 3, 40], [200]]
FORTUNES = Path("/usr/share/games/fortunes/fortunes")


def new_tokens(pieces=PIECES) -> list[NewToken]:
    return [
        NewToken(id=BASE + i, token=f"tok{i}", text=f" tok{i}", base_ids=ids, kind="form", term=f"tok{i}")
        for i, ids in enumerate(pieces)
    ]


def extend(model, pad=64, calibration=None):
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = subword_mean_rows(model, new_tokens(), BASE)
    report = apply_rows(model, rows, base_vocab_size=BASE, pad_to_multiple_of=pad, calibration_ids=calibration)
    return before, rows, report


def test_tied_llama_rows_are_subword_means_and_old_rows_untouched():
    model = tiny_llama(BASE, tied=True)
    before, rows, report = extend(model)
    weight = model.get_input_embeddings().weight
    assert rows.output is None
    for i, ids in enumerate(PIECES):
        assert torch.equal(weight[BASE + i], before["model.embed_tokens.weight"][ids].mean(0))
    assert torch.equal(weight[:BASE], before["model.embed_tokens.weight"])
    for name, value in model.state_dict().items():
        if "embed_tokens" not in name and "lm_head" not in name:
            assert torch.equal(value, before[name]), name
    assert is_tied(model)
    # 256 base rows are a multiple of 128: the base's multiple is kept (issue 40), not the option's 64
    assert report["vocab_size"] == 384 and model.config.vocab_size == 384
    assert report["padding_ids"] == list(range(BASE + 3, 384))
    assert model.generation_config.suppress_tokens == report["padding_ids"]


def test_untied_llama_head_gets_its_own_means():
    model = tiny_llama(BASE, tied=False)
    before, rows, _ = extend(model)
    assert not is_tied(model)
    head = model.get_output_embeddings().weight
    for i, ids in enumerate(PIECES):
        assert torch.equal(head[BASE + i], before["lm_head.weight"][ids].mean(0))
        assert torch.equal(model.get_input_embeddings().weight[BASE + i], before["model.embed_tokens.weight"][ids].mean(0))
    assert not torch.equal(rows.input, rows.output)
    assert torch.equal(head[:BASE], before["lm_head.weight"])


def test_gpt2_tied_and_no_padding_when_disabled():
    model = tiny_gpt2(BASE)
    _, _, report = extend(model, pad=1)
    assert is_tied(model)
    assert report["vocab_size"] == BASE + 3 and report["padding_ids"] == []


def test_tied_stays_tied_after_save_and_reload(tmp_path):
    model = tiny_llama(BASE, tied=True)
    extend(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert is_tied(reloaded)
    assert reloaded.config.vocab_size == 384  # 256 rows: padded to the base's 128
    assert torch.equal(reloaded.get_input_embeddings().weight, model.get_input_embeddings().weight)


def test_gemma_scaled_embeddings_store_unscaled_rows():
    model = tiny_gemma3(BASE)
    extend(model)
    embed = model.get_input_embeddings()  # multiplies by sqrt(hidden) inside its forward
    for i, ids in enumerate(PIECES):
        new_input = embed(torch.tensor([BASE + i]))[0]
        pieces_input = embed(torch.tensor(ids)).mean(0)
        assert torch.allclose(new_input, pieces_input, rtol=1e-6, atol=0)
        assert not torch.allclose(new_input, model.get_input_embeddings().weight[BASE + i])


def _fortune_bytes(batch: int = 4, length: int = 128) -> torch.Tensor:
    """Real English text as ids: the tiny models' 256 base ids read as bytes."""
    data = FORTUNES.read_bytes()[: batch * length]
    return torch.tensor(list(data)).view(batch, length)


def test_padding_rows_stay_below_one_over_vocab_for_any_hidden_state():
    """A padding row is the mean real output row, so its logit is the mean real logit, and by
    Jensen (sum of exp >= V * exp of the mean) it takes at most 1/vocab of the mass whatever the
    hidden state: never more than an average token. That is all a random model can promise (its
    logits are nearly flat); the product's 1e-4 on real text is checked on SmolLM2 in
    test_extend_cli.py."""
    model = tiny_llama(BASE, tied=True)
    text = _fortune_bytes()
    _, _, report = extend(model, calibration=text)
    padding, vocab = report["padding_ids"], report["vocab_size"]
    bound = (1 + 1e-5) / vocab  # 1e-5: float rounding, far below the Jensen gap of these logits

    # measured here, not by init's own function: the full forward, softmax over the padded vocab
    with torch.no_grad():
        probabilities = torch.softmax(model(input_ids=text).logits.float(), dim=-1)
    assert probabilities.shape[-1] == vocab == 384 and len(padding) == 125  # the base's multiple of 128
    on_text = probabilities[..., padding]
    assert on_text.max() <= bound
    total = on_text.sum(-1).max()
    assert math.isclose(report["padding_probability_max"], float(total), rel_tol=1e-5)
    # flat logits cannot meet the product's 1e-4, and the report must not claim they do
    assert float(total) >= 1e-4 and report["padding_probability_ok"] is False

    # any hidden state: the head's input along each real row, against the mean row, and at
    # random, from typical size (the final norm gives about sqrt(hidden)) to a hundred times it
    head = model.get_output_embeddings()
    real = head.weight[: padding[0]].detach()
    directions = torch.cat([
        real / real.norm(dim=1, keepdim=True),
        torch.stack([real.mean(0), -real.mean(0)]) / real.mean(0).norm(),
        torch.nn.functional.normalize(torch.randn(64, real.shape[1], generator=torch.Generator().manual_seed(1)), dim=1),
    ])
    typical = model.config.hidden_size**0.5
    with torch.no_grad():
        for scale in (1, 10, 100):
            probabilities = torch.softmax(head(directions * typical * scale).float(), dim=-1)
            assert probabilities[:, padding].max() <= bound, scale
            # not vacuous: a state aligned with a real row lifts that row past the same bound
            assert probabilities[: len(real), : padding[0]].max(dim=1).values.min() > bound


def test_norm_corrected_mean_points_like_the_mean_with_its_pieces_mean_norm():
    from extension.rows.init import norm_corrected

    model = tiny_llama(BASE, tied=False)
    tokens = new_tokens()
    means = subword_mean_rows(model, tokens, BASE)
    for matrix, rows in ((model.get_input_embeddings().weight, means.input), (model.get_output_embeddings().weight, means.output)):
        corrected = norm_corrected(rows, matrix, tokens, BASE)
        for i, ids in enumerate(PIECES):
            want = matrix[ids].detach().norm(dim=1).mean()
            assert math.isclose(float(corrected[i].norm()), float(want), rel_tol=1e-5)
            assert float(torch.nn.functional.cosine_similarity(corrected[i], rows[i], dim=0)) > 0.9999
        # averaging pieces that point different ways shortens the row: the correction lengthens it
        assert float(corrected[1].norm()) > float(rows[1].norm())
        assert torch.allclose(corrected[2], rows[2])  # one piece: already its own norm


def test_auto_distils_trained_corpus_jobs_only():
    from extension.rows.init import init_method, row_method

    assert init_method("auto", 100, corpus=True) == "distill" and row_method("distill") == "composition"
    assert init_method("auto", 100, corpus=False) == "composition"
    assert init_method("auto", 0, corpus=True) == "subword_mean"
    # a terms-only job of 0 steps distils the mean rows' input side, holding their logits
    assert init_method("auto", 0, corpus=False) == "subword_mean_distill" and row_method("subword_mean_distill") == "subword_mean"
    assert init_method("subword_mean_norm", 100, corpus=True) == "subword_mean_norm"


def test_distill_without_training_is_refused_naming_the_option_and_the_fix(tiny_model_dir, tmp_path, capsys, cli_cache):
    """Issue 37 item 5: `--init distill --steps 0` quietly published composed rows recorded as
    'composition'. Refused now, before any weights are read: the option, the reason, the fix."""
    from app.cli import main
    from extension.errors import InvalidOptionError
    from extension.plan.job import validate_spec
    from extension.plan.options import option_error_for
    from extension.plan.spec import ExtendSpec

    terms = tmp_path / "terms.txt"
    terms.write_text("hypertext\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["extend", "--base-model", str(tiny_model_dir), "--terms", str(terms), "--init", "distill",
                 "--steps", "0", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.startswith("tide: error (--init): --init 'distill' distils the input rows"), err
    assert "train (steps above 0) or choose 'composition'" in err
    spec = ExtendSpec(base_model="smollm2-135m", out_dir=out, terms=["hypertext"], init="distill", steps=0)
    with pytest.raises(InvalidOptionError) as refused:
        validate_spec(spec)
    assert refused.value.code == "invalid_option" and refused.value.option == "init"
    assert option_error_for(refused.value, style="api")[1] == "training.init"
    validate_spec(ExtendSpec(base_model="smollm2-135m", out_dir=out, terms=["hypertext"], init="distill", steps=3))
    validate_spec(ExtendSpec(base_model="smollm2-135m", out_dir=out, terms=["hypertext"], init="distill"))  # steps: the device's


def test_mean_distill_on_a_corpus_job_of_0_steps_is_refused_and_allowed_for_terms(tmp_path):
    """'subword_mean_distill' distils on the job's texts: a terms-only job of 0 steps writes its
    contexts anyway, a corpus job of 0 steps cuts no windows, so that one is refused, with the fix."""
    from extension.errors import InvalidOptionError
    from extension.plan.job import validate_spec
    from extension.plan.spec import ExtendSpec

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Some text about hypertext.\n", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(InvalidOptionError) as refused:
        validate_spec(ExtendSpec(base_model="smollm2-135m", out_dir=out, corpus_path=corpus, init="subword_mean_distill", steps=0))
    assert refused.value.option == "init" and "a corpus job of 0 steps cuts none" in str(refused.value)
    assert "choose 'subword_mean'" in str(refused.value)
    validate_spec(ExtendSpec(base_model="smollm2-135m", out_dir=out, terms=["hypertext"], init="subword_mean_distill", steps=0))
    validate_spec(ExtendSpec(base_model="smollm2-135m", out_dir=out, corpus_path=corpus, init="subword_mean_distill", steps=3))
