"""The incremental-rows adapter: train new vocabulary rows while the base model stays frozen.

The new rows live in their own small parameters — tied models: ONE matrix that serves both the
lookup and the output; untied: an input matrix, an output matrix and, when the head has one, an
output bias. Nothing ever builds a full-size copy of the embedding or the head: old ids are looked
up in the frozen matrix and new ids in the small one, and old-token logits come from the frozen
head while new-token logits come from the small matrix.

The training loss (`RowsAdapter.loss`) is a fused, chunked cross-entropy: each chunk of positions
computes its logits, its loss and its gradients at once and frees the logits, so a 262k vocab
never needs the [batch, seq, vocab] logits in fp32 at once and the backward pass does no extra
matmul over the vocab.

`merge()` writes the trained rows into plain, resized weights with `init.apply_rows` (old rows
bit-identical in the base dtype, tied stays tied, vocab padded) for publishing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import per_layer
from .init import NewRows, apply_rows, is_tied, padded_vocab_size
from .logits import LogitTransform, check_head, text_decoder
from ..plan.options import DEFAULTS

IGNORE_INDEX = -100
# fp32 elements of one chunk of logits in the loss: 32M = 128 MB, a few hundred positions of a
# 262k vocab, the whole batch for a 50k vocab at batch 4 x seq 128.
DEFAULT_LOSS_CHUNK_ELEMENTS = 32 * 2**20


class _ExtendedEmbedding(nn.Module):
    """Input side: frozen base module for old ids, the new-rows matrix for new ids.

    The new rows go through the base module's OWN forward (its weight swapped for the small
    matrix), so whatever the model does inside its embedding — Gemma multiplies by sqrt(hidden) —
    applies to the new rows exactly as to the old ones.
    """

    def __init__(self, base: nn.Module, new_rows: nn.Parameter, base_vocab_size: int):
        super().__init__()
        self.base = base
        self.new_rows = new_rows
        self.base_vocab_size = base_vocab_size

    @property
    def weight(self) -> torch.Tensor:  # callers that read .weight for its dtype/device
        return self.base.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        is_new = input_ids >= self.base_vocab_size
        old = self.base(input_ids.clamp(max=self.base_vocab_size - 1))
        new = self._lookup_new((input_ids - self.base_vocab_size).clamp(min=0))
        return torch.where(is_new.unsqueeze(-1), new.to(old.dtype), old)

    def _lookup_new(self, new_index: torch.Tensor) -> torch.Tensor:
        # padding_idx refers to a base id; on the small matrix it would zero a new row's gradient.
        saved = getattr(self.base, "padding_idx", None)
        self.base.padding_idx = None
        try:
            return torch.func.functional_call(self.base, {"weight": self.new_rows}, (new_index,), strict=False)
        finally:
            self.base.padding_idx = saved


def _old_head_weight(head: nn.Module, base_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The frozen head's rows for the base vocabulary: a view, never a copy."""
    bias = getattr(head, "bias", None)
    return head.weight[:base_vocab_size], None if bias is None else bias[:base_vocab_size]


class ExtendedHead(nn.Module):
    """Output side for `model(input_ids)`: [old logits | new logits | -inf padding], in fp32,
    the model's logit transform (scale, softcap: logits.LogitTransform) applied before the padding."""

    def __init__(self, adapter: "RowsAdapter", base: nn.Module):
        super().__init__()
        self.base = base
        object.__setattr__(self, "_adapter", adapter)  # not a submodule: no parameter cycles

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._adapter.logits(hidden)


