"""What a job publishes: the training step and the terms that validation says pay for themselves.

plan.py        how much validation text and how often, within a share of the training time
scoring.py     per-token losses of a text under a model (plain, or with new rows attached)
validation.py  the validation text of a job, scored once by the base model, then per candidate
attribution.py each new token's share of the change in bits: its own predictions, the position
               after it, the probability mass it takes elsewhere, against the base model's bits
terms.py       remove the tokens that cost more than they save, rebuild the tokenizer with the
               rest, carry the kept rows (and their optimizer moments) by token string
"""

from .plan import MAX_SELECTION_ROUNDS, VALIDATION_SHARE, ValidationPlan
from .scoring import TextScore, score_text
from .terms import Selection, Unit, keep_optimizer_rows, measure_terms, select_terms
from .validation import StepScorer, ValidationSet, build_validation

__all__ = [
    "MAX_SELECTION_ROUNDS", "VALIDATION_SHARE", "ValidationPlan", "TextScore", "score_text", "Selection", "Unit",
    "keep_optimizer_rows", "measure_terms", "select_terms", "StepScorer", "ValidationSet", "build_validation",
]
