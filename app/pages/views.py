"""What the pages show, computed from the API's own objects (no HTML here, no FastAPI).

Each function takes what the API already has (the request schema, a job, its events, its
metrics, its published tide_extension.json) and returns plain values for the templates, so the
pages follow the API when it changes: the submit form is built from ExtendRequest's JSON schema,
the before/after table from whatever rows `metrics["comparison"]` holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from extension.publishing.decisions import decision_sentences
from extension.plan.spec import planned_stages

# The fields that say what a job works on; the form lays these out by hand (paste or upload).
# Every other field of the request schema is an option and is rendered from the schema.
SOURCE_FIELDS = ("base_model", "terms", "corpus_file_id", "corpus_text")
ACTIVE_STATUSES = frozenset({"queued", "running", "cancelling"})
STATUS_MARKS = {
    "queued": "○", "running": "▶", "cancelling": "■", "succeeded": "✓", "failed": "✗", "cancelled": "■",
}


# ---- the submit form, from the request schema ---------------------------------------------------


@dataclass
class FormField:
    param: str  # the JSON path the API names in its errors, e.g. training.steps
    label: str
    kind: str  # integer | number | string | boolean | json
    default: Any
    description: str | None
    limits: str | None  # "1 – 512", "> 0": the allowed range in words

    @property
    def default_text(self) -> str:
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        return format_number(self.default) if isinstance(self.default, (int, float)) else str(self.default)

    @property
    def value(self) -> str:
        """The input's initial text: the default, written so it parses back to the same value."""
        if self.default is None or isinstance(self.default, bool):
            return ""
        return repr(self.default) if isinstance(self.default, float) else str(self.default)


@dataclass
class FormGroup:
    name: str  # the request field holding the group (training), "" for top-level options
    title: str
    description: str | None
    fields: list[FormField] = field(default_factory=list)


def _label(name: str, prop: dict) -> str:
    title = prop.get("title")
    automatic = name.replace("_", " ").title()
    return title if title and title != automatic else name.replace("_", " ")


def _kind(prop: dict) -> str:
    types = [prop.get("type")] + [option.get("type") for option in prop.get("anyOf", [])]
    for kind in ("boolean", "integer", "number", "string"):
        if kind in types:
            return kind
    return "json"


def _limits(prop: dict) -> str | None:
    props = [prop] + list(prop.get("anyOf", []))
    low = next((p["minimum"] for p in props if "minimum" in p), None)
    high = next((p["maximum"] for p in props if "maximum" in p), None)
    low_open = next((p["exclusiveMinimum"] for p in props if "exclusiveMinimum" in p), None)
    high_open = next((p["exclusiveMaximum"] for p in props if "exclusiveMaximum" in p), None)
    parts = []
    if low is not None and high is not None:
        return f"{format_number(low)} to {format_number(high)}"
    if low is not None:
        parts.append(f"at least {format_number(low)}")
    if low_open is not None:
        parts.append(f"more than {format_number(low_open)}")
    if high is not None:
        parts.append(f"at most {format_number(high)}")
    if high_open is not None:
        parts.append(f"less than {format_number(high_open)}")
    for p in props:
        if "minLength" in p or "maxLength" in p:
            parts.append(f"{p.get('minLength', 0)} to {p['maxLength']} characters" if "maxLength" in p else f"at least {p['minLength']} characters")
            break
    return ", ".join(parts) or None


def _field(param: str, name: str, prop: dict) -> FormField:
    return FormField(
        param=param, label=_label(name, prop), kind=_kind(prop), default=prop.get("default"),
        description=prop.get("description"), limits=_limits(prop),
    )


def _ref(prop: dict) -> str | None:
    ref = prop.get("$ref") or next((p.get("$ref") for p in prop.get("allOf", []) if "$ref" in p), None)
    return ref.rsplit("/", 1)[-1] if ref else None


