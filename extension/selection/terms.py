"""Keep only the new tokens that pay for themselves on the validation text.

The validation chunks are cut into two interleaved folds (ValidationSet.folds): which units go
is decided on one, whether what is left beats the base is judged on the other, so the terms a
round keeps because they were lucky on the text they were chosen on do not flatter the verdict.
Round after round (at most MAX_SELECTION_ROUNDS scorings of the whole text): score both folds
with the current tokens and rows; stop when the judging fold is below the base model's bits per
byte by at least one standard error of the per-chunk difference (the test split is other text:
a model that only just ties the base lands above it on test about half the time); otherwise
remove the units (a mined merge, or a user's term with all its forms) whose attributed net
effect is harmful (in the early rounds, not those whose removal would leave an intermediate
token where they stood), rebuild the tokenizer from the base with what is kept (so merges and
intermediates no kept token needs go too, and the kept ids are renumbered without holes), carry
each kept token's trained rows over by its vocabulary string, and score again.

A round that removes every harmful unit at once overshoots: the attribution cannot tell the
units that cost little per use from those that cost much once they are all gone. So once the
verdict passes, the removed units are offered back (restore_units), least harmful per use first,
in halving batches, each kept only where the model stays below the base on both halves and the
judging half reads at most `restore_tolerance` (a fraction) above the selection that passed: a
restore buys length with bits, and below the base alone let Chinese drift 1.5024 -> 1.5208 ->
1.5269 bits per byte over its kept restores.

A unit's net effect is what the attribution places on its tokens plus, per use, an even share of
the change it cannot place (`unexplained_bits_per_use`). Which units go in a round:
choose_removals. If the last round is still above the base, nothing is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import JobCancelled
from ..rows.init import NewRows, RowInitializer
from ..rows.adapter import attach
from .attribution import TokenEffect, token_effects
from ..plan.options import DEFAULTS
from .plan import MAX_RESTORE_TRIES, MAX_SELECTION_ROUNDS, ROUNDS_REMOVING_ALL_HARMFUL
from .validation import ValidationSet


@dataclass(frozen=True)
class Unit:
    """What is kept or removed as one: a mined merge's token, or a user's term (its forms and
    the intermediates made for it)."""

    name: str  # the term, or the text the mined token spells
    tokens: tuple[str, ...]  # vocabulary strings


@dataclass
class Selection:
    extended: object | None  # the ExtendedTokenizer kept (None: nothing was kept)
    rows: NewRows | None
    kept_index: list[int]  # per kept new token: its position among the original new tokens (-1: fresh)
    removed: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    effects: dict[str, dict] = field(default_factory=dict)  # unit name -> measured effect (last scoring)
    restores: list[dict] = field(default_factory=list)  # each try at bringing removed units back

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "removed": self.removed, "restores": self.restores,
                "kept": len(self.kept_index), "effects": self.effects}


def select_terms(model, extended, rows: NewRows, validation: ValidationSet, *, units: list[Unit],
                 rebuild: Callable[[list[Unit]], object], pad_to_multiple_of: int,
                 max_rounds: int = MAX_SELECTION_ROUNDS, should_cancel: Callable[[], bool] | None = None,
                 initial_rows: RowInitializer | None = None, restore_tries: int = MAX_RESTORE_TRIES,
                 restore_tolerance: float = DEFAULTS["restore_tolerance"]) -> Selection:
    current, current_rows = extended, rows
    kept_units = list(units)
    kept_index = list(range(len(extended.new_tokens)))
    removed: list[dict] = []
    rounds: list[dict] = []
    decide, judge = validation.folds()
    base_decide, base_judge = validation.base_fold(decide), validation.base_fold(judge)
    for number in range(1, max_rounds + 1):
        score, judged = score_folds(model, current, current_rows, validation, pad_to_multiple_of, decide, judge)
        effects = token_effects(score, base_decide, first_new_id=current.base_vocab_size, num_new=len(current.new_tokens))
        per_use = unexplained_bits_per_use(score, base_decide, effects)
        unit_effects = _unit_effects(kept_units, current, effects, per_use)
        margin = standard_error(judged, base_judge)
        rounds.append({"round": number, "new_tokens": len(current.new_tokens), "units": len(kept_units),
                       **_scores(score, judged, margin, base_decide, base_judge, validation), "unexplained_bits_per_use": per_use})
        if judged.bits_per_byte + margin <= base_judge.bits_per_byte:
            chosen = Selection(current, current_rows, kept_index, removed, rounds, _effects_json(unit_effects))
            if removed and restore_tries:
                restore_units(chosen, model, extended, rows, validation, units=units, kept_units=kept_units,
                              rebuild=rebuild, pad_to_multiple_of=pad_to_multiple_of, tries=restore_tries,
                              should_cancel=should_cancel, initial_rows=initial_rows, tolerance=restore_tolerance)
            return chosen
        if should_cancel is not None and should_cancel():
            # A stop, not a verdict: returning "nothing kept" here would fail the job as if no
            # term paid, when the user cancelled (or the worker lost its lease).
            raise JobCancelled(f"cancelled during term selection, after round {number}")
        if number == max_rounds:
            rebuilt, still_kept = None, []
            gone = {unit.name: "the last round was still above the base model" for unit in kept_units}
        else:
            # the last rounds before the final one remove what exposes an intermediate too
            exposure_checked = number < max_rounds - ROUNDS_REMOVING_ALL_HARMFUL
            rebuilt, still_kept, gone = choose_removals(kept_units, unit_effects, rebuild,
                                                        current=current if exposure_checked else None)
        tokens_of = {unit.name: unit.tokens for unit in kept_units}
        removed += [{"term": name, "tokens": list(tokens_of[name]), "round": number, "reason": reason,
                     **unit_effects[name].to_json()} for name, reason in gone.items()]
        kept_units = still_kept
        if not kept_units:
            return Selection(None, None, [], removed, rounds, _effects_json(unit_effects))
        current_rows, index = carry_rows(model, current, current_rows, rebuilt, initial_rows)
        kept_index = [kept_index[i] if i >= 0 else -1 for i in index]
        current = rebuilt
    return Selection(None, None, [], removed, rounds, {})


def restore_units(chosen: Selection, model, original, original_rows: NewRows, validation: ValidationSet, *,
                  units: list[Unit], kept_units: list[Unit], rebuild: Callable[[list[Unit]], object], pad_to_multiple_of: int,
                  tries: int, should_cancel: Callable[[], bool] | None = None,
                  initial_rows: RowInitializer | None = None, tolerance: float = DEFAULTS["restore_tolerance"]) -> None:
    """Offer removed units back to a `chosen` selection that passed, in place. Least harmful per
    use first (by the effect measured when each was removed), the first half of them, then half
    as many each try, at most `tries` scorings. A batch stays where the judging half is still
    below the base by its margin and the deciding half is not above the base: the same verdict
    as a removal round's, plus the half the batch was ranked on, so a batch that only the judging
    half liked does not stay, and the judging half must read at most `tolerance` (a fraction of it)
    above the selection that passed (its last round): below the base alone let each restore trade
    bits for length. Each try records how far above the passing selection it read. Restored
    tokens get their trained rows back by vocabulary string."""
    # measured against the round that passed, not the last kept restore, so kept restores cannot
    # add up to more than the tolerance
    passing = chosen.rounds[-1]["bits_per_byte"]
    removed = {entry["term"]: entry for entry in chosen.removed}
    # never used in the validation text: nothing there says they save anything
    candidates = sorted((unit for unit in units if unit.name in removed and removed[unit.name]["occurrences"] > 0),
                        key=lambda unit: removed[unit.name]["net_bits"] / removed[unit.name]["occurrences"])
    decide, judge = validation.folds()
    base_decide, base_judge = validation.base_fold(decide), validation.base_fold(judge)
    batch = (len(candidates) + 1) // 2
    for _ in range(tries):
        if not candidates or batch == 0:
            return
        if should_cancel is not None and should_cancel():
            raise JobCancelled("cancelled during term selection, while offering removed terms back")
        offered = candidates[:batch]
        rebuilt = rebuild(kept_units + offered)
        present = {token.token for token in rebuilt.new_tokens}
        trial = [unit for unit in offered if all(token in present for token in unit.tokens)]
        rows, index = carry_rows(model, original, original_rows, rebuilt, initial_rows)
        score, judged = score_folds(model, rebuilt, rows, validation, pad_to_multiple_of, decide, judge)
        margin = standard_error(judged, base_judge)
        kept = (judged.bits_per_byte + margin <= base_judge.bits_per_byte
                and score.bits_per_byte <= base_decide.bits_per_byte
                and judged.bits_per_byte <= passing * (1 + tolerance))
        chosen.restores.append({"offered": len(trial), "kept": kept, "new_tokens": len(rebuilt.new_tokens),
                                **_scores(score, judged, margin, base_decide, base_judge, validation),
                                "passing_bits_per_byte": passing, "tolerance": tolerance})
        if kept:
            names = {unit.name for unit in trial}
            effects = token_effects(score, base_decide, first_new_id=rebuilt.base_vocab_size, num_new=len(rebuilt.new_tokens))
            kept_units = kept_units + trial
            chosen.extended, chosen.rows, chosen.kept_index = rebuilt, rows, index
            chosen.removed = [entry for entry in chosen.removed if entry["term"] not in names]
            chosen.effects = _effects_json(_unit_effects(kept_units, rebuilt, effects,
                                                         unexplained_bits_per_use(score, base_decide, effects)))
            candidates = candidates[len(offered):]
        batch //= 2


def _scores(score, judged, margin: float, base_decide, base_judge, validation: ValidationSet) -> dict:
    """What a round (or a restore try) scored on each half of the validation text, and how short
    its tokens make the whole of it."""
    return {"bits_per_byte": judged.bits_per_byte, "base_bits_per_byte": base_judge.bits_per_byte,
            "margin_bits_per_byte": margin, "decided_on_bits_per_byte": score.bits_per_byte,
            "decided_on_base_bits_per_byte": base_decide.bits_per_byte,
            "tokens_per_byte": (score.tokens + judged.tokens) / (score.bytes + judged.bytes),
            "base_tokens_per_byte": validation.base.tokens / validation.base.bytes}


def choose_removals(units: list[Unit], effects: dict[str, "UnitEffect"], rebuild: Callable[[list[Unit]], object],
                    *, current=None) -> tuple[object | None, list[Unit], dict[str, str]]:
    """Which units a round removes: (the tokenizer rebuilt without them, the units kept, {name:
    reason} of those removed). The first of these that removes anything:
    1. the units with a harmful net effect that occur in the validation text; given the `current`
       tokenizer, not those whose text the rebuild would cut into a new token that stays (an
       intermediate a kept unit needs), unless every harmful unit is such a one: the attribution
       prices a removal as a return to the base's pieces, and an intermediate left where the unit
       stood was never trained there;
    2. where each of those is a step of kept units' merges (rebuilt without it, it comes back):
       it together with the units built on it, where together they cost more than they save
       (removing every such group whatever it saved took 14 words the attribution credited with
       savings out of a Chinese job along with the 9 characters and pieces under them; the next
       round scored worse on both halves of the text, and the job published nothing);
    3. the units harmful only through their leak (never seen in the validation text);
    4. the less useful half by net effect (the attribution misses longer-range effects; the
       re-score does not)."""
    seen = [unit for unit in units if effects[unit.name].net_bits > 0 and effects[unit.name].occurrences > 0]
    harmful = {unit.name: _reason(effects[unit.name]) for unit in seen}
    rebuilt, kept, gone = _remove(units, harmful, rebuild)
    if current is not None and rebuilt is not None and gone:
        exposing = _exposing([unit for unit in units if unit.name in gone], current, rebuilt)
        if exposing and len(exposing) < len(gone):
            harmful = {name: reason for name, reason in harmful.items() if name not in exposing}
            rebuilt, kept, gone = _remove(units, harmful, rebuild)
    if gone or not kept:
        return rebuilt, kept, gone
    group_bits = {unit.name: effects[unit.name].net_bits for unit in seen}
    built_on = built_on_units(seen, units, rebuild)
    for unit, base_name in built_on.items():
        group_bits[base_name] += effects[unit.name].net_bits
    groups = {unit.name: f"built on {base_name!r}: together they cost {group_bits[base_name]:.1f} bits more than they save"
              for unit, base_name in built_on.items() if group_bits[base_name] > 0}
    unseen = [unit for unit in units if effects[unit.name].net_bits > 0 and not effects[unit.name].occurrences]
    ranked = sorted((unit for unit in units if unit not in seen), key=lambda unit: effects[unit.name].net_bits, reverse=True)
    for reasons in (groups, {unit.name: _reason(effects[unit.name]) for unit in unseen},
                    {unit.name: _reason(effects[unit.name]) for unit in ranked[: max(1, len(ranked) // 2)]}):
        if not reasons:
            continue
        # the harmful units stuck under them go too where nothing kept needs them any more
        rebuilt, kept, gone = _remove(units, {**harmful, **reasons}, rebuild)
        if gone or not kept:
            return rebuilt, kept, gone
    return rebuilt, kept, gone


def _exposing(removed: list[Unit], current, rebuilt) -> set[str]:
    """The removed units whose text `rebuilt` cuts into a new token (not back into the base's
    pieces): removing them would leave an intermediate where they stood."""
    text_of = {token.token: token.text for token in current.new_tokens}
    found = set()
    for unit in removed:
        for token in unit.tokens:
            ids = rebuilt.tokenizer(text_of[token], add_special_tokens=False)["input_ids"]
            if any(i >= rebuilt.base_vocab_size for i in ids):
                found.add(unit.name)
                break
    return found


def _remove(units: list[Unit], reasons: dict[str, str], rebuild: Callable[[list[Unit]], object]
            ) -> tuple[object | None, list[Unit], dict[str, str]]:
    """Rebuild without the units named in `reasons`. A unit whose tokens the rebuild still makes
    (its merge is a step of a kept unit's) stays. Returns (rebuilt, kept units, reasons of those gone)."""
    rest = [unit for unit in units if unit.name not in reasons]
    if not rest:
        return None, [], dict(reasons)
    rebuilt = rebuild(rest)
    present = {token.token for token in rebuilt.new_tokens}
    stayed = {unit.name for unit in units if unit.name in reasons and all(token in present for token in unit.tokens)}
    gone = {name: reason for name, reason in reasons.items() if name not in stayed}
    return rebuilt, [unit for unit in units if unit.name not in gone], gone


def standard_error(score, base) -> float:
    """Standard error, in bits per byte, of the validation difference (extended minus base),
    from its spread across chunks (the same chunks, so the difference is paired)."""
    differences = torch.tensor([float(e.nll.sum() - b.nll.sum()) for e, b in zip(score.chunks, base.chunks)], dtype=torch.float64)
    if len(differences) < 2:
        return 0.0
    return float(differences.std() * len(differences) ** 0.5) / (math.log(2) * score.bytes)


def built_on_units(harmful: list[Unit], kept: list[Unit], rebuild: Callable[[list[Unit]], object]) -> dict[Unit, str]:
    """The kept units whose tokens are built on a harmful unit's token (rebuilt alone, they bring
    it back), each with the harmful unit's name. Only units whose text contains the harmful
    one's are rebuilt to check: a merge's result spells its parts."""
    found: dict[Unit, str] = {}
    for bad in harmful:
        for unit in kept:
            if unit in found or unit == bad or bad.name not in unit.name:
                continue
            present = {token.token for token in rebuild([unit]).new_tokens}
            if set(bad.tokens) <= present:
                found[unit] = bad.name
    return found


def unexplained_bits_per_use(score, base, effects: list[TokenEffect]) -> float:
    """The change in validation bits the attribution does not place (it sees 8 tokens after each
    new one, not further), per use of a new token; 0 when the attribution already explains all
    of it or more. Without new tokens the text scores exactly as the base, so the whole measured
    change is theirs: spread evenly over their uses it is charged to every unit by how often it
    is used. Without this share, a round can remove every unit the attribution calls harmful and
    leave the model still above the base, round after round, until the last one keeps nothing
    (SmolLM2 at defaults, CMake manual and Chinese, before this share; with it they still keep
    nothing at 100 steps: benchmarks/results/quality_{cmake,zh}.md)."""
    measured = sum(float(e.nll.sum() - b.nll.sum()) for e, b in zip(score.chunks, base.chunks)) / math.log(2)
    uses = sum(effect.occurrences for effect in effects)
    unexplained = measured - sum(effect.net_bits for effect in effects)
    return max(unexplained, 0.0) / uses if uses else 0.0


def score_folds(model, extended, rows: NewRows, validation: ValidationSet, pad_to_multiple_of: int,
           *folds: list[int]):
    """The whole validation text with each new token's leak, or (folds given) one TextScore per
    fold, the first with leaks (it is the one effects are attributed on)."""
    adapter = attach(model, extended.base_vocab_size, rows, pad_to_multiple_of=pad_to_multiple_of)
    try:
        if not folds:
            return validation.score(model, extended, leak=True)
        return tuple(validation.score(model, extended, leak=k == 0, fold=fold) for k, fold in enumerate(folds))
    finally:
        adapter.detach()


@dataclass
class UnitEffect:
    occurrences: int
    net_bits: float  # attributed + its share of the unexplained change
    leak_bits: float
    unexplained_bits: float = 0.0

    def to_json(self) -> dict:
        return {"occurrences": self.occurrences, "net_bits": round(self.net_bits, 3), "leak_bits": round(self.leak_bits, 3),
                "unexplained_bits": round(self.unexplained_bits, 3)}


def _unit_effects(units: list[Unit], extended, effects: list[TokenEffect], unexplained_per_use: float = 0.0) -> dict[str, UnitEffect]:
    by_token = {token.token: effects[k] for k, token in enumerate(extended.new_tokens)}
    result = {}
    for unit in units:
        mine = [by_token[t] for t in unit.tokens if t in by_token]
        uses = sum(e.occurrences for e in mine)
        share = unexplained_per_use * uses
        result[unit.name] = UnitEffect(
            occurrences=uses, net_bits=sum(e.net_bits for e in mine) + share,
            leak_bits=sum(e.leak_bits for e in mine), unexplained_bits=share,
        )
    return result


def _reason(effect: UnitEffect) -> str:
    if effect.net_bits > 0 and effect.occurrences:
        share = f", {effect.unexplained_bits:.1f} of them its share of the change no single token explains" if effect.unexplained_bits else ""
        return f"costs {effect.net_bits:.1f} bits more than it saves over its {effect.occurrences} uses in the validation text{share}"
    if effect.net_bits > 0:
        return f"never used in the validation text, and takes {effect.leak_bits:.2f} bits of probability elsewhere"
    return (f"saves only {-effect.net_bits:.1f} bits: among the least useful half, removed because the "
            "model was still above the base model")


def _effects_json(effects: dict[str, UnitEffect]) -> dict[str, dict]:
    return {name: effect.to_json() for name, effect in effects.items()}


def carry_rows(model, old, old_rows: NewRows, new, initial_rows: RowInitializer | None = None) -> tuple[NewRows, list[int]]:
    """Rows for `new`'s tokens: the trained rows of the same vocabulary string in `old`, else
    (a token the rebuild made anew) its initial row (`initial_rows`: the job's initializer; by
    default the subword mean). Returns the rows and, per new token, its position in `old` (-1: fresh)."""
    position = {token.token: k for k, token in enumerate(old.new_tokens)}
    index = [position.get(token.token, -1) for token in new.new_tokens]
    fresh = (initial_rows or _subword_means)(model, new)

    def take(old_tensor, fresh_tensor):
        if old_tensor is None:
            return None
        out = fresh_tensor.detach().to(old_tensor.dtype).clone() if fresh_tensor is not None else torch.zeros(
            (len(index), *old_tensor.shape[1:]), dtype=old_tensor.dtype)
        for row, k in enumerate(index):
            if k >= 0:
                out[row] = old_tensor[k]
        return out

    return NewRows(input=take(old_rows.input, fresh.input), output=take(old_rows.output, fresh.output),
                   output_bias=take(old_rows.output_bias, fresh.output_bias),
                   per_layer=take(old_rows.per_layer, fresh.per_layer)), index


def _subword_means(model, extended) -> NewRows:
    from ..rows.init import subword_mean_rows

    return subword_mean_rows(model, extended.new_tokens, extended.base_vocab_size)


def keep_optimizer_rows(state: dict | None, kept_index: list[int], num_old: int) -> dict | None:
    """The new rows' AdamW state (train.TrainResult.optimizer_state) for the kept tokens only:
    row k of every per-row moment becomes the old row kept_index[k] (zeros for a fresh token)."""
    if state is None:
        return None
    index = torch.tensor([max(k, 0) for k in kept_index], dtype=torch.long)
    fresh = torch.tensor([k < 0 for k in kept_index])
    kept = {}
    for key, param_state in state["state"].items():
        kept[key] = {}
        for name, value in param_state.items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == num_old:
                value = value.index_select(0, index).clone()
                value[fresh] = 0
            kept[key][name] = value
    return {"state": kept, "param_groups": state["param_groups"]}


def measure_terms(model, extended, rows: NewRows, validation: ValidationSet, *, units: list[Unit],
                  pad_to_multiple_of: int) -> dict:
    """Each unit's measured effect, nothing removed (terms-only jobs keep the user's terms)."""
    score = score_folds(model, extended, rows, validation, pad_to_multiple_of)
    effects = token_effects(score, validation.base, first_new_id=extended.base_vocab_size, num_new=len(extended.new_tokens))
    per_use = unexplained_bits_per_use(score, validation.base, effects)
    return {"bits_per_byte": score.bits_per_byte, "tokens_per_byte": score.tokens / score.bytes, "unexplained_bits_per_use": per_use,
            "effects": _effects_json(_unit_effects(units, extended, effects, per_use))}


def term_units(extended) -> list[Unit]:
    """One unit per user term: its forms and the intermediates made for it."""
    token_of = {token.id: token.token for token in extended.new_tokens}
    return [Unit(term.term, tuple(token_of[i] for i in term.forms.values() if i in token_of) + tuple(term.intermediates))
            for term in extended.terms]


def token_units(extended) -> list[Unit]:
    """One unit per new vocabulary entry (mined merges), named by the text it spells."""
    units, names = [], set()
    for token in extended.new_tokens:
        name = token.text if token.text not in names else f"{token.text} ({token.token})"
        names.add(name)
        units.append(Unit(name, (token.token,)))
    return units


def merges_rebuilder(base_tokenizer, merges: list[tuple[str, str]], *, embedding_rows: int | None = None) -> Callable[[list[Unit]], object]:
    """Rebuild from the base with the kept units' merges, in their order, plus every earlier merge
    a kept one is built from."""
    from ..tokenizer import extend_with_merges

    made_by = {left + right: (left, right) for left, right in merges}

    def rebuild(units: list[Unit]):
        needed = {token for unit in units for token in unit.tokens}
        pending = list(needed)
        while pending:
            for part in made_by.get(pending.pop(), ()):
                if part in made_by and part not in needed:
                    needed.add(part)
                    pending.append(part)
        return extend_with_merges(base_tokenizer, [pair for pair in merges if pair[0] + pair[1] in needed],
                                  embedding_rows=embedding_rows)

    return rebuild


def terms_rebuilder(base_tokenizer, *, max_term_chars: int, embedding_rows: int | None = None) -> Callable[[list[Unit]], object]:
    from ..tokenizer import extend_tokenizer

    return lambda units: extend_tokenizer(base_tokenizer, [unit.name for unit in units], max_term_chars=max_term_chars,
                                          embedding_rows=embedding_rows)
