"""Models whose logits are not plain `lm_head(hidden)` (issue 40): Granite divides by
`logits_scaling`, Cohere multiplies by `logit_scale`, Gemma soft-caps, Mamba casts fp32 hidden
states to a bf16 head. Training, selection and evaluation must compute the logits the model's own
forward computes, and a model whose head cannot be reproduced is refused with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from extension.errors import UnsupportedModelError
from extension.rows.adapter import attach
from extension.rows.init import NewRows
from extension.rows.logits import LogitTransform, head_mismatch
from tests.conftest import random_rows

BASE_VOCAB = 240

NEW = 9


def _tiny(model_type: str, seed: int = 0, **options):
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if model_type == "mamba":
        shape = dict(hidden_size=32, state_size=8, num_hidden_layers=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = AutoConfig.for_model(model_type, vocab_size=256, **{**shape, **options})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def granite():
    return _tiny("granite", logits_scaling=8.0, tie_word_embeddings=False)


def cohere():
    return _tiny("cohere", logit_scale=16.0, tie_word_embeddings=True)


def gemma2():
    return _tiny("gemma2", head_dim=8, final_logit_softcapping=3.0, sliding_window=16)


MODELS = {"granite": granite, "cohere": cohere, "gemma2": gemma2}


def _rows(model, seed=3) -> NewRows:
    return random_rows(model, NEW, seed)


def _ids(seed=4, shape=(2, 16)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, BASE_VOCAB + NEW, shape, generator=g)
    ids[:, 3] = BASE_VOCAB + torch.arange(shape[0])
    return ids


def test_the_transform_is_read_from_the_model():
    assert LogitTransform.from_model(granite()) == LogitTransform(scale=1 / 8)
    assert LogitTransform.from_model(cohere()) == LogitTransform(scale=16.0)
    assert LogitTransform.from_model(gemma2()) == LogitTransform(softcap=3.0)


@pytest.mark.parametrize("name", MODELS)
def test_the_fused_training_loss_is_the_models_own_loss(name):
    """The rows are trained against the logits the merged model really predicts: the fused loss
    on a probe batch equals the cross-entropy of the merged model's own forward."""
    model = MODELS[name]()
    merged = copy.deepcopy(model)
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids, targets = _ids(), _ids(seed=5)
    with torch.no_grad():
        fused = adapter.loss(adapter.hidden(ids), targets)
        attached = model(input_ids=ids).logits[..., : BASE_VOCAB + NEW]
    adapter.merge(into=merged)
    with torch.no_grad():
        own = merged(input_ids=ids).logits[..., : BASE_VOCAB + NEW].float()
    reference = F.cross_entropy(own.reshape(-1, own.shape[-1]), targets.reshape(-1))
    assert torch.allclose(fused, reference, rtol=1e-5, atol=1e-5), (float(fused), float(reference))
    # the attached model's forward, too, gives the merged model's logits (its own transform not applied twice)
    assert torch.allclose(attached.float(), own, atol=1e-4)
    # detached: the model's own transform is back
    assert LogitTransform.from_model(model) == LogitTransform.from_model(MODELS[name]())


