"""benchmarks/loss_decomposition.py compares an extended model's loss with the base's over the same
characters: both scorings stop at MAX_TOKENS, so the extended one (shorter tokens per byte) reads
further, and what it reads past the base's last token has nothing to compare with."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import loss_decomposition as ld  # noqa: E402


def test_positions_past_the_base_models_last_token_are_not_counted(monkeypatch):
    # text "abcdefgh": the base read it as 8 one-character tokens but stopped after 6 (its
    # MAX_TOKENS), the extended tokenizer as "ab" (new, id 100) and 6 old ones, all 7 read.
    base_ends, base_nll = [1, 2, 3, 4, 5, 6], [1.0] * 6
    extended_ids, extended_ends = [100, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8]
    extended_nll = [1.5, 1.0, 1.0, 1.0, 1.0, 9.0, 9.0]  # the last two: past the base's end
    monkeypatch.setattr(ld, "context_token_id", lambda tokenizer: 0)
    monkeypatch.setattr(ld, "token_losses", lambda model, tokenizer, text, context_id: (
        extended_ids, extended_ends, extended_nll, torch.zeros(len(extended_ids), 101)))
    table = ld.decompose(None, SimpleNamespace(tokenizer=None, base_vocab_size=100), ["abcdefgh"],
                         [(None, base_ends, base_nll, None)])
    counted = sum(cell["positions"] for cell in table.values())
    assert counted == 5, table  # "ab" and the four old tokens up to the base's sixth character
    assert math.isclose(sum(cell["nats"] for cell in table.values()), 5.5)
    assert math.isclose(sum(cell["base_nats"] for cell in table.values()), 6.0)
    assert table["new target"]["positions"] == 1 and math.isclose(table["new target"]["base_nats"], 2.0)
