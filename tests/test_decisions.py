"""Issue 26: what a job decided, in words the user can act on (extension/publishing/decisions.py), on metrics
as jobs record them. The CLI summary, the job page and the model card all print these sentences;
the CLI test runs (tests/test_extend_summary.py) show them there."""

from __future__ import annotations

import copy

from extension.publishing.decisions import decision_sentences, held_out_sentence, selection_sentence, stopped_early_sentence


def _round(number: int, new_tokens: int, tokens_per_byte: float) -> dict:
    return {"round": number, "new_tokens": new_tokens, "units": new_tokens, "bits_per_byte": 1.52,
            "base_bits_per_byte": 1.53, "margin_bits_per_byte": 0.004, "tokens_per_byte": tokens_per_byte,
            "base_tokens_per_byte": 0.2600}


# A medical corpus job like the issue's: 300 mined tokens offered, 15 kept in 6 rounds; the text is
# 1.9% shorter where all 300 would have made it 3.9% shorter.
MEDICAL = {
    "training": {"steps": 40, "planned_steps": 40, "stopped": "steps", "max_train_seconds": 7200, "validation_patience": 0},
    "selection": {
        "mode": "validation", "best_step": 40, "kept": 15,
        "validation": {"source": "corpus validation split", "bytes": 32000, "chunks": 32},
        "validation_curve": [{"step": 0, "bits_per_byte": 1.60}, {"step": 20, "bits_per_byte": 1.55},
                             {"step": 40, "bits_per_byte": 1.53}],
        "rounds": [_round(1, 300, 0.2600 * (1 - 0.039)), *(_round(n, 300 - 57 * (n - 1), 0.2560) for n in range(2, 6)),
                   _round(6, 15, 0.2600 * (1 - 0.019))],
        "removed": [{"term": f"t{k}", "tokens": [f"t{k}"], "round": 1, "occurrences": 1, "net_bits": 1.0,
                     "leak_bits": 0.1, "reason": "costs"} for k in range(285)],
    },
}


def test_removed_tokens_are_counted_with_the_saving_given_up_and_how_to_keep_more():
    sentence = selection_sentence(MEDICAL)
    assert sentence.startswith("Term selection kept 15 of the 300 new tokens offered (285 removed in 6 rounds)")
    assert "1.9% shorter in tokens where all 300 would have made it 3.9% shorter" in sentence
    assert "51% of the saving was given up" in sentence
    # the curve still fell at the last step: more steps would have trained the rows further
    assert "still falling at the last step (40): train longer (`--steps 80`) to keep more." in sentence
    # the job page names options the way the API does, the card both ways
    assert "(`training.steps: 80`)" in selection_sentence(MEDICAL, style="api")
    assert "(`--steps 80` (API: `training.steps`))" in selection_sentence(MEDICAL, style="both")


def test_no_advice_to_train_longer_where_validation_had_stopped_improving():
    flat = copy.deepcopy(MEDICAL)
    flat["selection"]["validation_curve"][-1]["bits_per_byte"] = 1.56  # worse than step 20
    sentence = selection_sentence(flat)
    assert "285 removed" in sentence and "train longer" not in sentence


def test_a_job_stopped_by_its_time_budget_is_told_to_give_it_more_time():
    timed = copy.deepcopy(MEDICAL)
    timed["training"].update(steps=23, planned_steps=100, stopped="time_budget", max_train_seconds=600)
    assert stopped_early_sentence(timed["training"]) == (
        "Stopped early after 23 of 100 steps: its time budget of 600 s ran out (`--max-train-seconds 1200` gives it more).")
    assert "train longer (`--max-train-seconds 1200`) to keep more" in selection_sentence(timed)
    assert decision_sentences(timed)[0].startswith("Stopped early after 23 of 100 steps")


def test_validation_that_stalled_is_said_and_a_full_run_says_nothing():
    assert stopped_early_sentence({"steps": 30, "planned_steps": 100, "stopped": "validation_stalled",
                                   "validation_patience": 2}) == (
        "Stopped early after 30 of 100 steps: validation had not improved for 2 checks in a row.")
    assert stopped_early_sentence(MEDICAL["training"]) is None
    assert stopped_early_sentence({"steps": 0, "history": []}) is None  # an init-only job


