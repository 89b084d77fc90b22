"""What a job decided, in sentences a user can act on: the CLI summary, the job page and the model
card all call `decision_sentences`, so the three never tell different stories.

Everything is read from the job's metrics (metrics.json, the service's job metrics): "selection"
(the rounds of term selection, each with the validation text's tokens per byte), "training"
(steps taken and why it stopped) and "comparison" (the held-out contexts of a terms-only job).
Metrics recorded before a field existed simply give fewer sentences.
"""

from __future__ import annotations

from ..plan.options import BY_NAME

# How an option is named where the sentence is read: the CLI's flag, the API's JSON path, or
# both (the model card, read by users of either door).
STYLES = ("cli", "api", "both")
# The corpus is an input, not an option: how each door names it.
_EXAMPLES_WORDS = {"cli": "`--examples FILE`", "api": "`examples`", "both": "`--examples FILE` (API: `examples`)"}
_CORPUS_WORDS = {"cli": "`--corpus FILE`", "api": "a corpus, `corpus_file_id`", "both": "`--corpus FILE` (API: `corpus_file_id`)"}


def decision_sentences(metrics: dict | None, *, style: str = "cli", precision: bool = True) -> list[str]:
    """The sentences, in the order a user wants them: whether the model was judged at all, why
    training stopped, what selection kept and gave up, how a terms-only job compares with the base
    model on its held-out contexts, and the precision the figures were measured in (`precision`
    False leaves it to a reader that places it beside the figures themselves)."""
    metrics = metrics or {}
    found = [not_judged_sentence(metrics, style=style),
             stopped_early_sentence(metrics.get("training") or {}, style=style),
             selection_sentence(metrics, style=style),
             held_out_sentence(metrics, style=style),
             precision_sentence(metrics) if precision else None]
    return [sentence for sentence in found if sentence]


def not_judged_sentence(metrics: dict, *, style: str = "cli") -> str | None:
    """Where selection was asked for but had too little validation text to decide on: the model
    was published without being judged against the base model (every term, the last step)."""
    selection = metrics.get("selection") or {}
    skipped = selection.get("skipped")
    if selection.get("terms_kept_unjudged") and selection.get("mode", "validation") == "validation":
        return (f"Which terms stay was NOT decided: {selection['terms_kept_unjudged']}. Give a few documents of your "
                f"own text ({_EXAMPLES_WORDS[style]}) or your domain text ({_CORPUS_WORDS[style]}) to have it decided.")
    if not skipped or selection.get("mode", "validation") != "validation":
        return None
    fix = "" if "corpus" in skipped else f"; give your own domain text ({_CORPUS_WORDS[style]}) to judge it on"
    return (f"The published model was NOT judged against the base model: {skipped}. Nothing checked that it is at "
            f"least as good as the base model on your text{fix}.")


def precision_sentence(metrics: dict) -> str | None:
    """The precision the before/after figures were measured in, and whether that is the published
    weights' (a bf16 job of an fp32 checkpoint scores the bf16 model, the user downloads fp32)."""
    devices = metrics.get("devices") or {}
    measured = (devices.get("evaluate") or {}).get("dtype")
    published = (devices.get("publish") or {}).get("dtype")
    if not measured:
        return None
    if published is None or published == measured:
        return f"The before/after figures were measured in {measured}" + (", the published weights' dtype." if published else ".")
    return (f"The before/after figures were measured with the model computing in {measured}; the published weights are "
            f"{published} (the base checkpoint's dtype) and were not scored themselves, so their figures may differ "
            "slightly.")


def precision_record(metrics: dict) -> dict | None:
    """What tide_extension.json says of the figures' precision: the dtype the before/after was
    scored in, the published weights' dtype, whether those weights are what was scored, and the
    sentence the card and summary print. None where nothing was scored."""
    devices = metrics.get("devices") or {}
    measured = (devices.get("evaluate") or {}).get("dtype")
    if not measured:
        return None
    published = (devices.get("publish") or {}).get("dtype")
    return {"scored_in": measured, "published_dtype": published,
            "published_weights_scored": published is None or published == measured,
            "said": precision_sentence(metrics)}


