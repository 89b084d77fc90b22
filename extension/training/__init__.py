"""Training the new rows only, the base frozen: the data, the loop, and what a run carries over.

    term_contexts.py       terms-only jobs: contexts the base model writes around each term, and the
                           objective on them (distil the base model's reading of the pieces, or LM)
    objectives.py          a job's training data: corpus windows, or the terms' contexts
    input_distillation.py init 'distill' / 'subword_mean_distill': the INPUT rows distilled on those
                           contexts before training (the second holding tied rows' logits; a
                           terms-only job of 0 steps stops there)
    loop.py                train_rows: the nanoGPT-style loop over a RowsAdapter, checkpoints, resume
    identity.py            what a run's checkpoints and cached contexts belong to
    optimizer_state.py     carrying a Trainer run's AdamW state over, old rows' moments untouched
"""

from .identity import run_identity
from .input_distillation import DistillationReport, distill_input_rows
from .loop import STOP_REASONS, TrainConfig, TrainResult, corpus_windows, max_positions, param_groups, train_rows
from .objectives import build_training_data
from .optimizer_state import TrainerCheckpoint, grow_live_optimizer, trainer_checkpoint
from .term_contexts import OBJECTIVES, TermContextObjective, term_contexts, terms_objective

__all__ = [
    "run_identity", "DistillationReport", "distill_input_rows", "STOP_REASONS", "TrainConfig", "TrainResult",
    "corpus_windows", "max_positions", "param_groups", "train_rows", "build_training_data", "TrainerCheckpoint",
    "grow_live_optimizer", "trainer_checkpoint", "OBJECTIVES", "TermContextObjective", "term_contexts", "terms_objective",
]
