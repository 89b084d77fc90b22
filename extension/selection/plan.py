"""How often the rows are scored on validation text while they train, and on how much of it.

Budget: validation scoring may take at most VALIDATION_SHARE of the training time. Time is not
used to decide (a decision that depends on the machine's load would make a job irreproducible
and break resuming); tokens are: validation gets VALIDATION_SHARE x STEP_COST_IN_SCORED_TOKENS x
(training tokens) scored tokens in all. The share the job really spent is measured and reported
(metrics.selection.validation_share).

Step 0 (the subword-mean init) and the last step are always scored; between them every
`every` steps, at most MAX_EVALUATIONS in all, fewer when the budget would leave each one under
MIN_EVAL_TOKENS (a few hundred tokens do not tell two steps apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

VALIDATION_SHARE = 0.15
# What one trained token costs, in scored tokens. Measured on SmolLM2-135M, CPU (Spanish corpus,
# 10 steps, timers around the step scorer and the training loss in pipeline.run): a step's
# forward + fused loss read 380 tokens/s, its backward only 0.55x that (the weights are frozen:
# no weight gradients), so a trained token costs 1.55 forward tokens; validation chunks are short
# documents, which score at 323 tokens/s, 1.2x a training forward's cost per token. 1.55 / 1.2 =
# 1.3; the constant is 1.0 so that rounding up to MIN_EVAL_TOKENS still stays under the share.
# It was 2 (a guess) until the Spanish quality benchmark measured a 28% share with it.
STEP_COST_IN_SCORED_TOKENS = 1.0
MAX_EVALUATIONS = 11
MIN_EVAL_TOKENS = 1024
# Term selection scores the whole validation text (up to this much) a few times per job: one
# pass each, outside the training loop, so it is not held to the per-step budget.
SELECTION_MAX_BYTES = 32_000
# Below this much validation text no decision is taken (the job says so in its report).
MIN_VALIDATION_BYTES = 2_000
# Each round re-scores the validation text once. Round 1 removes what the attribution calls
# harmful; later rounds catch what removing it changed (neighbours, shared intermediates) and
# what the other half of the text did not confirm. The last round removes whatever is left if the
# model is still above the base: at most this many re-scorings per job (each about as long as
# scoring SELECTION_MAX_BYTES once). It was 4 until the CMake manual's job ended its fourth 0.25%
# above the base (1.1842 against 1.1813) and published nothing; with 6 (and the tokens built on a
# harmful one removed along with it, terms.built_on_units) rounds 5-6 took it to 1.1795, below the
# base but within one standard error (0.0039), so it still published nothing. On FOLDOC the 4-round
# run ended at 1.5846, the 6-round run at 1.5602 against the base's 1.5622: the same verdict. Extra rounds cost one scoring each, only on a job that
# would otherwise fail.
MAX_SELECTION_ROUNDS = 6
# Once a round passes, removed units are offered back in halving batches (terms.restore_units):
# at most this many more scorings of the whole validation text, only on a job that removed some.
# Why: a round removes every unit the attribution calls harmful at once, and on Chinese (SmolLM2,
# 150 CPU steps) the one round that removed 93 of 300 tokens took the judging half from 0.031
# bits per byte above the base to 0.045 below it, where a margin of 0.027 was all the verdict asked.
# Measured: the Perl manual (100 steps) took back 10 of its 19 removed tokens, 84.4% -> 93.1% of the
# saving (benchmarks/results/quality_perl_restore.md); Chinese refused every try, at 100 and at 150 steps.
MAX_RESTORE_TRIES = 3


@dataclass(frozen=True)
class ValidationPlan:
    steps: int  # training steps of the job
    every: int  # score after every `every` steps (and after the last)
    tokens_per_eval: int  # validation tokens scored each time

    @classmethod
    def for_training(cls, *, steps: int, batch_size: int, seq_len: int, available_tokens: int) -> "ValidationPlan":
        budget = VALIDATION_SHARE * STEP_COST_IN_SCORED_TOKENS * steps * batch_size * seq_len
        evaluations = min(MAX_EVALUATIONS, steps + 1, max(2, int(budget // MIN_EVAL_TOKENS)))
        tokens = int(min(available_tokens, max(MIN_EVAL_TOKENS, budget // max(evaluations, 1))))
        every = max(1, math.ceil(steps / max(evaluations - 1, 1)))
        return cls(steps=steps, every=every, tokens_per_eval=tokens)

    def due(self, step: int) -> bool:
        """Score after `step` steps? (step 0 = before training)"""
        return step == 0 or step == self.steps or step % self.every == 0


# A harmful unit whose text the rebuild without it would cut into an intermediate token that
# stays (another kept unit is built on it) is not removed in the early rounds: the attribution
# prices a removal as a return to the base's pieces, and the intermediate, trained only where it
# was a step inside longer tokens, then stands where the unit stood. On Chinese (byte pieces of
# characters; the spread test text, 100 CPU steps, 4 distillation contexts) removing such
# characters in round 1 left byte pieces that cost up to 35 bits per use in round 2; with the
# rule the job kept 200 tokens in 3 rounds instead of 183. The last ROUNDS_REMOVING_ALL_HARMFUL
# rounds before the final one remove them anyway, so a job the rule leaves above the base still
# ends as it did without it.
ROUNDS_REMOVING_ALL_HARMFUL = 2
