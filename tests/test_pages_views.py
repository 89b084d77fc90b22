"""What the pages show is derived, not listed: the form from the request schema, the before/after
table from whatever the report holds, the timeline from the pipeline's stage order."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pydantic import BaseModel, ConfigDict, Field

from app.pages import views
from app.schemas import ExtendRequest


def _params(groups) -> dict[str, views.FormField]:
    return {f.param: f for group in groups for f in group.fields}


def test_the_form_offers_every_option_of_the_request_schema_with_its_default():
    fields = _params(views.option_groups(ExtendRequest))
    expected = {}
    for name, info in ExtendRequest.model_fields.items():
        if name in views.SOURCE_FIELDS:
            continue
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            expected.update({f"{name}.{sub}": sub_info.get_default(call_default_factory=True) for sub, sub_info in annotation.model_fields.items()})
        else:
            expected[name] = info.get_default(call_default_factory=True)
    assert {param: field.default for param, field in fields.items()} == expected
    batch = fields["training.batch_size"]
    assert batch.kind == "integer" and batch.value == str(batch.default) and batch.limits
    # a default that depends on the worker's device: the input starts empty, the hint says each
    steps = fields["training.steps"]
    assert steps.kind == "integer" and steps.value == "" and steps.limits and "400 on a GPU" in steps.description
    assert fields["training.lr"].kind == "number" and fields["training.lr"].limits.startswith("more than 0")
    assert float(fields["training.lr"].value) == fields["training.lr"].default  # the input parses back


class _Safety(BaseModel):
    """A group added later."""

    model_config = ConfigDict(extra="forbid")
    max_regression: float = Field(0.0, ge=0, le=0.5, title="Largest allowed regression", description="Bits per byte a job may lose")
    enabled: bool = True
    patience: int = Field(3, ge=1)
    temperature: float = Field(1.0, gt=0, lt=10)


class _LaterRequest(ExtendRequest):
    safety: _Safety = Field(default_factory=_Safety)
    note: str | None = Field(None, max_length=20)


def test_a_new_option_group_shows_up_without_a_page_change():
    groups = views.option_groups(_LaterRequest)
    safety = next(group for group in groups if group.name == "safety")
    assert safety.description == "A group added later."
    by_param = {f.param: f for f in safety.fields}
    assert by_param["safety.max_regression"].label == "Largest allowed regression"
    assert by_param["safety.max_regression"].limits == "0 to 0.5"
    assert by_param["safety.enabled"].kind == "boolean" and by_param["safety.enabled"].default_text == "on"
    assert by_param["safety.patience"].limits == "at least 1"
    assert by_param["safety.temperature"].limits == "more than 0, less than 10"
    note = _params(groups)["note"]
    assert note.kind == "string" and note.limits == "0 to 20 characters" and note.value == ""


METRICS = {
    "comparison": {
        "domain_bits_per_byte": {"before": 2.0, "after": 1.9, "delta": -0.1, "ratio": 0.95},
        "domain_tokens_per_byte": {"before": 0.30, "after": 0.27, "delta": -0.03, "ratio": 0.9},
        "general_bits_per_byte": {"before": 1.0, "after": 1.001, "delta": 0.001, "ratio": 1.001},
        "domain_new_token_usage": {"after": 0.125},
        "test_bits_per_byte": {"before": 2.1, "after": 2.2, "delta": 0.1, "ratio": 2.2 / 2.1},
    },
    "training": {"steps": 3, "history": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 3, "loss": 2.75}]},
    "padding": {"padding_probability_max": 1e-6},
}


def test_every_comparison_row_is_shown_including_ones_added_later():
    rows = {row.key: row for row in views.comparison_rows(METRICS)}
    assert list(rows) == list(METRICS["comparison"])
    assert (rows["domain_bits_per_byte"].change, rows["domain_bits_per_byte"].direction) == ("-5.00%", "better")
    assert rows["domain_tokens_per_byte"].direction == "shorter"
    assert rows["test_bits_per_byte"].label == "test bits per byte" and rows["test_bits_per_byte"].direction == "worse"
    assert (rows["domain_new_token_usage"].before, rows["domain_new_token_usage"].after) == ("—", "12.50%")


def test_the_verdict_says_what_changed_in_words():
    sentences = views.verdict(METRICS)
    assert sentences[0].startswith("Better on your held-out domain text: bits per byte fell 5.00% (2 → 1.9)")
    assert sentences[1] == "Your text takes 10.00% fewer tokens."
    assert sentences[2].startswith("General English is worse: bits per byte +0.10%")
    worse = {"comparison": {"domain_bits_per_byte": {"before": 1.0, "after": 1.1, "ratio": 1.1}}}
    assert views.verdict(worse)[0].startswith("Worse on your held-out domain text")
    assert "terms-only job" in views.verdict({"comparison": {}})[0]
    # a report that states its own verdict (e.g. once selection decides what to publish) is quoted
    assert views.verdict({**METRICS, "verdict": {"message": "kept 40 of 50 terms"}}) == ["kept 40 of 50 terms"]


def test_the_rest_of_the_report_is_listed_without_the_history():
    rest = views.other_metrics(METRICS)
    assert rest["padding"] == METRICS["padding"] and rest["training"]["history"] == "3 steps (drawn above)"
    assert "comparison" not in rest


def test_the_loss_curve_prefers_the_full_history_and_falls_back_to_progress_events():
    curve = views.loss_curve(METRICS, [{"step": 1, "loss": 9.0}], total_steps=3)
    assert curve.points == [(1, 3.0), (2, 2.5), (3, 2.75)] and (curve.low, curve.high) == (2.5, 3.0)
    xs = [float(p.split(",")[0]) for p in curve.polyline.split()]
    ys = [float(p.split(",")[1]) for p in curve.polyline.split()]
    assert xs == sorted(xs) and ys[0] == curve.top and ys[1] == curve.height - curve.bottom  # highest at the top
    live = views.loss_curve(None, [{"step": 5, "loss": 4.0, "tokens_per_s": 1.0}, {"step": 2, "loss": 5.0}, {"step": 7, "loss": float("nan")}], total_steps=100)
    assert live.points == [(2, 5.0), (5, 4.0)]
    assert views.loss_curve(None, [], total_steps=10) is None


def test_the_timeline_follows_the_pipelines_stage_order():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda seconds: start + timedelta(seconds=seconds)  # noqa: E731
    terms = {"terms": ["x"], "training": {"steps": 0}}
    events = [("load", at(0)), ("extend", at(5)), ("init", at(6)), ("generate", at(7)), ("train", at(7))]
    running = views.timeline("running", terms, events, None, at(20))
    assert [(s.name, s.state) for s in running] == [
        ("load", "done"), ("extend", "done"), ("init", "done"), ("generate", "done"), ("train", "current"),
        ("select", "pending"), ("evaluate", "pending"), ("publish", "pending"),
    ]
    assert running[0].seconds == 5 and running[4].seconds == 13
    # a corpus without terms: mining extends the tokenizer, so "mine" stands where "extend" would
    mining = views.timeline("failed", {"corpus_file_id": "file_1"}, [("load", at(0)), ("mine", at(3))], at(9), at(30))
    assert [(s.name, s.state) for s in mining][:3] == [("load", "done"), ("mine", "stopped"), ("init", "pending")]
    assert mining[1].seconds == 6


def test_term_rows_show_pieces_ids_and_fields_added_later():
    extension = {
        "terms": [
            {"term": "hypertext", "mechanism": "merges", "forms": {" hypertext": {"id": 900, "original_pieces": ["Ġh", "yper", "text"]}},
             "kept": False, "reason": "raised bits per byte on validation"},
        ] * 3,
        "skipped": [{"term": "a", "reason": "single_token", "detail": "already one token"}],
    }
    rows, more, skipped = views.term_rows(extension, limit=2)
    assert len(rows) == 2 and more == 1 and skipped[0]["term"] == "a"
    assert rows[0].pieces == ["Ġh + yper + text"] and rows[0].ids == [900]
    assert rows[0].notes == ["kept: False", "reason: raised bits per byte on validation"]


def test_the_verdict_says_what_selection_gave_up_and_why_training_stopped_as_the_api_names_options():
    """The job page prints the CLI summary's and the card's sentences (extension/publishing/decisions.py),
    with options named by their request fields."""
    from tests.test_decisions import MEDICAL

    metrics = {**METRICS, **MEDICAL, "training": {**MEDICAL["training"], "steps": 30, "stopped": "validation_stalled",
                                                  "validation_patience": 2}}
    sentences = views.verdict(metrics)
    assert sentences[0].startswith("Better on your held-out domain text")
    assert "Stopped early after 30 of 40 steps: validation had not improved for 2 checks in a row." in sentences
    kept = next(s for s in sentences if s.startswith("Term selection kept 15 of the 300 new tokens offered"))
    assert "train longer (`training.steps: 80`) to keep more" in kept
