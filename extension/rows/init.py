"""Initial values of the new embedding rows, and writing rows into a resized model.

Two ways to start a new row from the base rows of the token's ORIGINAL pieces (option `init`):
  composition   (the default) composed from its pieces the way the base vocabulary composes its
                own merges (extension/rows/composition.py): a regression fitted on the base merges
  subword_mean  the mean of the pieces' rows
  subword_mean_norm  that mean rescaled to the mean norm of its pieces' rows (averaging vectors that
                point different ways shortens them; NVIDIA's Nemotron tokenizer-extension recipe
                corrects the norm so the new row reads with the weight of a real one)
'distill' (extension/training/input_distillation.py) starts from the composition and distils the input
rows before training; 'subword_mean_distill' starts from the mean and distils the input rows with
each row's logits held where the mean put them (a terms-only job that takes no training step).
Input rows come from the input matrix and, for untied models, output rows from the lm_head,
separately (the head's bias, when it has one, is always the mean). Models that scale embeddings
inside their forward (Gemma multiplies by sqrt(hidden)) store unscaled rows, so both work on
stored rows and the scaled inputs follow. Tokenizers without merges (WordPiece, Unigram) have
nothing to learn a composition from: their rows are subword means, and the report says why.

The vocabulary is padded to a multiple of 64 by default. Padding rows are never produced by the
tokenizer, but runtimes sample from every row: each padding row is set to the mean real output
row (see `_place_padding_rows` for why that bounds its probability), and the padding ids are
listed in generation_config.suppress_tokens for runtimes that honour it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from ..plan.options import DEFAULTS
from . import per_layer

# Total probability of all padding rows must stay below this at every position (issue 2).
PADDING_PROBABILITY_LIMIT = 1e-4


@dataclass
class NewRows:
    """The values of the new rows (fp32). `output` is None for tied models: one set serves both.
    `per_layer`: Gemma 3n's per-layer embedding rows (rows/per_layer.py), None for other models."""

    input: torch.Tensor
    output: torch.Tensor | None = None
    output_bias: torch.Tensor | None = None
    per_layer: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input.shape[0]