def test_every_token_kept_and_jobs_without_selection():
    kept = copy.deepcopy(MEDICAL)
    kept["selection"].update(kept=300, rounds=[_round(1, 300, 0.2600 * (1 - 0.039))], removed=[])
    assert selection_sentence(kept) == "Term selection kept all 300 new tokens offered: the validation text is 3.9% shorter in tokens."
    assert selection_sentence({"selection": {"mode": "none"}}) is None
    assert decision_sentences(None) == [] and decision_sentences({}) == []


def test_selections_recorded_before_tokens_per_byte_still_count_what_was_removed():
    old = copy.deepcopy(MEDICAL)
    for entry in old["selection"]["rounds"]:
        del entry["tokens_per_byte"], entry["base_tokens_per_byte"]
    sentence = selection_sentence(old)
    assert sentence.startswith("Term selection kept 15 of the 300 new tokens offered (285 removed in 6 rounds).")
    assert "shorter" not in sentence


def test_a_terms_only_job_worse_than_the_base_on_its_held_out_contexts_says_so():
    worse = {"comparison": {"held_out_contexts_bits_per_byte": {"before": 1.20, "after": 1.26, "delta": 0.06, "ratio": 1.05}}}
    sentence = held_out_sentence(worse)
    assert "the extended model is WORSE than the base model: 1.2600 bits per byte against the base model's 1.2000 (+5.00%)" in sentence
    assert "`--corpus FILE`" in sentence and "corpus_file_id" in held_out_sentence(worse, style="api")
    # generated contexts are denser in the terms than the user's text, and training on them made the
    # judging domains worse: the sentence says the first and does not advise the second
    assert "uses the terms far more densely than most text does" in sentence and "train longer" not in sentence
    better = {"comparison": {"held_out_contexts_bits_per_byte": {"before": 1.20, "after": 1.14}}}
    assert "1.1400 bits per byte against the base model's 1.2000 (-5.00%)" in held_out_sentence(better)
    assert held_out_sentence({"comparison": {"domain_bits_per_byte": {"before": 1.2, "after": 1.3}}}) is None
    # worse by less than the printed digits: not called WORSE beside two equal figures
    level = {"comparison": {"held_out_contexts_bits_per_byte": {"before": 2.81312, "after": 2.81314}}}
    assert "WORSE" not in held_out_sentence(level) and "2.8131 bits per byte against the base model's 2.8131" in held_out_sentence(level)


def test_the_held_out_verdict_names_its_evidence_and_never_vouches_for_the_users_text():
    """Issue 39 item 4: the held-out contexts are text the base model wrote, not the user's. The
    verdict says so, does not call the model at or below the base on that alone, and says how to
    have it judged on the user's own text — in the summary, the job page and the card alike."""
    from app.pages.views import verdict

    judged = {"comparison": {"held_out_contexts_bits_per_byte": {"before": 1.20, "after": 1.14}},
              "selection": {"mode": "validation", "judging": {"source": "held-out generated contexts, judging part"}}}
    evidence = "On held-out contexts the base model wrote for your terms, not your text (kept out of training and of every decision)"
    for sentence in (held_out_sentence(judged), held_out_sentence({**judged, "comparison": {
            "held_out_contexts_bits_per_byte": {"before": 1.20, "after": 1.26}}})):
        assert sentence.startswith(evidence) and "`--corpus FILE`" in sentence
    better = held_out_sentence(judged)
    assert "That text was written by the base model, not taken from yours" in better
    assert "it does not show the model is as good as the base model on your own text" in better
    assert "at or below" not in better and "`--examples FILE`" in better
    # judged on held-out documents of the user's examples: a verdict on their own text, said as one
    on_examples = {**judged, "selection": {"mode": "validation", "judging": {"source": "held-out documents of your examples, judging part"}}}
    assert held_out_sentence(on_examples) == ("On held-out documents of your examples (kept out of training and of every "
                                              "decision), the extended model is at or below the base model: 1.1400 bits "
                                              "per byte against the base model's 1.2000 (-5.00%).")
    assert "corpus_file_id" in held_out_sentence(judged, style="api")
    assert held_out_sentence(judged, style="api") in verdict(judged)
    assert held_out_sentence(judged, style="both") in " ".join(_card(judged).split())
    # metrics from before the judging part: measured on the contexts that chose the step, and said so
    old = held_out_sentence({"comparison": judged["comparison"]})
    assert "the same ones that chose the training step, so the figure is optimistic" in old


