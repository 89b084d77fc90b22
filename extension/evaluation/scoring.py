"""Scoring text in bits per byte, identically for every tokenizer.

Two tokenizers cut the same text into different numbers of tokens, so loss per token cannot
compare them; loss per UTF-8 byte can. Bits per byte = total next-token NLL / (ln 2 x bytes).

How text is scored, identically for every tokenizer:
- Each document is scored from its start, cut into chunks of at most `chunk_bytes` UTF-8 bytes.
  Cuts depend only on the text (never on tokens), so both tokenizers see exactly the same string
  per chunk. A cut goes just before the last whitespace in the window when there is one in its
  second half, so a word keeps its natural leading-space form (" word") in the next chunk;
  otherwise at the last character boundary.
- Every chunk is encoded without special tokens and scored after ONE context token: the
  tokenizer's BOS, or its EOS when it has no BOS (GPT-2 style document separator). The special
  tokens are base tokens, so the base and the extended tokenizer use the same context id, and the
  first token of each chunk is scored, under that same context, by both. No byte goes unscored.
- Tokens per byte and new-token usage count the tokens of the same chunks.

Big vocabularies: the full [batch, seq, vocab] logits are never built. The decoder's hidden
states are computed once per batch and the head + log-softmax run over slices of positions, in
fp32, sized so one slice holds about `logit_elements` floats. The forward runs in the model's own
dtype, on the model's device, with no gradient; each forward scores as many chunks as fit in
`batch_tokens` tokens (default: from the device, extension.plan.devices.eval_batch_tokens).

The base model's scores can be kept on disk (`score_cache`, extension/evaluation/score_cache.py): a second
job on the same base model and text reads them instead of scoring again. Models whose logits are not `head(decoder(x))` (transformed as the
model's config says: extension/rows/logits.py) are detected with one short comparison against the full forward, and then scored
through the full forward in small batches instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from ..plan.options import DEFAULTS
from ..rows.logits import head_logits

DEFAULT_CHUNK_BYTES = 1024
DEFAULT_LOGIT_ELEMENTS = 1 << 24  # 64 MB of fp32 logits per slice


# ---------------------------------------------------------------------------------------------
# Cutting text by bytes


def _cut(text: str, start: int, limit: int) -> int:
    """End index of the longest piece text[start:end] of at most `limit` UTF-8 bytes, moved back
    to just before the last whitespace when that keeps at least half the piece."""
    size = 0
    end = start
    while end < len(text):
        step = len(text[end].encode("utf-8"))
        if size + step > limit:
            break
        size += step
        end += 1
    if end == start:  # a limit below one character's bytes: still make progress
        return start + 1
    if end == len(text):
        return end
    floor = start + (end - start) // 2
    for index in range(end, floor, -1):
        if text[index].isspace() and not text[index - 1].isspace():
            return index
    return end


# No held-out document (validation or test) gives more than this share of the bytes scored. Without
# a cap the Perl manual's 32 KB of validation text were 4 documents (the largest 16.7 KB): the
# chunks' spread then says little about other text, and a selection that passed on validation
# scored +1.58% on the test split (quality_perl.md at commit 67282a4). Its test text, the first
# 20 KB of the split, was one manual page until the same cap applied there. An eighth keeps at
# least 8 documents wherever the split has them.
MAX_DOCUMENT_SHARE = 1 / 8


def document_cap(sizes: Sequence[int], max_bytes: int | None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int | None:
    """The most bytes one document (of these byte `sizes`, in order) gives to `max_bytes` of held-out
    text: MAX_DOCUMENT_SHARE of it, never under one chunk, so the text spans several documents
    where a few long ones would fill it. Where the documents are too few to fill `max_bytes` under
    that cap, the cap rises to the level that still fills it (as much text, as evenly spread as
    the documents allow). None: no cap is needed."""
    if max_bytes is None:
        return None
    cap = max(int(max_bytes * MAX_DOCUMENT_SHARE), chunk_bytes)
    if sum(min(size, cap) for size in sizes) >= max_bytes:
        return cap
    remaining, ordered = max_bytes, sorted(sizes)
    for index, size in enumerate(ordered):
        level = math.ceil(remaining / (len(ordered) - index))
        if size >= level:
            return max(cap, level)
        remaining -= size
    return None  # every document fits whole


def chunk_documents(documents: Iterable[str], chunk_bytes: int, max_bytes: int | None,
                    document_bytes: int | None = None) -> list[list[str]]:
    """The first `max_bytes` bytes of `documents` (each document's first `document_bytes` only,
    when given), each document cut into chunks by bytes.

    Returns one list of chunks per document used (the last one possibly truncated).
    """
    if chunk_bytes < 16:
        raise ValueError(f"chunk_bytes must be at least 16, got {chunk_bytes}")
    budget = math.inf if max_bytes is None else max_bytes
    result: list[list[str]] = []
    for document in documents:
        if budget <= 0:
            break
        if not document:
            continue
        if document_bytes is not None and len(document.encode("utf-8")) > document_bytes:
            document = document[: _cut(document, 0, document_bytes)]
        size = len(document.encode("utf-8"))
        if size > budget:  # the last document used: cut it, then stop
            document = document[: _cut(document, 0, int(budget))]
            size = budget
        budget -= size
        chunks: list[str] = []
        start = 0
        while start < len(document):
            end = _cut(document, start, chunk_bytes)
            chunks.append(document[start:end])
            start = end
        result.append(chunks)
    return result


# ---------------------------------------------------------------------------------------------
# Scoring


def context_token_id(tokenizer) -> int:
    """The one token every chunk is scored after: BOS, else EOS."""
    for candidate in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    raise ValueError(
        "the tokenizer has neither a BOS nor an EOS token, so chunks have no context token to be "
        "scored after; pass context_id= explicitly"
    )


@dataclass
class Scorer:
    """Summed next-token loss of token sequences, in batches of `batch_tokens`; through decoder +
    head with the logits computed in slices of `logit_elements` where that reproduces the
    model's own logits (`use_head_path`), else through the whole model. Public so the two paths
    can be compared; score_documents is the door the product uses."""

    model: torch.nn.Module
    batch_tokens: int
    logit_elements: int
    use_head_path: bool = True

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the model's own transform (Granite's scaling, Cohere's scale, Gemma's softcap), the
        # hidden states cast to the head's dtype as its forward does (Mamba: fp32 under bf16)
        return head_logits(self.model, hidden)

    def check_head_path(self, ids: list[int]) -> None:
        """Use decoder + head only when it reproduces the model's own logits on a short input."""
        sample = torch.tensor([ids[:16]], device=self.device)
        try:
            hidden = self.model.get_decoder()(input_ids=sample, use_cache=False).last_hidden_state
            mine = self._head_logits(hidden)
        except (AttributeError, TypeError):  # no decoder, or one without last_hidden_state
            self.use_head_path = False
            return
        reference = self.model(input_ids=sample, use_cache=False).logits.float()
        tolerance = 1e-3 if hidden.dtype == torch.float32 else 5e-2
        self.use_head_path = mine.shape == reference.shape and torch.allclose(
            mine.log_softmax(-1), reference.log_softmax(-1), rtol=tolerance, atol=tolerance
        )

    def _nll(self, batch: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-target NLL (nats, fp64) of the valid next-token targets of a right-padded batch.

        No attention mask is passed: with right padding a causal model's real positions never
        see the padding after them, and the unmasked causal path is the fastest one.
        """
        targets = batch[:, 1:][mask[:, 1:].bool()]
        if self.use_head_path:
            hidden = self.model.get_decoder()(input_ids=batch, use_cache=False).last_hidden_state
            hidden = hidden[:, :-1][mask[:, 1:].bool()]
            vocab = self.model.get_output_embeddings().weight.shape[0]
            rows = max(1, self.logit_elements // vocab)
            pieces = []
            for begin in range(0, hidden.shape[0], rows):
                logits = self._head_logits(hidden[begin : begin + rows])
                target = targets[begin : begin + rows]
                picked = logits.gather(1, target[:, None]).squeeze(1)
                pieces.append((torch.logsumexp(logits, dim=-1) - picked).double())
            return torch.cat(pieces)
        logits = self.model(input_ids=batch, use_cache=False).logits[:, :-1]
        logits = logits[mask[:, 1:].bool()].float()
        picked = logits.gather(1, targets[:, None]).squeeze(1)
        return (torch.logsumexp(logits, dim=-1) - picked).double()

    def batches(self, sequences: list[list[int]], vocab: int) -> Iterable[list[int]]:
        """Indices of sequences grouped longest first, each group within the token budget."""
        budget = self.batch_tokens
        if not self.use_head_path:  # full logits per batch: bound them too
            budget = max(1, min(budget, self.logit_elements // max(vocab, 1)))
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        group: list[int] = []
        for index in order:
            width = len(sequences[group[0]]) if group else len(sequences[index])
            if group and width * (len(group) + 1) > budget:
                yield group
                group = []
            group.append(index)
        if group:
            yield group

    def score(self, sequences: list[list[int]], pad_id: int, on_scored: Callable[[int], None] | None = None) -> list[float]:
        """Summed NLL (nats) of each sequence's tokens after its first (context) token.
        `on_scored(n)` hears after each batch how many sequences it held."""
        vocab = self.model.get_output_embeddings().weight.shape[0]
        totals = [0.0] * len(sequences)
        for group in self.batches(sequences, vocab):
            width = max(len(sequences[i]) for i in group)
            batch = torch.full((len(group), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, index in enumerate(group):
                batch[row, : len(sequences[index])] = torch.tensor(sequences[index])
                mask[row, : len(sequences[index])] = 1
            nll = self._nll(batch.to(self.device), mask.to(self.device)).cpu()
            lengths = [len(sequences[i]) - 1 for i in group]
            for index, part in zip(group, torch.split(nll, lengths)):
                totals[index] = float(part.sum())
            if on_scored is not None:
                on_scored(len(group))
        return totals


def score_documents(
    model,
    tokenizer,
    documents: Iterable[str],
    *,
    new_token_ids: Iterable[int] | None = None,
    max_bytes: int | None = DEFAULTS["eval_max_bytes"],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    batch_tokens: int | None = None,
    logit_elements: int = DEFAULT_LOGIT_ELEMENTS,
    context_id: int | None = None,
    on_scored: Callable[[int], None] | None = None,
    score_cache=None,
    document_bytes: int | None = None,
) -> dict | None:
    """Bits per byte, tokens per byte and new-token usage of one body of text (None if empty);
    each document gives at most `document_bytes` of it, when given.
    `on_scored(n)` hears how many more chunks are scored, batch by batch. With `score_cache` (a
    score_cache.ScoreCache of this model) and no `new_token_ids`, a result kept for the same token
    sequences is returned without running the model, and a new one is kept."""
    per_document = chunk_documents(documents, chunk_bytes, max_bytes, document_bytes)
    chunks = [chunk for doc in per_document for chunk in doc]
    if not chunks:
        return None
    context = context_token_id(tokenizer) if context_id is None else context_id
    encoded = tokenizer(chunks, add_special_tokens=False)["input_ids"]
    sequences = [[context, *ids] for ids in encoded]
    limit = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(s) for s in sequences)
    if limit is not None and longest > limit:
        raise ValueError(
            f"a {chunk_bytes}-byte chunk encodes to {longest} tokens, more than the model's "
            f"{limit} positions; lower chunk_bytes"
        )
    size = sum(len(chunk.encode("utf-8")) for chunk in chunks)
    cache_key = None
    if score_cache is not None and new_token_ids is None:
        cache_key = score_cache.key(sequences, bytes=size, documents=len(per_document), logit_elements=logit_elements)
        cached = score_cache.get(cache_key)
        if cached is not None:
            if on_scored is not None:
                on_scored(len(chunks))
            return cached
    if batch_tokens is None:
        from ..plan.devices import eval_batch_tokens

        batch_tokens = eval_batch_tokens(model)
    scorer = Scorer(model, batch_tokens=batch_tokens, logit_elements=logit_elements)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            scorer.check_head_path(max(sequences, key=len))
            nats = sum(scorer.score(sequences, pad_id=context, on_scored=on_scored))
    finally:
        model.train(was_training)
    tokens = sum(len(ids) for ids in encoded)
    result = {
        "bits_per_byte": nats / (math.log(2) * size),
        "tokens_per_byte": tokens / size,
        "bits_per_token": nats / (math.log(2) * tokens),
        "bytes": size,
        "tokens": tokens,
        "documents": len(per_document),
        "chunks": len(chunks),
        "new_tokens": None,
        "new_token_usage": None,
        "distinct_new_tokens_used": None,
    }
    if new_token_ids is not None:
        new = set(int(i) for i in new_token_ids)
        used = [i for ids in encoded for i in ids if i in new]
        result.update(new_tokens=len(used), new_token_usage=len(used) / tokens, distinct_new_tokens_used=len(set(used)))
    if cache_key is not None:
        score_cache.put(cache_key, result)
    return result