def option_groups(request_model: type[BaseModel]) -> list[FormGroup]:
    """Every option of the request schema with its default, range and help, grouped as the API
    groups them (mining, training, evaluation, ...); top-level options come first."""
    schema = request_model.model_json_schema()
    definitions = schema.get("$defs", {})
    general = FormGroup("", "Job", None)
    groups = []
    for name, prop in schema.get("properties", {}).items():
        if name in SOURCE_FIELDS:
            continue
        ref = _ref(prop)
        if ref and definitions.get(ref, {}).get("type") == "object":
            definition = definitions[ref]
            groups.append(FormGroup(
                name=name, title=name.replace("_", " ").capitalize(), description=definition.get("description"),
                fields=[_field(f"{name}.{sub}", sub, sub_prop) for sub, sub_prop in definition.get("properties", {}).items()],
            ))
        else:
            general.fields.append(_field(name, name, prop))
    return ([general] if general.fields else []) + groups


def source_fields(request_model: type[BaseModel]) -> dict[str, FormField]:
    """The source fields' labels and help, from the same schema."""
    properties = request_model.model_json_schema().get("properties", {})
    return {name: _field(name, name, properties[name]) for name in SOURCE_FIELDS if name in properties}


# ---- numbers, sizes, ages -----------------------------------------------------------------------


def format_number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) < 0.001:
        return f"{value:.3g}"
    return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) >= 1 else f"{value:.4g}"


def format_bytes(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} bytes"


def format_age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return ""
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


# ---- the job list -------------------------------------------------------------------------------


def job_counts(request: dict, result: dict | None) -> str:
    """What the job adds, in words: the request's terms or corpus, then what was added."""
    counts = (result or {}).get("counts") or {}
    if "terms_added" in counts:
        text = f"{counts['terms_added']:,} terms, {counts.get('new_vocab_entries', 0):,} new tokens"
        if counts.get("skipped"):
            text += f", {counts['skipped']:,} skipped"
        return text
    terms = request.get("terms")
    parts = []
    if terms:
        parts.append(f"{len(terms):,} term" + ("" if len(terms) == 1 else "s"))
    if request.get("corpus_file_id"):
        parts.append("corpus")
    return " + ".join(parts)


# ---- the job page -------------------------------------------------------------------------------


@dataclass
class StageStep:
    name: str
    state: str  # done | current | pending | stopped
    started_at: datetime | None = None
    seconds: float | None = None

    @property
    def mark(self) -> str:
        return {"done": "✓", "current": "▶", "pending": "○", "stopped": "✗"}[self.state]


def timeline(status: str, request: dict, stage_events: list[tuple[str, datetime]], finished_at: datetime | None, now: datetime) -> list[StageStep]:
    """Every stage this job goes through, in order, with its start time and duration so far."""
    planned = planned_stages(request)
    seen: dict[str, datetime] = {}
    for name, moment in stage_events:
        seen.setdefault(name, moment)
    for name in seen:  # a stage the plan did not foresee still shows
        if name not in planned:
            planned.append(name)
    reached = [name for name in planned if name in seen]
    current = reached[-1] if reached else None
    steps = []
    for index, name in enumerate(planned):
        if name not in seen:
            steps.append(StageStep(name, "pending"))
            continue
        started = seen[name]
        later = [seen[n] for n in planned[index + 1:] if n in seen]
        if later:
            steps.append(StageStep(name, "done", started, (min(later) - started).total_seconds()))
        elif status == "succeeded":
            steps.append(StageStep(name, "done", started, ((finished_at or now) - started).total_seconds()))
        elif status in ACTIVE_STATUSES and name == current:
            steps.append(StageStep(name, "current", started, (now - started).total_seconds()))
        else:
            steps.append(StageStep(name, "stopped", started, ((finished_at or now) - started).total_seconds()))
    return steps