def option_words(name: str, value, *, style: str) -> str:
    """An option set to a value as the reader would write it, e.g. `--steps 200`."""
    option = BY_NAME[name]
    if style == "api":
        return f"`{option.api_path}: {value}`"
    if style == "both":
        return f"`{option.cli_flag} {value}` (API: `{option.api_path}`)"
    return f"`{option.cli_flag} {value}`"


def stopped_early_sentence(training: dict, *, style: str = "cli") -> str | None:
    """'Stopped early after N of M steps: why' where training ended before its last step."""
    stopped, steps, planned = training.get("stopped"), training.get("steps"), training.get("planned_steps")
    if stopped in (None, "steps") or steps is None or planned is None:
        return None
    if stopped == "time_budget":
        budget = training.get("max_train_seconds")
        why = (f"its time budget of {budget:,} s ran out ({option_words('max_train_seconds', 2 * budget, style=style)} "
               "gives it more)") if budget else "its time budget ran out"
    elif stopped == "validation_stalled":
        patience = training.get("validation_patience")
        why = (f"validation had not improved for {patience} check{'s' if patience != 1 else ''} in a row"
               if patience else "validation had stopped improving")
    else:
        why = stopped
    return f"Stopped early after {steps} of {planned} steps: {why}."


def _shorter(tokens_per_byte: float, base_tokens_per_byte: float) -> float:
    """How much shorter, as a fraction, the text is in tokens than with the base tokenizer."""
    return 1 - tokens_per_byte / base_tokens_per_byte


def selection_sentence(metrics: dict, *, style: str = "cli") -> str | None:
    """Tokens offered, kept, the saving given up and, where the validation curve was still
    falling at the last step, how to keep more. None where no term selection ran."""
    selection = metrics.get("selection") or {}
    rounds = selection.get("rounds") or []
    if not rounds or "kept" not in selection:
        return None
    offered, kept = rounds[0]["new_tokens"], selection["kept"]
    restored = [r for r in selection.get("restores") or [] if r["kept"]]
    # the published tokens: the passing round's, or the last batch of removed tokens brought back
    first, last = rounds[0], (restored or rounds)[-1]
    base = first.get("base_tokens_per_byte")
    if kept == offered:
        words = f"Term selection kept all {offered} new tokens offered"
        if base and "tokens_per_byte" in first:
            words += f": the validation text is {_shorter(first['tokens_per_byte'], base):.1%} shorter in tokens"
        return words + "." + _harmful_kept(selection)
    back = sum(r["offered"] for r in restored)
    words = (f"Term selection kept {kept} of the {offered} new tokens offered ({offered - kept + back} removed in "
             f"{len(rounds)} round{'s' if len(rounds) != 1 else ''}"
             + (f", then {back} of them brought back, as the model stayed below the base model with them" if back else "")
             + ")")
    if base and "tokens_per_byte" in first and "tokens_per_byte" in last:
        offered_saving, kept_saving = _shorter(first["tokens_per_byte"], base), _shorter(last["tokens_per_byte"], base)
        words += (f": the validation text is {kept_saving:.1%} shorter in tokens where all {offered} would have made it "
                  f"{offered_saving:.1%} shorter")
        if offered_saving > 0:
            words += f", so {max(0.0, 1 - kept_saving / offered_saving):.0%} of the saving was given up"
    return words + "." + _restore_trade(rounds[-1], restored) + _harmful_kept(selection) + _keep_more(metrics, style=style)


def _restore_trade(passing: dict, restored: list[dict]) -> str:
    """' Bringing them back cost X bits per byte ... for Y% fewer tokens ...': what the kept
    restores traded (the judging half's bits per byte for length), else ''."""
    if not restored or "bits_per_byte" not in passing or "tokens_per_byte" not in passing:
        return ""
    last = restored[-1]
    change = last["bits_per_byte"] - passing["bits_per_byte"]
    shorter = 1 - last["tokens_per_byte"] / passing["tokens_per_byte"]
    return (f" Bringing them back changed the judging half of the validation text by {change:+.4f} bits per byte "
            f"({passing['bits_per_byte']:.4f} -> {last['bits_per_byte']:.4f}) for {shorter:.1%} fewer tokens.")