def is_tied(model) -> bool:
    head = model.get_output_embeddings()
    if head is None:
        return True
    return head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def subword_mean_rows(model, new_tokens: Sequence, base_vocab_size: int) -> NewRows:
    """Mean of the base rows of each new token's original pieces (`NewToken.base_ids`)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = is_tied(model)
    index, owner = _piece_index(new_tokens, base_vocab_size)

    def means(matrix: torch.Tensor) -> torch.Tensor:
        picked = matrix.detach()[index.to(matrix.device)].float().cpu()  # the rows are kept on the CPU, in fp32
        summed = torch.zeros(len(new_tokens), *picked.shape[1:], dtype=torch.float32)
        summed.index_add_(0, owner, picked)
        counts = torch.bincount(owner, minlength=len(new_tokens)).clamp(min=1).float()
        return summed / counts.view(-1, *([1] * (picked.dim() - 1)))

    # Gemma 3n: the per-layer table starts the same way, from its own rows (None for other models)
    rows = NewRows(input=means(embedding), per_layer=per_layer.mean_rows(model, new_tokens))
    if not tied:
        rows.output = means(head.weight)
        if getattr(head, "bias", None) is not None:
            rows.output_bias = means(head.bias)
    return rows


INIT_METHODS = ("composition", "subword_mean", "subword_mean_norm")


def init_method(asked: str, steps: int, *, corpus: bool) -> str:
    """The method option `init` names: 'auto' is 'distill' for a trained corpus job (measured on
    Spanish and FOLDOC, docs/measured.md), composition for a trained terms-only job, the mean with
    its input side distilled for a terms-only job of 0 steps (docs/measured.md, terms-only
    training), the mean for a corpus job of 0 steps."""
    if asked == "auto":
        if steps > 0:
            return "distill" if corpus else "composition"
        return "subword_mean" if corpus else "subword_mean_distill"
    return asked


# init methods that distil the input rows on the job's texts (training/input_distillation.py),
# each from the rows it starts at
DISTILLED_STARTS = {"distill": "composition", "subword_mean_distill": "subword_mean"}


def row_method(method: str) -> str:
    """Where `method`'s rows start: the distilling methods distil those rows later, on the job's data."""
    return DISTILLED_STARTS.get(method, method)


def norm_corrected(means: torch.Tensor, matrix: torch.Tensor, new_tokens: Sequence, base_vocab_size: int) -> torch.Tensor:
    """`means` (one row per new token) rescaled to the mean norm of each token's pieces' rows."""
    index, owner = _piece_index(new_tokens, base_vocab_size)
    norms = matrix.detach()[index.to(matrix.device)].float().norm(dim=1).cpu()
    target = torch.zeros(len(new_tokens)).index_add_(0, owner, norms)
    target /= torch.bincount(owner, minlength=len(new_tokens)).clamp(min=1).float()
    return means * (target / means.norm(dim=1).clamp(min=1e-12)).unsqueeze(1)


class RowInitializer:
    """Initial rows for any extension of one base model: fitted once per job (the composition
    takes a few CPU-seconds), then called for the job's tokenizer and for every tokenizer term
    selection rebuilds."""

    def __init__(self, model, base_tokenizer, method: str = "composition"):
        from .composition import base_merge_ids, fit_composition

        if method not in INIT_METHODS:
            raise ValueError(f"init method {method!r} is not one of {', '.join(INIT_METHODS)}")
        self.method, self.fallback_reason = method, None
        self.base_vocab: dict[str, int] = base_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
        self.per_layer = per_layer.per_layer_table(model) is not None
        self.fits: dict[str, object] = {}
        if method != "composition":
            return
        merges = base_merge_ids(base_tokenizer)
        matrices = {"input": model.get_input_embeddings().weight}
        if not is_tied(model):
            matrices["output"] = model.get_output_embeddings().weight
        for side, matrix in matrices.items():
            fit, why_not = fit_composition(matrix, merges)
            if fit is None:
                self.method, self.fits = "subword_mean", {}
                self.fallback_reason = f"{why_not}; the new rows start at the subword mean"
                return
            self.fits[side] = fit

    def __call__(self, model, extended) -> NewRows:
        rows = subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size)
        if self.method == "subword_mean_norm":
            rows.input = norm_corrected(rows.input, model.get_input_embeddings().weight, extended.new_tokens,
                                        extended.base_vocab_size)
            if rows.output is not None:
                rows.output = norm_corrected(rows.output, model.get_output_embeddings().weight, extended.new_tokens,
                                             extended.base_vocab_size)
            if rows.per_layer is not None:
                rows.per_layer = per_layer.mean_rows(model, extended.new_tokens, norm_corrected=True)
        if self.method == "composition":
            from .composition import composed_rows

            matrices = {"input": model.get_input_embeddings().weight, "output": model.get_output_embeddings().weight}
            for side, fit in self.fits.items():
                composed = composed_rows(matrices[side], fit, extended.new_tokens, extended.merges, self.base_vocab)
                setattr(rows, side, composed)
        return rows

    def report(self) -> dict:
        """What tide_extension.json records as "init"."""
        report: dict = {"method": self.method}
        if self.fallback_reason:
            report["asked"], report["fallback_reason"] = "composition", self.fallback_reason
        for side, fit in self.fits.items():
            report[side] = fit.report()
        if self.per_layer:
            # no composition is fitted on the per-layer table: its rows start at their pieces' mean
            report["per_layer"] = "subword_mean_norm" if self.method == "subword_mean_norm" else "subword_mean"
        return report


def _piece_index(new_tokens: Sequence, base_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids: list[int] = []
    owners: list[int] = []
    for position, token in enumerate(new_tokens):
        if not token.base_ids:
            raise ValueError(f"new token {token.token!r} has no original pieces to initialise from")
        bad = [i for i in token.base_ids if not 0 <= i < base_vocab_size]
        if bad:
            raise ValueError(f"new token {token.token!r}: original piece ids {bad} are not base ids")
        ids.extend(token.base_ids)
        owners.extend([position] * len(token.base_ids))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(owners, dtype=torch.long)


# A base whose embedding is a multiple of this keeps it (Megatron pads to 128, Llama 3 has 128,256
# rows, Qwen 2.5 151,936): kernels and tensor-parallel splits were sized for it.
BASE_MULTIPLE = 128


def effective_multiple(current: int, multiple: int) -> int:
    """The multiple the vocabulary is padded to: the option's (1: no padding), or the base's 128
    where the base's `current` rows are a multiple of 128 and the option asks for less."""
    if multiple and multiple > 1 and current % BASE_MULTIPLE == 0:
        return max(multiple, BASE_MULTIPLE)
    return multiple