@pytest.mark.parametrize("name", MODELS)
def test_the_fused_gradients_follow_the_transform(name):
    model = MODELS[name]()
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids, targets = _ids(), _ids(seed=5)
    adapter.loss(adapter.hidden(ids), targets, chunk_elements=3 * (BASE_VOCAB + NEW)).backward()
    fused = [p.grad.clone() for p in adapter.parameters()]
    for p in adapter.parameters():
        p.grad = None
    logits = adapter.logits(adapter.hidden(ids))[..., : BASE_VOCAB + NEW]
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    for got, p in zip(fused, adapter.parameters()):
        assert torch.allclose(got, p.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_evaluation_takes_the_head_path_for_scaled_logits(name):
    """Evaluation reproduces the transform rather than falling back to the full forward."""
    from extension.evaluation.scoring import Scorer

    model = MODELS[name]()
    scorer = Scorer(model, batch_tokens=256, logit_elements=1 << 16)
    with torch.inference_mode():
        scorer.check_head_path(list(range(1, 17)))
    assert scorer.use_head_path


@pytest.mark.parametrize("name", MODELS)
def test_selection_scores_as_the_model_does(name):
    from extension.selection.scoring import score_text

    class Tok:
        def __call__(self, chunks, **_):
            ids = [[(ord(c) % 200) + 3 for c in chunk] for chunk in chunks]
            return {"input_ids": ids, "offset_mapping": [[(i, i + 1) for i in range(len(c))] for c in chunks]}

    model = MODELS[name]()
    chunks = ["hello there", "a longer chunk of text"]
    score = score_text(model, Tok(), chunks, context_id=1)
    nats = 0.0
    with torch.no_grad():
        for ids in Tok()(chunks)["input_ids"]:
            batch = torch.tensor([[1, *ids]])
            logits = model(input_ids=batch).logits[0, :-1].float()
            nats += float(F.cross_entropy(logits, batch[0, 1:], reduction="sum"))
    assert score.nats == pytest.approx(nats, rel=1e-4)


class _ShiftedLlama:
    """A model whose forward adds a per-token bias its config does not describe."""

    @staticmethod
    def build():
        from transformers import LlamaForCausalLM

        base = _tiny("llama", tie_word_embeddings=False)

        class Shifted(LlamaForCausalLM):
            def forward(self, *args, **kwargs):
                out = super().forward(*args, **kwargs)
                out.logits = out.logits + torch.linspace(0, 5, out.logits.shape[-1])
                return out

        model = Shifted(base.config).eval()
        model.load_state_dict(base.state_dict())
        return model


def test_a_head_that_cannot_be_reproduced_is_refused_with_the_reason():
    model = _ShiftedLlama.build()
    assert "differ" in head_mismatch(model, BASE_VOCAB)
    with pytest.raises(UnsupportedModelError, match="Shifted.*forward does more"):
        attach(model, BASE_VOCAB, _rows(model))


# -- Mamba (state-spaces mamba-*-hf) at bf16 compute: fp32 hidden states, a bf16 head -----------
def mamba_bf16():
    return _tiny("mamba").to(torch.bfloat16)


def test_mamba_keeps_fp32_hidden_states_under_its_bf16_head():
    model = mamba_bf16()
    with torch.no_grad():
        hidden = model.base_model(input_ids=_ids(), use_cache=False).last_hidden_state
    assert hidden.dtype == torch.float32 and model.get_output_embeddings().weight.dtype == torch.bfloat16


def test_mamba_at_bf16_is_evaluated_through_its_head():
    from extension.evaluation.scoring import Scorer

    model = mamba_bf16()
    scorer = Scorer(model, batch_tokens=256, logit_elements=1 << 16)
    sequences = [[1, *range(3, 40)], [1, *range(50, 70)]]
    with torch.inference_mode():
        scorer.check_head_path(sequences[0])
        assert scorer.use_head_path
        via_head = scorer.score(sequences, pad_id=1)
        scorer.use_head_path = False
        via_forward = scorer.score(sequences, pad_id=1)
    assert via_head == pytest.approx(via_forward, rel=1e-3)


def test_mamba_at_bf16_is_scored_for_selection():
    from extension.selection.scoring import score_text

    class Tok:
        def __call__(self, chunks, **_):
            ids = [[(ord(c) % 200) + 3 for c in chunk] for chunk in chunks]
            return {"input_ids": ids, "offset_mapping": [[(i, i + 1) for i in range(len(c))] for c in chunks]}

    model = mamba_bf16()
    score = score_text(model, Tok(), ["hello there"], context_id=1)
    batch = torch.tensor([[1, *Tok()(["hello there"])["input_ids"][0]]])
    with torch.no_grad():
        logits = model(input_ids=batch).logits[0, :-1].float()
    assert score.nats == pytest.approx(float(F.cross_entropy(logits, batch[0, 1:], reduction="sum")), rel=1e-3)


def test_mamba_at_bf16_trains_its_rows_against_its_own_loss():
    model = mamba_bf16()
    merged = copy.deepcopy(model)
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids, targets = _ids(), _ids(seed=5)
    loss = adapter.loss(adapter.hidden(ids), targets)
    loss.backward()
    assert adapter.input_rows.grad.abs().max() > 0
    adapter.merge(into=merged)
    with torch.no_grad():
        own = merged(input_ids=ids).logits[..., : BASE_VOCAB + NEW].float()
    reference = F.cross_entropy(own.reshape(-1, own.shape[-1]), targets.reshape(-1))
    assert float(loss) == pytest.approx(float(reference), rel=1e-2)


def test_a_softcap_the_config_will_not_set_to_none_is_still_turned_off_and_restored():
    """Gemma 3n's config validates final_logit_softcapping as a float (huggingface_hub's strict
    dataclass error, neither ValueError nor TypeError); before, disable_in raised it and every
    trained Gemma 3n job crashed (issue 40 item 1)."""
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    config = Gemma3nTextConfig(vocab_size=256, vocab_size_per_layer_input=256, hidden_size=32,
                               hidden_size_per_layer_input=4, num_hidden_layers=2, intermediate_size=[64, 64],
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0,
                               laurel_rank=4, altup_num_inputs=2, final_logit_softcapping=3.0)
    torch.manual_seed(0)
    model = Gemma3nForCausalLM(config).eval()
    transform = LogitTransform.from_model(model)
    assert transform.softcap == 3.0
    saved = transform.disable_in(model)
    assert model.config.final_logit_softcapping is None
    ids = torch.tensor([[1, 5, 9, 17]])
    with torch.no_grad():
        raw = model(ids).logits
        LogitTransform.restore(saved)
        capped = model(ids).logits
    assert model.config.final_logit_softcapping == 3.0
    torch.testing.assert_close(capped, transform(raw))
