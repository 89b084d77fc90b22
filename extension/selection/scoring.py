"""Per-token losses of a text, kept per token (with where each token ends) so that two
tokenizations of the same text can be compared piece by piece (attribution.py).

The text is scored exactly as extension.evaluation.metrics scores it — the same byte-cut chunks, each
after the one context token — so bits per byte here and in the job's report mean the same. The
model is either plain or has new rows attached (extension.rows.adapter): both give their logits through
`get_output_embeddings()` (the attached head pads and soft-caps itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..rows.adapter import ExtendedHead
from ..rows.logits import head_logits, text_decoder

POSITIONS_PER_SLICE = 256  # [positions, vocab] fp32 logits at a time (262k vocab: 256 MB)
BATCH_TOKENS = 4096


@dataclass
class ChunkScore:
    ids: list[int]  # the chunk's tokens (the context token excluded)
    ends: list[int]  # character offset in the chunk where each token ends
    nll: torch.Tensor  # float64 [len(ids)], nats, each token given the ones before it
    # float64 [len(ids)]: the nll had the new tokens that are not the answer taken no probability
    # (every new token's cost elsewhere is its leak, so regions must not count it again)
    own_nll: torch.Tensor | None = None


@dataclass
class TextScore:
    chunks: list[ChunkScore]
    bytes: int
    # Per new token (index = id - first new id): summed -log(1 - p(token)) over the positions
    # whose target is another token: what it costs where it is not the answer. None for the base.
    leak: torch.Tensor | None = None

    @property
    def nats(self) -> float:
        return float(sum(float(chunk.nll.sum()) for chunk in self.chunks))

    @property
    def bits_per_byte(self) -> float:
        return self.nats / (math.log(2) * self.bytes) if self.bytes else float("nan")

    @property
    def tokens(self) -> int:
        return sum(len(chunk.ids) for chunk in self.chunks)


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits: rows attached, its head returns them finished (its own transform is
    off meanwhile); plain, the head's output gets the model's transform (scale, softcap), the
    hidden states cast to the head's dtype first, as the model's forward does."""
    head = model.get_output_embeddings()
    if isinstance(head, ExtendedHead):
        return head(hidden).float()
    return head_logits(model, hidden, head)


def score_text(model, tokenizer, chunks: list[str], *, context_id: int, first_new_id: int | None = None,
               num_new: int = 0) -> TextScore:
    """Score `chunks` (strings) with `model` reading `tokenizer`'s ids. With `first_new_id` and
    `num_new`, also each new token's leak (see TextScore)."""
    encoded = tokenizer(chunks, add_special_tokens=False, return_offsets_mapping=True)
    sequences = [[context_id, *ids] for ids in encoded["input_ids"]]
    device = model.get_input_embeddings().weight.device
    leak = torch.zeros(num_new, dtype=torch.float64) if num_new else None
    nlls: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(sequences)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for group in _groups(sequences):
                width = max(len(sequences[i]) for i in group)
                batch = torch.full((len(group), width), context_id, dtype=torch.long)
                for row, index in enumerate(group):
                    batch[row, : len(sequences[index])] = torch.tensor(sequences[index])
                # right padding needs no mask: a causal model's real positions never see it
                hidden = text_decoder(model)(input_ids=batch.to(device), use_cache=False).last_hidden_state
                for row, index in enumerate(group):
                    targets = batch[row, 1 : len(sequences[index])].to(device)
                    nlls[index] = _score_row(model, hidden[row, : len(targets)], targets, first_new_id, num_new, leak)
    finally:
        model.train(was_training)
    scored = [
        ChunkScore(ids=list(ids), ends=[end for _start, end in offsets], nll=nll, own_nll=own)
        for ids, offsets, (nll, own) in zip(encoded["input_ids"], encoded["offset_mapping"], nlls)
    ]
    size = sum(len(chunk.encode("utf-8")) for chunk in chunks)
    return TextScore(chunks=scored, bytes=size, leak=leak)


def _score_row(model, hidden, targets, first_new_id, num_new, leak) -> tuple[torch.Tensor, torch.Tensor]:
    pieces, own = [], []
    for begin in range(0, len(targets), POSITIONS_PER_SLICE):
        log_probs = torch.log_softmax(_logits(model, hidden[begin : begin + POSITIONS_PER_SLICE]), dim=-1)
        target = targets[begin : begin + POSITIONS_PER_SLICE]
        nll = -log_probs.gather(1, target[:, None])[:, 0].double().cpu()
        pieces.append(nll)
        if not num_new:
            own.append(nll)
            continue
        p_new = log_probs[:, first_new_id : first_new_id + num_new].exp().double()
        is_answer = (target[:, None] - first_new_id) == torch.arange(num_new, device=target.device)
        elsewhere = p_new.masked_fill(is_answer, 0)
        leak += (-torch.log1p(-elsewhere.clamp(max=1 - 1e-12))).sum(0).cpu()
        own.append(nll + torch.log1p(-elsewhere.sum(1).clamp(max=1 - 1e-12)).cpu())
    empty = torch.zeros(0, dtype=torch.float64)
    return (torch.cat(pieces) if pieces else empty), (torch.cat(own) if own else empty)


def _groups(sequences: list[list[int]]):
    """Indices of sequences, longest first, grouped within BATCH_TOKENS."""
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    group: list[int] = []
    for index in order:
        width = len(sequences[group[0]]) if group else len(sequences[index])
        if group and width * (len(group) + 1) > BATCH_TOKENS:
            yield group
            group = []
        group.append(index)
    if group:
        yield group