def padded_vocab_size(needed: int, current: int, multiple: int) -> int:
    """Never shrink (rows past the tokenizer may exist already); round up to `multiple`, or to the
    base's 128 where it has that (effective_multiple)."""
    size = max(needed, current)
    multiple = effective_multiple(current, multiple)
    if multiple and multiple > 1:
        size = math.ceil(size / multiple) * multiple
    return size


def reserved_ids(extended) -> list[int] | None:
    """Where an ExtendedTokenizer's rows go when its new tokens sit on reserved ids (apply_rows'
    `at_ids`, row i to new token i); None for appended ids."""
    return [token.id for token in extended.new_tokens] if getattr(extended, "reserved", None) is not None else None


@torch.no_grad()
def apply_rows(
    model,
    rows: NewRows,
    *,
    base_vocab_size: int,
    pad_to_multiple_of: int = DEFAULTS["pad_to_multiple_of"],
    calibration_ids: torch.Tensor | None = None,
    at_ids: Sequence[int] | None = None,
) -> dict:
    """Resize the model for `rows`, write them after the base rows, and set the padding rows.
    With `at_ids` (new_ids 'reserved': one id per row, ids the base already has) the rows are
    written there instead, and the model keeps its size: nothing is resized or padded.

    Old rows stay bit-identical (resize copies them in their dtype). Tied models stay tied.
    Returns a report: vocab sizes, padding ids, measured padding probability (if calibrated).
    """
    tied = is_tied(model)
    current = model.get_input_embeddings().weight.shape[0]
    if at_ids is not None:
        return _write_at_reserved_ids(model, rows, list(at_ids), base_vocab_size=base_vocab_size, tied=tied)
    new_size = padded_vocab_size(base_vocab_size + len(rows), current, pad_to_multiple_of)
    if new_size != current:
        model.resize_token_embeddings(new_size, mean_resizing=False)
        if tied:
            model.tie_weights()
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    first, end = base_vocab_size, base_vocab_size + len(rows)
    embedding[first:end] = rows.input.to(embedding.device, embedding.dtype)
    if rows.per_layer is not None:  # a per-layer table that grew with the vocabulary (resize grows it too)
        per_layer.write(model, rows.per_layer, range(first, end))
    if not tied:
        if rows.output is None:
            raise ValueError("untied model needs output rows; build them with subword_mean_rows")
        head.weight[first:end] = rows.output.to(head.weight.device, head.weight.dtype)
        if getattr(head, "bias", None) is not None and rows.output_bias is not None:
            head.bias[first:end] = rows.output_bias.to(head.bias.device, head.bias.dtype)

    padding_ids = list(range(end, new_size))
    report = {
        "base_vocab_size": base_vocab_size,
        "new_rows": len(rows),
        "vocab_size": new_size,
        "pad_to_multiple_of": effective_multiple(current, pad_to_multiple_of),
        "padding_ids": padding_ids,
        "tied": tied,
    }
    if padding_ids:
        report.update(_place_padding_rows(model, padding_ids, calibration_ids))
    _set_vocab_size(model.config, new_size)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.suppress_tokens = padding_ids or None
    return report


