"""Each new token's share of the change in validation bits against the base model.

TIDE's merges only join base tokens, so outside the new tokens both tokenizers cut the text
at the same places. Each occurrence of a new token t is compared over a region: the characters
from the end of the token before t to the end of the FOLLOWING-th token after t (stopping
before the next new token, which answers for itself). Inside it the extended model pays its loss
on t and on the tokens after it (reading t: the input row at work, and what t changes in the
context of the next few predictions); the base model pays its loss on every base token that
ends in the region (the pieces t replaced, and the same following tokens). The difference is what t saves or costs there, bytes saved included, because fewer
tokens means fewer losses to pay. Where t is not the answer it still takes probability from the
answer: its leak (scoring.TextScore.leak); the regions count each position's loss without the
new tokens' leak (ChunkScore.own_nll), so one bad row's leak is charged to it alone and not to
every term near which it steals probability. Net bits = (regions + leak) / ln 2; positive = harmful.

What this leaves out: the effect of t on tokens further on. In one check (SmolLM2, 20 Spanish
words at their initial rows, 12 kB of validation text) counting only the next token left most
of the change unattributed (the effects summed to -219 bits where the text changed by -12);
with FOLLOWING = 8 they summed to -34. The pipeline
still re-scores the whole text after each round of removals and judges by that number.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import torch

from .scoring import TextScore

FOLLOWING = 8


@dataclass
class TokenEffect:
    index: int  # position among the new tokens (id - base vocab size)
    occurrences: int
    region_bits: float  # extended minus base, over its regions
    leak_bits: float
    @property
    def net_bits(self) -> float:
        return self.region_bits + self.leak_bits

    def to_json(self) -> dict:
        return {"occurrences": self.occurrences, "net_bits": round(self.net_bits, 3),
                "region_bits": round(self.region_bits, 3), "leak_bits": round(self.leak_bits, 3)}


def token_effects(extended_score: TextScore, base_score: TextScore, *, first_new_id: int, num_new: int) -> list[TokenEffect]:
    occurrences = [0] * num_new
    region = [0.0] * num_new
    for ext, base in zip(extended_score.chunks, base_score.chunks):
        base_ends = base.ends
        cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), base.nll.cumsum(0)]).tolist()
        for i, token in enumerate(ext.ids):
            if token < first_new_id:
                continue
            k = token - first_new_id
            after = i
            while after + 1 < len(ext.ids) and after - i < FOLLOWING and ext.ids[after + 1] < first_new_id:
                after += 1
            start = ext.ends[i - 1] if i > 0 else -1
            first, last = bisect_right(base_ends, start), bisect_right(base_ends, ext.ends[after])
            paid = float((ext.own_nll if ext.own_nll is not None else ext.nll)[i : after + 1].sum())
            region[k] += paid - (cumulative[last] - cumulative[first])
            occurrences[k] += 1
    leak = extended_score.leak if extended_score.leak is not None else torch.zeros(num_new, dtype=torch.float64)
    return [
        TokenEffect(index=k, occurrences=occurrences[k], region_bits=region[k] / math.log(2), leak_bits=float(leak[k]) / math.log(2))
        for k in range(num_new)
    ]
