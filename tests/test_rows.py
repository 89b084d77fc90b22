"""The incremental-rows adapter on tiny random models: tied, untied, untied with a head bias,
Gemma's scaled embeddings and GPT-2's position embeddings."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from extension.rows.init import NewRows, is_tied
from extension.rows.adapter import IGNORE_INDEX, attach

from .conftest import random_rows, tiny_gemma3, tiny_gpt2, tiny_llama

BASE_VOCAB = 240  # the tiny models have 256 rows: rows past the base vocab get overwritten
NEW = 9


def _untied_with_bias():
    model = tiny_llama(tied=False)
    head = nn.Linear(32, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.normal_(0, 0.5)
    model.lm_head = head
    return model


def _gemma_softcap():
    model = tiny_gemma3()
    model.config.final_logit_softcapping = 3.0
    return model


MODELS = {
    "llama_tied": lambda: tiny_llama(tied=True),
    "llama_untied": lambda: tiny_llama(tied=False),
    "llama_untied_bias": _untied_with_bias,
    "gemma3_scaled": tiny_gemma3,
    "gemma3_softcap": _gemma_softcap,
    "gpt2": tiny_gpt2,
}


def _rows(model, seed=3) -> NewRows:
    return random_rows(model, NEW, seed)


def _ids(seed=4, shape=(2, 16)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, BASE_VOCAB + NEW, shape, generator=g)
    ids[:, 3] = BASE_VOCAB + torch.arange(shape[0])  # new ids certainly present
    return ids


@pytest.mark.parametrize("name", MODELS)
def test_parameters_are_only_the_new_rows(name):
    model = MODELS[name]()
    adapter = attach(model, BASE_VOCAB, _rows(model))
    shapes = [tuple(p.shape) for p in adapter.parameters()]
    d = model.get_input_embeddings().weight.shape[1]
    expected = {"llama_untied": [(NEW, d)] * 2, "llama_untied_bias": [(NEW, d), (NEW, d), (NEW,)]}
    assert shapes == expected.get(name, [(NEW, d)])  # tied: ONE matrix for lookup and output
    assert all(not p.requires_grad for p in adapter.model.parameters() if p not in set(adapter.parameters()))
    assert all(p.dtype == torch.float32 for p in adapter.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_fused_loss_and_gradients_match_plain_autograd(name):
    model = MODELS[name]()
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids = _ids()
    targets = _ids(seed=5)
    targets[0, :4] = IGNORE_INDEX
    # tiny chunks: several chunks, one of them all-ignored
    loss = adapter.loss(adapter.hidden(ids), targets, chunk_elements=2 * (BASE_VOCAB + NEW))
    loss.backward()
    fused = [p.grad.clone() for p in adapter.parameters()]
    for p in adapter.parameters():
        p.grad = None
    logits = adapter.logits(adapter.hidden(ids))[..., : BASE_VOCAB + NEW]
    reference = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    reference.backward()
    assert torch.allclose(loss, reference, atol=1e-6, rtol=1e-6)
    for got, p in zip(fused, adapter.parameters()):
        assert p.grad.abs().max() > 0
        assert torch.allclose(got, p.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_merged_model_gives_the_adapter_logits(name):
    model = MODELS[name]()
    frozen = copy.deepcopy(model.state_dict())
    tied_before = is_tied(model)
    adapter = attach(model, BASE_VOCAB, _rows(model))
    with torch.no_grad():  # train-like change so the merge writes something other than the init
        adapter.input_rows.add_(0.1)
    ids = _ids()
    with torch.no_grad():
        via_model = model(input_ids=ids).logits
        via_adapter = adapter.logits(adapter.hidden(ids))
    # softcap model too: capped before the padding, so its padding columns stay -inf
    assert torch.equal(via_model, via_adapter)
    real = BASE_VOCAB + NEW
    assert via_adapter.shape[-1] == adapter.vocab_size == 256
    assert torch.isneginf(via_adapter[..., real:]).all()

    report = adapter.merge()
    assert report["vocab_size"] == 256 and report["padding_ids"] == list(range(real, 256))
    assert is_tied(model) == tied_before
    assert getattr(model.config, "final_logit_softcapping", None) == (3.0 if name == "gemma3_softcap" else None)
    with torch.no_grad():
        merged = model(input_ids=ids).logits.float()
    assert torch.allclose(merged[..., :real], via_adapter[..., :real], atol=1e-5, rtol=0)
    # old rows and every other parameter bit-identical, dtype kept
    for key, value in model.state_dict().items():
        before = frozen[key]
        assert value.dtype == before.dtype
        if value.shape == before.shape and value.shape[:1] != (256,):
            assert torch.equal(value, before), key
        else:
            assert torch.equal(value[:BASE_VOCAB], before[:BASE_VOCAB]), key


def test_scaled_embedding_rows_go_through_the_models_own_scaling():
    model = tiny_gemma3()
    rows = _rows(model)
    adapter = attach(model, BASE_VOCAB, rows)
    new_ids = torch.arange(BASE_VOCAB, BASE_VOCAB + NEW).unsqueeze(0)
    got = model.get_input_embeddings()(new_ids)[0]
    scale = model.config.hidden_size**0.5
    assert torch.allclose(got, rows.input * scale, rtol=1e-6, atol=0)
    old = model.get_input_embeddings()(torch.tensor([[0, 7]]))[0]
    assert torch.equal(old, adapter.model.model.embed_tokens.base(torch.tensor([0, 7])))


def test_padding_idx_does_not_freeze_a_new_row():
    model = tiny_gemma3()  # pad_token_id 0 -> padding_idx 0 on the base embedding
    assert model.get_input_embeddings().padding_idx == 0
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids = torch.full((1, 4), BASE_VOCAB)  # the first new row, index 0 of the small matrix
    adapter.hidden(ids).sum().backward()
    assert adapter.input_rows.grad[0].abs().sum() > 0


class _EveryAllocation(TorchDispatchMode):
    """Records (numel, op, shape) of every tensor an op creates: forward, loss and backward alike.
    Outputs that share an input's storage (views, in-place results) are not new allocations."""

    def __init__(self):
        super().__init__()
        self.created: list[tuple[int, str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.created.append((t.numel(), str(func), tuple(t.shape)))
        return out


def _peak_live_cpu_bytes(trace: Path) -> int:
    """Most bytes held at once by allocations made inside a profiled region (Kineto's memory events)."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e["ts"]):
        if event["args"]["Device Type"] == 0:  # CPU
            live += event["args"]["Bytes"]
            peak = max(peak, live)
    return peak


def test_no_full_size_tensor_is_built_or_saved_for_backward(tmp_path):
    vocab, hidden_size, base_vocab = 16384, 32, 16000
    model = tiny_llama(vocab_size=vocab, tied=True)
    adapter = attach(model, base_vocab, NewRows(input=torch.randn(NEW, hidden_size)))
    ids = torch.randint(0, base_vocab + NEW, (2, 32), generator=torch.Generator().manual_seed(0))
    full_matrix = base_vocab * hidden_size  # a copy of the frozen embedding/head (512k elements)
    full_logits = ids.numel() * (base_vocab + NEW)  # [batch, seq, vocab] (1M elements)
    chunk_elements = 2 * vocab  # 2 positions a chunk: 32k-element logits, well under both
    limit = min(full_matrix, full_logits) // 4
    assert adapter.chunk_positions(chunk_elements) * (base_vocab + NEW) < limit // 3

    def step():
        loss = adapter.loss(adapter.hidden(ids), ids.roll(-1, 1), chunk_elements=chunk_elements)
        loss.backward()

    every = _EveryAllocation()
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with every, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    biggest = max(every.created)
    assert biggest[0] < limit, f"{biggest} is a full-size tensor (limit {limit} elements)"
    assert any("backward" in op for _, op, _ in every.created)  # the backward pass was seen too
    assert saved and max(saved) < limit
    assert model.get_input_embeddings().weight.grad is None
    assert adapter.input_rows.grad.abs().sum() > 0

    # nor do the chunks pile up: all allocations alive at the same moment stay under one full matrix
    trace = tmp_path / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    profiler.export_chrome_trace(str(trace))
    peak = _peak_live_cpu_bytes(trace)
    assert 0 < peak < full_matrix * 4, f"{peak} bytes alive at once; one full fp32 matrix is {full_matrix * 4}"


def test_detach_restores_the_model():
    model = tiny_llama(tied=False)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    adapter = attach(model, BASE_VOCAB, _rows(model))
    assert model.get_input_embeddings() is not embedding
    adapter.detach()
    assert model.get_input_embeddings() is embedding and model.get_output_embeddings() is head
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags


def test_rows_must_match_the_tying():
    tied, untied = tiny_llama(tied=True), tiny_llama(tied=False)
    with pytest.raises(ValueError, match="tied"):
        attach(tied, BASE_VOCAB, _rows(untied))
    with pytest.raises(ValueError, match="untied"):
        attach(untied, BASE_VOCAB, _rows(tied))


@pytest.mark.parametrize("name", ["llama_tied", "llama_untied_bias", "gemma3_softcap"])
def test_soft_target_loss_matches_plain_autograd(name):
    model = MODELS[name]()
    adapter = attach(model, BASE_VOCAB, _rows(model))
    ids = _ids()
    g = torch.Generator().manual_seed(6)
    target = torch.softmax(torch.randn(ids.numel(), BASE_VOCAB + NEW, generator=g) * 3, dim=1)
    target[5] = 0  # an unscored position

    def targets(start, end):
        return target[start:end, :BASE_VOCAB], target[start:end, BASE_VOCAB:]

    loss = adapter.soft_loss_sum(adapter.hidden(ids), targets, chunk_elements=5 * (BASE_VOCAB + NEW))
    loss.backward()
    fused = [p.grad.clone() for p in adapter.parameters()]
    for p in adapter.parameters():
        p.grad = None
    logits = adapter.logits(adapter.hidden(ids))[..., : BASE_VOCAB + NEW].reshape(-1, BASE_VOCAB + NEW)
    reference = -(target * torch.log_softmax(logits, dim=1)).sum()
    reference.backward()
    assert torch.allclose(loss, reference, rtol=1e-5)
    for got, p in zip(fused, adapter.parameters()):
        assert torch.allclose(got, p.grad, atol=1e-6, rtol=1e-5)