def _write_at_reserved_ids(model, rows: NewRows, ids: list[int], *, base_vocab_size: int, tied: bool) -> dict:
    current = model.get_input_embeddings().weight.shape[0]
    if len(ids) != len(rows) or len(set(ids)) != len(ids) or not all(0 <= i < min(base_vocab_size, current) for i in ids):
        raise ValueError(f"{len(rows)} new rows need as many distinct base ids below {base_vocab_size}, got {ids[:5]}...")
    embedding = model.get_input_embeddings().weight
    index = torch.tensor(ids, dtype=torch.long, device=embedding.device)
    embedding[index] = rows.input.to(embedding.device, embedding.dtype)
    if rows.per_layer is not None:  # Gemma 3n: reserved ids lie inside its per-layer table
        per_layer.write(model, rows.per_layer, ids)
    if not tied:
        if rows.output is None:
            raise ValueError("untied model needs output rows; build them with subword_mean_rows")
        head = model.get_output_embeddings()
        head.weight[index.to(head.weight.device)] = rows.output.to(head.weight.device, head.weight.dtype)
        if getattr(head, "bias", None) is not None and rows.output_bias is not None:
            head.bias[index.to(head.bias.device)] = rows.output_bias.to(head.bias.device, head.bias.dtype)
    generation = getattr(model, "generation_config", None)
    suppressed = getattr(generation, "suppress_tokens", None)
    if suppressed:
        # a reserved id the base kept from being generated is a new token now, and must be generated
        generation.suppress_tokens = [i for i in suppressed if i not in set(ids)] or None
    return {"base_vocab_size": base_vocab_size, "new_rows": len(rows), "vocab_size": current,
            "pad_to_multiple_of": None, "padding_ids": [], "tied": tied, "reserved_ids": ids}


def _set_vocab_size(config, size: int) -> None:
    config.vocab_size = size
    text_config = getattr(config, "text_config", None)
    if text_config is not None and text_config is not config:
        text_config.vocab_size = size


def padding_probability(model, input_ids: torch.Tensor, padding_ids: Iterable[int]) -> float:
    """Largest total probability the model gives the padding rows at any position of `input_ids`."""
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(model.get_input_embeddings().weight.device)).logits.float()
    ids = torch.tensor(list(padding_ids), dtype=torch.long, device=logits.device)
    log_probs = torch.log_softmax(logits, dim=-1)
    return float(torch.logsumexp(log_probs[..., ids], dim=-1).exp().max())


def _place_padding_rows(model, padding_ids: list[int], calibration_ids: torch.Tensor | None) -> dict:
    """Set every padding row to the mean of the real output rows.

    Exact zero probability is out of reach in the weights (no head bias; tied rows serve both
    sides). The mean row has a guarantee that holds for ANY hidden state h: its logit is the
    average real logit, and log-sum-exp >= average + ln(V) (Jensen), so each padding row gets
    at most 1/V of the mass — and in practice far less, because real distributions are peaked
    (measured on SmolLM2: ~2e-5 in total for 63 rows on English, Spanish, Chinese and code).
    Rows pushed "away from the mean hidden state" do better on average but are unbounded on
    text unlike the calibration text (seen: 0.1 on Spanish), so we do not use them.
    """
    head = model.get_output_embeddings()
    ids = torch.tensor(padding_ids, dtype=torch.long, device=head.weight.device)
    real_rows = head.weight.detach()[: padding_ids[0]].float()
    head.weight[ids] = real_rows.mean(dim=0).to(head.weight.dtype)
    if getattr(head, "bias", None) is not None:
        head.bias[ids] = torch.finfo(head.bias.dtype).min / 2  # with a bias, exact-enough zero
    report: dict = {"padding_row": "mean_of_real_output_rows", "padding_probability_max": None}
    if calibration_ids is not None:
        measured = padding_probability(model, calibration_ids, padding_ids)
        report["padding_probability_max"] = measured
        report["padding_probability_ok"] = measured < PADDING_PROBABILITY_LIMIT
    return report