@dataclass
class LossCurve:
    points: list[tuple[int, float]]
    total_steps: int
    width: int = 600
    height: int = 220
    left: int = 76  # room for a loss label such as 10.123 at the chart's font size
    bottom: int = 34
    top: int = 12
    right: int = 12

    @property
    def low(self) -> float:
        return min(loss for _, loss in self.points)

    @property
    def high(self) -> float:
        return max(loss for _, loss in self.points)

    def _xy(self, step: int, loss: float) -> tuple[float, float]:
        span_x = max(self.total_steps, max(s for s, _ in self.points), 1)
        span_y = (self.high - self.low) or 1.0
        x = self.left + (self.width - self.left - self.right) * step / span_x
        y = self.top + (self.height - self.top - self.bottom) * (self.high - loss) / span_y
        return round(x, 1), round(y, 1)

    @property
    def polyline(self) -> str:
        return " ".join(f"{x},{y}" for x, y in (self._xy(s, v) for s, v in self.points))

    @property
    def dots(self) -> list[tuple[float, float]]:
        return [self._xy(s, v) for s, v in self.points] if len(self.points) <= 60 else []

    @property
    def summary(self) -> str:
        (first_step, first), (last_step, last) = self.points[0], self.points[-1]
        return f"Training loss: {format_number(first)} at step {first_step}, {format_number(last)} at step {last_step} (lowest {format_number(self.low)})"


def loss_curve(metrics: dict | None, progress_payloads: list[dict], total_steps: int) -> LossCurve | None:
    """The finished job's full history when it has one, else the progress events seen so far."""
    history = ((metrics or {}).get("training") or {}).get("history") or progress_payloads
    points = [
        (int(record["step"]), float(record["loss"]))
        for record in history
        if isinstance(record.get("step"), int) and isinstance(record.get("loss"), (int, float)) and math.isfinite(record["loss"])
    ]
    if not points:
        return None
    points = sorted(dict(points).items())
    return LossCurve(points=points, total_steps=total_steps)


def humanise(key: str) -> str:
    return key.replace("_", " ")


# Direction words make the table readable without colour. A metric not listed gets no word.
_LOWER_IS = {"bits_per_byte": ("better", "worse"), "tokens_per_byte": ("shorter", "longer"), "bits_per_token": ("better", "worse")}


@dataclass
class ComparisonRow:
    key: str
    label: str
    before: str
    after: str
    change: str
    direction: str


def _direction(key: str, before: Any, after: Any) -> str:
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)) or before == after:
        return "same" if before == after else ""
    for suffix, (down, up) in _LOWER_IS.items():
        if key.endswith(suffix):
            return down if after < before else up
    return ""