def test_kept_tokens_that_cost_bits_are_counted():
    """Selection removes only what the model needs to be below the base (issue 26): the tokens it
    keeps although they cost bits where used are said, with why they stay."""
    costly = copy.deepcopy(MEDICAL)
    costly["selection"]["effects"] = {"a": {"occurrences": 4, "net_bits": 2.5}, "b": {"occurrences": 9, "net_bits": -7.0},
                                      "c": {"occurrences": 0, "net_bits": 0.3}, "d": {"occurrences": 1, "net_bits": 0.1}}
    assert ("51% of the saving was given up. 2 of the kept tokens cost more bits than they save where used; they stay "
            "for the length they save, as the model is below the base model with them. The validation score"
            ) in selection_sentence(costly)
    assert "cost more bits" not in selection_sentence(MEDICAL)


# -- issue 37: what was scored, and a model nobody judged --------------------------------------
def _card(metrics: dict) -> str:
    from types import SimpleNamespace

    from extension.publishing.card import model_card

    extension = {"vocab": {"base_vocab_size": 256, "vocab_size": 320, "tied": True}, "counts": {"terms_added": 1},
                 "terms": [], "selection": metrics.get("selection") or {}, "init": {"method": "subword_mean"}}
    before = {"general_bits_per_byte": 1.75, "general_tokens_per_byte": 0.237}
    return model_card(SimpleNamespace(base_model="smollm2-135m"), extension, {**metrics, "before": before, "after": before}, [])


BF16_JOB = {"devices": {"evaluate": {"device": "cpu", "dtype": "bfloat16"}, "publish": {"device": "cpu", "dtype": "float32"}}}


def test_the_precision_the_figures_were_measured_in_is_said_in_summary_page_and_card():
    """Issue 37 item 4: a bf16 job of an fp32 checkpoint scores the bf16 model; the user downloads fp32."""
    from app.pages.views import verdict

    for sentences in (decision_sentences(BF16_JOB, style="cli"), verdict(BF16_JOB)):
        said = [s for s in sentences if "figures were measured" in s]
        assert len(said) == 1 and "computing in bfloat16" in said[0] and "published weights are float32" in said[0]
    assert "computing in bfloat16; the published weights are float32" in _card(BF16_JOB)
    same = {"devices": {"evaluate": {"dtype": "float32"}, "publish": {"dtype": "float32"}}}
    assert decision_sentences(same) == ["The before/after figures were measured in float32, the published weights' dtype."]


SKIPPED = "the corpus validation split holds 1,200 bytes, under the 2,000 needed to decide on; the last training step and every term are published"


def test_a_model_published_without_judging_says_so_and_why():
    """Issue 37 item 5: under 2,000 bytes of validation text the gate publishes every term unjudged."""
    from app.pages.views import verdict

    metrics = {"selection": {"mode": "validation", "skipped": SKIPPED}}
    for sentences in (decision_sentences(metrics, style="cli"), verdict(metrics)):
        said = [s for s in sentences if "NOT judged" in s]
        assert len(said) == 1 and "1,200 bytes, under the 2,000 needed" in said[0]
    card = _card(metrics)
    assert card.count("NOT judged") == 1 and "1,200 bytes" in card
    # terms only: the way to have it judged is the user's own text
    terms_only = {"selection": {"mode": "validation", "skipped": "the held-out generated contexts holds 0 bytes"}}
    assert "`--corpus FILE`" in decision_sentences(terms_only, style="cli")[0]
    # which terms stay, undecided for want of the user's text: more terms would not decide it
    undecided = {"selection": {"mode": "validation", "terms_kept_unjudged": "no examples or corpus to decide on"}}
    sentence = decision_sentences(undecided, style="cli")[0]
    assert "`--examples FILE`" in sentence and "`--corpus FILE`" in sentence and "more terms" not in sentence
    # --keep-all-terms asked for no judging: nothing to warn about
    assert decision_sentences({"selection": {"mode": "none"}}) == []
