"""The peer systems of the quality benchmark (benchmarks/quality.py), built the way their own
documentation says, plus the one training loop every trained peer shares.

    hf_add_tokens        tokenizer.add_tokens(terms) + resize_token_embeddings(mean_resizing=True)
                         (untrained: what the transformers docs recommend for new tokens)
    subword_mean         TIDE's extended tokenizer + subword-mean rows, untrained
    trainable_tokens     PEFT TrainableTokens over the new ids of the subword-mean model, trained
    full_embedding       the subword-mean model with its whole embedding (tied: + head) trained

The trained peers see exactly the batches TIDE's own training sees (`batches(step)`), the same
optimizer settings (AdamW, the embedding learning rate lr x multiplier, weight decay 0, the same
warmup + cosine schedule and gradient clipping), and are evaluated after merging, like ours.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from extension.rows.init import apply_rows, subword_mean_rows
from extension.training.loop import TrainConfig


def hf_add_tokens(model, tokenizer, terms: list[str]) -> tuple[object, list[int]]:
    """The transformers recipe. Returns (tokenizer, new ids); `model` is resized in place."""
    base_size = len(tokenizer)
    tokenizer.add_tokens(list(terms))
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return tokenizer, list(range(base_size, len(tokenizer)))


def subword_mean(model, extended, *, pad_to_multiple_of: int = 64) -> dict:
    """Resize `model` for the extended tokenizer and write the subword-mean rows (in place)."""
    rows = subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size)
    return apply_rows(model, rows, base_vocab_size=extended.base_vocab_size, pad_to_multiple_of=pad_to_multiple_of)


def train_with_logits(
    model,
    params: list[torch.nn.Parameter],
    batches: Callable[[int], torch.Tensor],
    config: TrainConfig,
) -> list[dict]:
    """Plain training: HF forward over full logits, next-token cross-entropy, AdamW on `params`.

    Every trained parameter is an embedding row, so all get TIDE's embedding learning rate
    (lr x embedding_lr_multiplier) and weight decay 0, with TIDE's schedule and clipping.
    A parameter stored in less than fp32 (a bf16 model) trains on an fp32 master copy, written
    back after each step: the forward computes in the model's dtype, the update is kept in fp32,
    as TIDE's own new rows are (bf16 weights drop updates smaller than their 8-bit mantissa).
    """
    torch.manual_seed(config.seed)
    masters = [p.detach().float().clone().requires_grad_(True) if p.dtype != torch.float32 else p for p in params]
    optimizer = torch.optim.AdamW(masters, lr=config.lr, betas=config.betas, eps=1e-8, weight_decay=config.weight_decay)
    history = []
    model.train()
    for step in range(config.steps):
        began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step) * config.embedding_lr_multiplier
        window = batches(step)
        logits = model(input_ids=window[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        for param in params:
            param.grad = None
        loss.backward()
        for param, master in zip(params, masters):
            if master is not param:
                master.grad = None if param.grad is None else param.grad.float()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(masters, config.grad_clip)
        optimizer.step()
        with torch.no_grad():
            for param, master in zip(params, masters):
                if master is not param:
                    param.copy_(master)
        history.append({"step": step + 1, "loss": float(loss.detach()), "seconds": time.perf_counter() - began})
    model.eval()
    return history


def trainable_tokens(model, new_ids: list[int], batches, config: TrainConfig) -> tuple[object, list[dict], list[str]]:
    """PEFT TrainableTokens on the new ids; returns (merged plain model, history, PEFT's warnings)."""
    from peft import TrainableTokensConfig, get_peft_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = get_peft_model(model, TrainableTokensConfig(target_modules=["embed_tokens"], token_indices=list(new_ids)))
    params = [p for p in peft_model.parameters() if p.requires_grad]
    history = train_with_logits(peft_model, params, batches, config)
    merged = peft_model.merge_and_unload()
    return merged, history, sorted({str(w.message).split("\n")[0] for w in caught})


def full_embedding(model, batches, config: TrainConfig) -> list[dict]:
    """Train the whole embedding matrix (tied models: the head is the same matrix) in place."""
    model.requires_grad_(False)
    weight = model.get_input_embeddings().weight
    weight.requires_grad_(True)
    params = [weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != weight.data_ptr():
        head.weight.requires_grad_(True)
        params.append(head.weight)
    history = train_with_logits(model, params, batches, config)
    model.requires_grad_(False)
    return history