def _shown(key: str, value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key.endswith(("usage", "_share", "_fraction")):
        return f"{value * 100:.2f}%"
    return format_number(value)


def comparison_rows(metrics: dict | None) -> list[ComparisonRow]:
    """One row per entry of the report's comparison, whatever entries it holds."""
    rows = []
    for key, row in ((metrics or {}).get("comparison") or {}).items():
        if not isinstance(row, dict):
            continue
        before, after = row.get("before"), row.get("after")
        ratio = row.get("ratio")
        if isinstance(ratio, (int, float)):
            change = f"{(ratio - 1) * 100:+.2f}%"
        elif isinstance(row.get("delta"), (int, float)):
            change = f"{row['delta']:+.4g}"
        else:
            change = ""
        rows.append(ComparisonRow(key, humanise(key), _shown(key, before), _shown(key, after), change, _direction(key, before, after)))
    return rows


def _stated(report: Any) -> str | None:
    if isinstance(report, str):
        return report
    if isinstance(report, dict):
        for name in ("message", "summary", "reason", "text"):
            if isinstance(report.get(name), str):
                return report[name]
    return None


def _percent(row: dict) -> float | None:
    ratio = row.get("ratio")
    return (ratio - 1) * 100 if isinstance(ratio, (int, float)) else None


def verdict(metrics: dict | None) -> list[str]:
    """The before/after result in words. A report that states its own verdict is quoted."""
    if not metrics:
        return []
    for name in ("verdict", "decision", "selection"):
        stated = _stated(metrics.get(name))
        if stated:
            return [stated]
    comparison = metrics.get("comparison") or {}
    sentences = []
    domain = comparison.get("domain_bits_per_byte")
    if domain and _percent(domain) is not None:
        change = _percent(domain)
        if domain["after"] < domain["before"]:
            sentences.append(f"Better on your held-out domain text: bits per byte fell {abs(change):.2f}% "
                             f"({format_number(domain['before'])} → {format_number(domain['after'])}).")
        elif domain["after"] > domain["before"]:
            sentences.append(f"Worse on your held-out domain text: bits per byte rose {change:.2f}% "
                             f"({format_number(domain['before'])} → {format_number(domain['after'])}); "
                             "the extended model predicts your text less well than the base model.")
        else:
            sentences.append("Unchanged on your held-out domain text (same bits per byte).")
    else:
        sentences.append("No held-out domain text was scored (a terms-only job), so quality on your domain is not measured.")
    length = comparison.get("domain_tokens_per_byte")
    if length and _percent(length) is not None:
        change = _percent(length)
        if round(change, 2) == 0:
            sentences.append("Your text takes as many tokens as before (the held-out text hardly uses the new tokens).")
        else:
            sentences.append(f"Your text takes {abs(change):.2f}% {'fewer' if change < 0 else 'more'} tokens.")
    general = comparison.get("general_bits_per_byte")
    if general and _percent(general) is not None:
        change = _percent(general)
        word = "better" if change < 0 else "worse" if change > 0 else "unchanged"
        sentences.append(f"General English is {word}: bits per byte {change:+.2f}% "
                         f"({format_number(general['before'])} → {format_number(general['after'])}).")
    # why training stopped, what selection kept and gave up, a terms-only job against the base:
    # the same sentences as the CLI summary and the model card, naming options as the API does
    return sentences + decision_sentences(metrics, style="api")


def other_metrics(metrics: dict | None) -> dict[str, Any]:
    """The rest of the report, for a details section (the loss history is drawn, not listed)."""
    rest = {k: v for k, v in (metrics or {}).items() if k != "comparison"}
    training = rest.get("training")
    if isinstance(training, dict) and "history" in training:
        rest["training"] = {**{k: v for k, v in training.items() if k != "history"}, "history": f"{len(training['history'])} steps (drawn above)"}
    return rest


@dataclass
class TermRow:
    term: str
    mechanism: str
    pieces: list[str]  # the term's tokens in the base tokenizer, one string per form
    ids: list[int]
    notes: list[str]


_TERM_KNOWN = {"term", "mechanism", "forms", "existing_forms", "intermediates"}


def term_rows(extension: dict | None, limit: int = 300) -> tuple[list[TermRow], int, list[dict]]:
    """(rows, how many more terms there are, skipped terms) from tide_extension.json. Fields a
    later version adds to a term (kept / removed and why) show up as notes."""
    if not extension:
        return [], 0, []
    terms = extension.get("terms") or []
    rows = []
    for entry in terms[:limit]:
        forms = entry.get("forms") or {}
        pieces, ids = [], []
        for form in forms.values():
            if isinstance(form, dict):
                pieces.append(" + ".join(str(p) for p in form.get("original_pieces") or []))
                if isinstance(form.get("id"), int):
                    ids.append(form["id"])
        notes = [f"{humanise(k)}: {v}" for k, v in entry.items() if k not in _TERM_KNOWN and isinstance(v, (str, int, float, bool))]
        rows.append(TermRow(str(entry.get("term", "")), str(entry.get("mechanism", "")), pieces, ids, notes))
    return rows, max(0, len(terms) - limit), list(extension.get("skipped") or [])


def load_lines(folder: str, base_url: str, job_id: str) -> str:
    """Copy-paste lines: fetch the archive, unpack it, load the model in transformers."""
    return "\n".join([
        "# with the tide client (TIDE_URL and TIDE_API_KEY set): resumes, checks sha256",
        f"tide jobs download {job_id} --out .",
        "# or with curl",
        f'curl -fL -C - -H "Authorization: Bearer $TIDE_API_KEY" -o {job_id}.tar {base_url}jobs/{job_id}/archive',
        f"tar -xf {job_id}.tar",
        "",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
        f'model = AutoModelForCausalLM.from_pretrained("{folder}")',
        f"# {folder}/adapter: the new rows as a PEFT adapter ({folder}/README.md says how to load it)",
    ])