class _FusedRowsCrossEntropy(torch.autograd.Function):
    """Sum of next-token cross-entropy over [frozen old rows | new rows], chunk by chunk.

    Forward computes each chunk's gradients while its logits exist (d loss / d logits is
    softmax - target) and keeps only the small results: d hidden [N, d] and d new rows [n, d].
    The frozen matrix gets no gradient, so the backward costs exactly one matmul over the vocab,
    like any backward through a frozen head.

    `targets` is either token ids [N] (IGNORE_INDEX = unscored) or, for distillation, a function
    (start, end) -> (p_old [c, V], p_new [c, n]): a target distribution per position (rows that
    sum to 0 are unscored), built chunk by chunk so it is never full-size either.
    """

    @staticmethod
    def forward(ctx, hidden, targets, new_out, new_bias, old_weight, old_bias, chunk, transform: LogitTransform):
        need_hidden, need_new, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        soft = callable(targets)
        old_vocab = old_weight.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_new = torch.zeros_like(new_out) if need_new else None
        grad_bias = torch.zeros_like(new_bias) if need_bias else None
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk]
            if not soft:
                t = targets[start : start + chunk]
                valid = t != IGNORE_INDEX
                if not bool(valid.any()):
                    continue
            # old and new logits stay two contiguous tensors: no [chunk, vocab] concatenation copy
            # hidden states cast to the head's dtype, as Mamba's own forward does (fp32 states, bf16 head)
            parts = [F.linear(h.to(old_weight.dtype), old_weight, old_bias).float(), F.linear(h.float(), new_out, new_bias)]
            slopes = []
            scale, softcap = transform.scale, transform.softcap
            for z in parts:  # the model's own transform: scale (Granite, Cohere), then softcap (Gemma)
                if scale != 1.0:
                    z.mul_(scale)
                if softcap:
                    z.div_(softcap).tanh_()
                    slopes.append((1 - z.square()).mul_(scale))  # d/dz of cap*tanh(scale*z/cap)
                    z.mul_(softcap)
                elif scale != 1.0:
                    slopes.append(scale)
            if soft:
                p_old, p_new = targets(start, start + h.shape[0])
                mass = p_old.sum(1) + p_new.sum(1)
                taken = (p_old * parts[0]).sum() + (p_new * parts[1]).sum()
            else:
                is_new = t >= old_vocab
                old_t = torch.where(is_new | ~valid, 0, t)
                new_t = torch.where(is_new & valid, t - old_vocab, 0)
                picked = torch.where(
                    is_new,
                    parts[1].gather(1, new_t.unsqueeze(1)).squeeze(1),
                    parts[0].gather(1, old_t.unsqueeze(1)).squeeze(1),
                )
            # exp(z - max) once, in place: its row sums give the log-sum-exp and, divided by them, it is
            # the softmax the gradient needs (logsumexp, then exp again, took 3x as long on a CPU)
            top = parts[0].amax(1)
            if parts[1].shape[1]:
                top = torch.maximum(top, parts[1].amax(1))
            sums = sum(z.sub_(top.unsqueeze(1)).exp_().sum(1) for z in parts)
            lse = top + sums.log()
            total += (mass * lse).sum() - taken if soft else ((lse - picked) * valid).sum()
            if not (need_hidden or need_new or need_bias):
                continue
            grad_old, grad_rows = (z.div_(sums.unsqueeze(1)) for z in parts)  # softmax, in place
            if soft:
                grad_old.mul_(mass.unsqueeze(1)).sub_(p_old)
                grad_rows.mul_(mass.unsqueeze(1)).sub_(p_new)
            else:
                rows = torch.arange(h.shape[0], device=h.device)
                grad_old[rows, old_t] -= (~is_new).to(grad_old.dtype)
                grad_rows[rows, new_t] -= is_new.to(grad_rows.dtype)
                if not bool(valid.all()):  # one pass over [chunk, vocab]: only when something is ignored
                    weight = valid.to(torch.float32).unsqueeze(1)
                    grad_old.mul_(weight)
                    grad_rows.mul_(weight)
            if slopes:
                grad_old.mul_(slopes[0])
                grad_rows.mul_(slopes[1])
            if need_hidden:
                grad_hidden[start : start + chunk] = (
                    (grad_old.to(old_weight.dtype) @ old_weight).to(torch.float32) + grad_rows @ new_out
                ).to(hidden.dtype)
            if need_new:
                grad_new += grad_rows.T @ h.float()
            if need_bias:
                grad_bias += grad_rows.sum(0)
        ctx.save_for_backward(grad_hidden, grad_new, grad_bias)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_new, grad_bias = ctx.saved_tensors
        scale = grad_total
        return (
            None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
            None,
            None if grad_new is None else grad_new * scale,
            None if grad_bias is None else grad_bias * scale,
            None,
            None,
            None,
            None,
        )