def _harmful_kept(selection: dict) -> str:
    """' N of the kept tokens cost more bits than they save ...' where the last round measured
    some (selection stops once the model is below the base, and its early rounds keep a harmful
    token whose removal would leave an intermediate in its place), else ''."""
    costly = sum(1 for effect in (selection.get("effects") or {}).values()
                 if effect.get("net_bits", 0) > 0 and effect.get("occurrences", 0) > 0)
    if not costly:
        return ""
    return (f" {costly} of the kept tokens cost more bits than they save where used; they stay for the length "
            "they save, as the model is below the base model with them.")


def _keep_more(metrics: dict, *, style: str) -> str:
    """' Train longer ... to keep more.' where the validation score was still falling at the last
    validated step (the rows had not finished learning), else ''."""
    curve = (metrics.get("selection") or {}).get("validation_curve") or []
    if len(curve) < 2 or not curve[-1]["bits_per_byte"] < curve[-2]["bits_per_byte"]:
        return ""
    training = metrics.get("training") or {}
    if training.get("stopped") == "time_budget" and training.get("max_train_seconds"):
        more = option_words("max_train_seconds", 2 * training["max_train_seconds"], style=style)
    else:
        more = option_words("steps", 2 * (training.get("planned_steps") or curve[-1]["step"]), style=style)
    return (f" The validation score was still falling at the last step ({curve[-1]['step']}): "
            f"train longer ({more}) to keep more.")


def held_out_sentence(metrics: dict, *, style: str = "cli") -> str | None:
    """A terms-only job against the base model on its held-out contexts, in bits per byte, saying
    what that text is: contexts the base model wrote for the terms, not the user's text. So a
    figure at or below the base is never given as a verdict on the user's text."""
    row = (metrics.get("comparison") or {}).get("held_out_contexts_bits_per_byte")
    if not row or row.get("before") is None or row.get("after") is None:
        return None
    before, after = row["before"], row["after"]
    numbers = f"{after:.4f} bits per byte against the base model's {before:.4f} ({(after / before - 1):+.2%})"
    # judged on the figures as printed: "WORSE: 2.8131 against 2.8131" reads as a contradiction
    worse = round(after, 4) > round(before, 4)
    judged_on = ((metrics.get("selection") or {}).get("judging") or {}).get("source", "")
    if "examples" in judged_on:  # the user's own documents, held out: a verdict on their text
        where = "On held-out documents of your examples (kept out of training and of every decision),"
        if worse:
            return (f"{where} the extended model is WORSE than the base model: {numbers}. Give more of your text "
                    f"(a corpus: {_CORPUS_WORDS[style]}) or train longer.")
        return f"{where} the extended model is at or below the base model: {numbers}."
    # metrics written before the judging part existed were measured on the contexts that chose the step
    apart = ("kept out of training and of every decision" if (metrics.get("selection") or {}).get("judging")
             else "kept out of training, but the same ones that chose the training step, so the figure is optimistic")
    where = f"On held-out contexts the base model wrote for your terms, not your text ({apart}),"
    corpus = _CORPUS_WORDS[style]
    examples = _EXAMPLES_WORDS[style]
    if worse:
        # "train longer" is not offered: on the judging domains, training on generated contexts made it worse
        return (f"{where} the extended model is WORSE than the base model: {numbers}. Its shorter text costs more "
                f"bits than it saves there (that text uses the terms far more densely than most text does); give a "
                f"few documents of your own text ({examples}) or your domain text ({corpus}) to train and judge the "
                "terms on it.")
    return (f"{where} the extended model scores {numbers}. That text was written by the base model, not taken from "
            "yours: it does not show the model is as good as the base model on your own text; give a few documents "
            f"of it ({examples}) or your domain text ({corpus}) to have it judged on that.")
