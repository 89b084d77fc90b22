"""New rows composed the way the base vocabulary composes its own tokens.

Every merge of a BPE vocabulary, (left, right) -> result, is an example of how the model's row
for a longer token relates to the rows of its two parts: tens of thousands of examples, learnt
by the model over its whole pretraining. A ridge regression fitted on them,

    row(result) ~ [row(left), row(right), 1] @ W,

composes a new token from its parts the same way. The subword mean is the special case W =
[I/2; I/2; 0]. On SmolLM2's merges the fitted W predicts the rows of a held-out tenth far better
than the mean of their parts, and a two-layer MLP does no better than W, so the map stays linear
and closed-form (benchmarks/results/composition_fits.md). Least squares shrinks towards the
average row (fitted rows are about 0.75x the real rows' norm on SmolLM2), and a tied row's norm
is the scale of its logit, so composed rows are rescaled by the ratio of the real to the fitted
mean norm on the same merges. A fit that predicts the held-out merges no better than the mean
(random rows, a vocabulary whose rows do not compose) is not used: the rows start at the mean.

A new token is composed along its own merge: its two parts are base tokens or earlier new
tokens (intermediates, composed first). A token no merge makes (an added token) is folded left
to right over its original pieces. The input matrix and, on untied models, the head get their
own fits; a head's bias keeps the subword mean (extension/rows/init.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

# Ridge penalty, relative to the mean diagonal of the normal equations (so the fit does not depend
# on the scale of a model's rows). There are far more merges than coefficients, so it only guards
# the solve: on SmolLM2 relative penalties from 1e-5 to 1e-2 fit alike (held-out cosine 0.715).
RIDGE = 1e-3
# At most this many merges are fitted on (evenly spaced over the merge list, so early and late
# merges are both represented): 2 x hidden + 1 coefficients per output need far fewer examples,
# and Gemma 3's 514k merges would cost a minute of CPU for no better fit.
MAX_FIT_MERGES = 65_536
# Fewer merges than this many per coefficient and the fit is not trusted (the subword mean is used).
MIN_MERGES_PER_COEFFICIENT = 4


@dataclass(frozen=True)
class MergeComposition:
    """row(left + right) ~ scale * ([row(left), row(right), 1] @ weight), fitted on one matrix.

    A token of several merges is composed through the unscaled map and rescaled once at the
    end: rescaling every step compounds (a five-merge term came out at 1.5x the norm of the
    base vocabulary's longest tokens, whose norms grow from 2.85 to 3.55 with merge rank)."""

    weight: torch.Tensor  # [2 * hidden + 1, hidden], fp32
    scale: float
    merges: int  # how many base merges it was fitted on
    held_out_cosine: float  # mean cosine to the real rows of the merges held out of the fit
    mean_cosine: float  # the same for the mean of the two parts

    def compose(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """The fitted map itself, unscaled: composed_rows applies `scale` once, to finished rows."""
        features = torch.cat([left.float(), right.float(), left.new_ones(1, dtype=torch.float32)])
        return features @ self.weight

    def report(self) -> dict:
        return {"fitted_on_merges": self.merges, "norm_scale": round(self.scale, 4),
                "held_out_cosine": round(self.held_out_cosine, 4), "subword_mean_cosine": round(self.mean_cosine, 4)}


def base_merge_ids(tokenizer) -> list[tuple[int, int, int]]:
    """(left, right, result) ids of the base tokenizer's BPE merges whose parts and result are all
    in its vocabulary; [] for tokenizers without merges (WordPiece, Unigram)."""
    model = json.loads(tokenizer.backend_tokenizer.to_str()).get("model", {})
    if model.get("type") != "BPE":
        return []
    vocab = model.get("vocab") or {}
    triples = []
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        ids = vocab.get(left), vocab.get(right), vocab.get(left + right)
        if None not in ids:
            triples.append(ids)
    return triples


def _features(rows: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([left, right, 1] [n, 2 hidden + 1], result [n, hidden]), fp32, for merges `index`."""
    picked = rows[index.to(rows.device)].float().cpu()  # [n, 3, hidden]
    return torch.cat([picked[:, 0], picked[:, 1], torch.ones(len(index), 1)], 1), picked[:, 2]


def fit_composition(matrix: torch.Tensor, merges: Sequence[tuple[int, int, int]], *, ridge: float = RIDGE,
                    max_merges: int = MAX_FIT_MERGES) -> tuple[MergeComposition | None, str | None]:
    """(the ridge fit of result rows on [left, right, 1] over `merges`, None) or (None, why not):
    too few merges to trust, or a fit that predicts the held-out tenth of the merges no better
    than the mean of their parts does (then the mean is the better start)."""
    hidden = matrix.shape[1]
    if len(merges) < MIN_MERGES_PER_COEFFICIENT * (2 * hidden + 1):
        return None, (f"the base tokenizer has {len(merges):,} merges, too few to learn how its rows compose "
                      f"(at least {MIN_MERGES_PER_COEFFICIENT * (2 * hidden + 1):,} for a hidden size of {hidden})")
    index = torch.tensor(merges, dtype=torch.long)
    if len(index) > max_merges:
        index = index[torch.linspace(0, len(index) - 1, max_merges).long()]
    held_out = torch.arange(len(index)) % 10 == 9
    rows = matrix.detach()
    gram = torch.zeros(2 * hidden + 1, 2 * hidden + 1, dtype=torch.float64)
    moments = torch.zeros(2 * hidden + 1, hidden, dtype=torch.float64)
    for chunk in index[~held_out].split(8192):  # the normal equations, a chunk of merges at a time
        features, targets = _features(rows, chunk)  # fp32 products of O(1) rows, summed in float64
        gram += (features.T @ features).double()
        moments += (features.T @ targets).double()
    penalty = ridge * float(gram.diagonal().mean())
    weight = torch.linalg.solve(gram + penalty * torch.eye(2 * hidden + 1, dtype=torch.float64), moments).float()
    fitted_norm = real_norm = 0.0
    for chunk in index[~held_out].split(8192):
        features, targets = _features(rows, chunk)
        fitted_norm += float((features @ weight).norm(dim=1).sum())
        real_norm += float(targets.norm(dim=1).sum())
    features, targets = _features(rows, index[held_out])
    fitted = F.cosine_similarity(features @ weight, targets, dim=1)
    averaged = F.cosine_similarity((features[:, :hidden] + features[:, hidden:-1]) / 2, targets, dim=1)
    gain = fitted - averaged  # paired, per held-out merge
    cosine, mean = float(fitted.mean()), float(averaged.mean())
    if float(gain.mean()) <= 2 * float(gain.std()) / len(gain) ** 0.5:
        return None, (f"composing the base merges predicts the rows of held-out merges no better than their mean "
                      f"(cosine {cosine:.3f} against {mean:.3f}, within two standard errors)")
    fit = MergeComposition(weight=weight, scale=real_norm / max(fitted_norm, 1e-12), merges=int((~held_out).sum()),
                           held_out_cosine=cosine, mean_cosine=mean)
    return fit, None


def composed_rows(matrix: torch.Tensor, composition: MergeComposition, new_tokens: Sequence,
                  merges: Iterable[tuple[str, str]], base_vocab: dict[str, int]) -> torch.Tensor:
    """[len(new_tokens), hidden] fp32 rows on the CPU: each new token composed along the merge that
    makes it (`merges`: the extension's appended merges), its parts looked up in `base_vocab` or
    composed first; a token no merge makes is folded over its original pieces (`base_ids`)."""
    rows = matrix.detach()
    made_by: dict[str, tuple[str, str]] = {}
    for left, right in merges:
        made_by.setdefault(left + right, (left, right))
    by_string = {token.token: token for token in new_tokens}
    done: dict[str, torch.Tensor] = {}

    def base_row(token_id: int) -> torch.Tensor:
        return rows[token_id].float().cpu()

    def row_of(string: str) -> torch.Tensor:
        if string in base_vocab:
            return base_row(base_vocab[string])
        if string not in done:
            if string in made_by:  # a merge's parts come from earlier merges: no cycles
                left, right = made_by[string]
                done[string] = composition.compose(row_of(left), row_of(right))
            else:
                if string not in by_string:
                    raise ValueError(f"{string!r} is neither a base token, a new token nor made by a new merge")
                pieces = by_string[string].base_ids
                row = base_row(pieces[0])
                for piece in pieces[1:]:
                    row = composition.compose(row, base_row(piece))
                done[string] = row
        return done[string]

    if not new_tokens:
        return rows.new_zeros(0, rows.shape[1]).float().cpu()
    return composition.scale * torch.stack([row_of(token.token) for token in new_tokens])