class RowsAdapter(nn.Module):
    """New rows as trainable parameters around a frozen model. Build it with `attach`.

    While attached, `model(input_ids)` runs with the new ids (its logits cover the padded vocab,
    padding columns -inf); training code uses `hidden()` + `loss()`, which never materialise the
    full logits. `parameters()` yields only the new rows.
    """

    def __init__(self, model, base_vocab_size: int, rows: NewRows, *, pad_to_multiple_of: int = DEFAULTS["pad_to_multiple_of"]):
        super().__init__()
        tied = is_tied(model)
        if tied and rows.output is not None:
            raise ValueError("tied model: give one set of rows (NewRows.output=None); one row serves both sides")
        if not tied and rows.output is None:
            raise ValueError("untied model: NewRows.output is required (build rows with init.subword_mean_rows)")
        embedding = model.get_input_embeddings()
        if embedding.weight.shape[0] < base_vocab_size:
            raise ValueError(
                f"base_vocab_size {base_vocab_size} exceeds the model's {embedding.weight.shape[0]} embedding rows"
            )
        object.__setattr__(self, "model", model)  # held, not registered: parameters() = new rows only
        self.base_vocab_size = base_vocab_size
        self.num_new = len(rows)
        self.vocab_size = padded_vocab_size(
            base_vocab_size + self.num_new, embedding.weight.shape[0], pad_to_multiple_of
        )
        self.pad_to_multiple_of = pad_to_multiple_of
        # What the model's forward does to its head's output (Granite's logits_scaling, Cohere's
        # logit_scale, Gemma's softcap), checked on a probe batch: a head this cannot reproduce is
        # refused (errors.UnsupportedModelError) rather than trained against logits it never gives.
        self.transform = check_head(model, base_vocab_size)
        self._disabled: list = []
        # The new rows live with the matrices they extend: input rows with the embedding, untied
        # output rows with the head (a model spread over devices may hold the two on different GPUs).
        device = embedding.weight.device
        head_device = device if tied else model.get_output_embeddings().weight.device
        self.input_rows = nn.Parameter(rows.input.detach().to(device, torch.float32).clone())
        # Untied models only: the lm_head's own new rows. What the head scores with is `logit_rows`.
        self.output_rows = None if tied else nn.Parameter(rows.output.detach().to(head_device, torch.float32).clone())
        bias = rows.output_bias if not tied else None
        if bias is None and not tied and getattr(model.get_output_embeddings(), "bias", None) is not None:
            bias = torch.zeros(self.num_new)
        self.output_bias = None if bias is None else nn.Parameter(bias.detach().to(head_device, torch.float32).clone())
        # Gemma 3n: the new tokens' rows of the per-layer table, trained with the input rows (registered
        # last, so the other parameters keep their positions in checkpoints and optimizer states)
        table = per_layer.per_layer_table(model)
        if table is not None and rows.per_layer is None:
            raise ValueError("this model has a per-layer embedding table: NewRows.per_layer is required "
                             "(build rows with init.subword_mean_rows)")
        self.per_layer_rows = None if table is None else nn.Parameter(
            rows.per_layer.detach().to(table.weight.device, torch.float32).clone())
        self._restore_per_layer = None
        self._requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        self._original: tuple[nn.Module, nn.Module] | None = None

    @property
    def softcap(self) -> float | None:
        return self.transform.softcap

    @property
    def tied(self) -> bool:
        return self.output_rows is None

    @property
    def logit_rows(self) -> nn.Parameter:
        """The rows the new tokens' logits come from: the shared `input_rows` when tied, the
        untied model's own `output_rows` (None when tied) otherwise."""
        return self.input_rows if self.tied else self.output_rows

    # -- attaching ---------------------------------------------------------------------------
    def _install(self) -> None:
        model = self.model
        for p in model.parameters():
            p.requires_grad_(False)
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        self._original = (embedding, head)
        model.set_input_embeddings(_ExtendedEmbedding(embedding, self.input_rows, self.base_vocab_size))
        model.set_output_embeddings(ExtendedHead(self, head))
        if self.per_layer_rows is not None:
            self._restore_per_layer = per_layer.install(model, self.per_layer_rows, self.base_vocab_size)
        # The model transforms whatever its head returns, and tanh is bounded: the -inf padding
        # columns would come out as -cap, a real share of the softmax. While attached the head
        # applies the whole transform before it pads, and the model's own is off.
        self._disabled = self.transform.disable_in(model)

    def detach(self) -> None:
        """Put the model's own modules back; the rows stay in this adapter."""
        if self._original is None:
            return
        embedding, head = self._original
        self.model.set_input_embeddings(embedding)
        self.model.set_output_embeddings(head)
        if self._restore_per_layer is not None:
            self._restore_per_layer()
            self._restore_per_layer = None
        LogitTransform.restore(self._disabled)
        self._disabled = []
        self._original = None
        for name, p in self.model.named_parameters():
            p.requires_grad_(self._requires_grad.get(name, p.requires_grad))

    @property
    def _base_head(self) -> nn.Module:
        return self._original[1] if self._original else self.model.get_output_embeddings()

    # -- forward pieces ----------------------------------------------------------------------
    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [B, T, d] (after the final norm), the head's input."""
        out = text_decoder(self.model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full logits over the padded vocab, fp32, capped like the model's, padding columns -inf.
        For eval and tests."""
        old_weight, old_bias = _old_head_weight(self._base_head, self.base_vocab_size)
        hidden = hidden.to(old_weight.device)
        parts = [
            F.linear(hidden.to(old_weight.dtype), old_weight, old_bias).float(),
            F.linear(hidden.float(), self.logit_rows, self.output_bias),
        ]
        logits = self.transform(torch.cat(parts, dim=-1))
        padding = self.vocab_size - logits.shape[-1]
        if padding:
            logits = F.pad(logits, (0, padding), value=float("-inf"))
        return logits

    def loss_sum(
        self, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_elements: int = DEFAULT_LOSS_CHUNK_ELEMENTS
    ) -> tuple[torch.Tensor, int]:
        """(summed cross-entropy, number of scored targets). targets[b, t] is the token after
        position t (already shifted), IGNORE_INDEX where unscored."""
        old_weight, old_bias = _old_head_weight(self._base_head, self.base_vocab_size)
        hidden2d = hidden.reshape(-1, hidden.shape[-1]).to(old_weight.device)  # a spread model: the head's device
        targets1d = targets.reshape(-1).to(old_weight.device)
        count = int((targets1d != IGNORE_INDEX).sum())
        chunk = self.chunk_positions(chunk_elements)
        total = _FusedRowsCrossEntropy.apply(
            hidden2d, targets1d, self.logit_rows, self.output_bias, old_weight, old_bias, chunk, self.transform
        )
        return total, count

    def soft_loss_sum(self, hidden: torch.Tensor, targets, *, chunk_elements: int = DEFAULT_LOSS_CHUNK_ELEMENTS) -> torch.Tensor:
        """Summed cross-entropy against target distributions: `targets(start, end)` gives
        (p_old [c, base_vocab], p_new [c, num_new]) for flattened positions start..end."""
        old_weight, old_bias = _old_head_weight(self._base_head, self.base_vocab_size)
        hidden2d = hidden.reshape(-1, hidden.shape[-1]).to(old_weight.device)
        chunk = self.chunk_positions(chunk_elements)
        return _FusedRowsCrossEntropy.apply(
            hidden2d, targets, self.logit_rows, self.output_bias, old_weight, old_bias, chunk, self.transform
        )

    def chunk_positions(self, chunk_elements: int = DEFAULT_LOSS_CHUNK_ELEMENTS) -> int:
        return max(1, chunk_elements // (self.base_vocab_size + self.num_new))

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor, **kwargs) -> torch.Tensor:
        total, count = self.loss_sum(hidden, targets, **kwargs)
        return total / max(count, 1)

    # -- results -----------------------------------------------------------------------------
    def rows(self) -> NewRows:
        """The current rows, fp32 copies on the CPU."""
        def copy(t):
            return None if t is None else t.detach().float().cpu().clone()

        return NewRows(input=copy(self.input_rows), output=copy(self.output_rows), output_bias=copy(self.output_bias),
                       per_layer=copy(self.per_layer_rows))

    def merge(self, into=None, **apply_kwargs) -> dict:
        """Detach, then write the trained rows into plain, resized weights.

        `into` defaults to the attached model; pass another model (e.g. one loaded in the
        checkpoint's dtype for publishing) to write the rows there instead. Returns init.apply_rows's report; the model
        is then a plain HF model with `vocab_size` rows, ready for save_pretrained.
        """
        self.detach()
        return apply_rows(
            self.model if into is None else into,
            self.rows(),
            base_vocab_size=self.base_vocab_size,
            pad_to_multiple_of=self.pad_to_multiple_of,
            **apply_kwargs,
        )


def attach(model, base_vocab_size: int, rows: NewRows, *, pad_to_multiple_of: int = DEFAULTS["pad_to_multiple_of"]) -> RowsAdapter:
    """Freeze `model` and route ids >= base_vocab_size to trainable new rows initialised to `rows`."""
    adapter = RowsAdapter(model, base_vocab_size, rows, pad_to_multiple_of=pad_to_multiple_of)
    adapter._install()
    return adapter
