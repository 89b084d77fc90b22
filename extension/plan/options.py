"""Every option of a job, declared once: name, type, default, range, help and where it appears.

The CLI flags (app/cli_extend.py, app/cli_mine.py), the HTTP API's request schema (app/schemas.py,
and so /docs), `ExtendSpec` (extension/plan/spec.py) and the library's own checks are all built from
`OPTIONS`, so a new option is one entry here and the three can never disagree.

An error about an option is raised as `InvalidOptionError(option=name, problem=...)`; each caller
names the option the way its user knows it: the CLI as its flag (`--batch-size`), the API as its
JSON path (`training.batch_size`), the library as its name (`batch_size`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .device_options import DEVICE_MAP_STRATEGIES, DEVICES, MAP_DEVICES
from ..errors import InvalidOptionError


@dataclass(frozen=True)
class Option:
    name: str  # ExtendSpec field and library name
    kind: type  # int, float or str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # (minimum, maximum] instead of [minimum, maximum]
    # Where it sits in a POST /extend body: "root", or the group object "mining", "training" or
    # "evaluation"; None: not part of a request (server-side policy, a TIDE_* setting).
    api_group: str | None = "training"
    api_name: str | None = None  # field name inside its group (default: name)
    flag: str | None = None  # CLI flag (default: --name-with-dashes)
    choices: tuple[str, ...] | None = None  # str options: the accepted values (instead of a length range)
    # Where the best default depends on the machine that runs the job: (device kind, default)
    # pairs, e.g. (("cuda", 400),), the kinds being devices.Placement.defaults_kind's ('cuda',
    # 'cpu_bf16'); `default` holds on every other device. Such an option stays unset (None) in
    # requests and specs until the job knows its device (`defaults_for_device`).
    device_defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def unset_default(self) -> Any:
        """What a request or spec holds when the user gives no value: None while the device decides."""
        return None if self.device_defaults else self.default

    def default_on(self, device_type: str) -> Any:
        return dict(self.device_defaults).get(device_type, self.default)

    def defaults_for_setting(self, device: str, precision: str = "auto") -> list[Any]:
        """The defaults a job can get under a device setting (auto, cpu, cuda, cuda:N) and a
        precision setting (device_kinds)."""
        return sorted({self.default_on(kind) for kind in device_kinds(device, precision)})

    @property
    def default_text(self) -> str:
        """The default in words, e.g. '150 on a CPU, 400 on a GPU (cuda)'."""
        if not self.device_defaults:
            return str(self.default)
        others = ", ".join(f"{value} on {_DEVICE_WORDS.get(kind, kind)}" for kind, value in self.device_defaults)
        return f"{self.default} on a CPU, {others}"

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def api_path(self) -> str | None:
        if self.api_group is None:
            return None
        field = self.api_name or self.name
        return field if self.api_group == "root" else f"{self.api_group}.{field}"

    def valid_range(self) -> str:
        """The accepted values in words, e.g. 'an integer from 1 to 1024'."""
        if self.choices:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        if self.kind is str:
            return f"a string of {int(self.minimum or 0)} to {int(self.maximum)} characters"
        noun, low, high = "a number", f"{self.minimum:g}", f"{self.maximum:g}"
        if self.kind is int:
            noun, low, high = "an integer", f"{int(self.minimum):,}", f"{int(self.maximum):,}"
        if self.exclusive_minimum:
            return f"{noun} above {low} and at most {high}"
        return f"{noun} from {low} to {high}"

    def problem(self, value: Any) -> str | None:
        """None when `value` is acceptable, else what is wrong with it (without the option's name)."""
        if value is None and self.device_defaults:
            return None  # unset: the device's default, filled in where the job runs
        if self.choices:
            ok = isinstance(value, str) and value in self.choices
        elif self.kind is str:
            ok = isinstance(value, str) and self.minimum <= len(value) <= self.maximum
        else:
            ok = _is_number(value, integer=self.kind is int) and (
                (value > self.minimum if self.exclusive_minimum else value >= self.minimum) and value <= self.maximum
            )
        return None if ok else f"must be {self.valid_range()}, got {value!r}"

    def check(self, value: Any) -> None:
        problem = self.problem(value)
        if problem is not None:
            raise InvalidOptionError(option=self.name, problem=problem)


_DEVICE_WORDS = {"cuda": "a GPU (cuda)", "cpu_bf16": "a CPU that computes bf16 in hardware (AMX or AVX-512 BF16; precision auto)"}


def _is_number(value: Any, *, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


OPTIONS: tuple[Option, ...] = (
    # what is read from the corpus
    Option("corpus_text_field", str, "text", "JSONL field holding the text", 1, 100, api_group="root", flag="--text-field"),
    # mining (corpus jobs without terms)
    Option("max_new_tokens", int, 300, "most new vocabulary entries mining may add, intermediates included", 1, 50_000, api_group="mining"),
    Option("min_frequency", int, 3, "a mined candidate must occur at least this often in the corpus", 1, 1_000_000, api_group="mining"),
    Option("mining_unit", str, "pairs",
           "what mining joins: 'pairs' continues the base tokenizer's BPE (the most frequent adjacent pieces, word "
           "fragments included); 'words' makes whole words (pre-tokens) single tokens, most tokens saved first, adding "
           "only the intermediates their merges need", choices=("pairs", "words"), api_group="mining"),
    # tokenizer and rows
    Option("max_term_chars", int, 64, "longest accepted term, in characters (on the service: the TIDE_MAX_TERM_CHARS setting)", 1, 1024, api_group=None),
    Option("pad_to_multiple_of", int, 64, "pad the vocabulary up to a multiple of this (1: no padding)", 1, 4096, api_group="root"),
    # Where the new tokens' ids come from (issue 40 item 2; extension/tokenizer/reserved.py). The
    # job trains on appended ids either way; 'reserved' moves the chosen rows onto reserved ids
    # before evaluation, so what is evaluated is what is published. 'auto' (issue 40 item 1) exists
    # because an appended id is not text on every model: Gemma 3n routes ids past its per-layer
    # table to the vision/audio embedders (extension/plan/new_ids.py), so there only reserved ids work.
    Option("new_ids", str, "auto",
           "where new tokens get their ids: 'append' after every id in use (the embedding grows, padded as "
           "pad_to_multiple_of says); 'reserved' on the tokenizer's reserved unused tokens (Gemma's <unusedN>, Llama "
           "3's <|reserved_special_token_N|>), which become the new tokens, so the embedding keeps its size; a job "
           "that needs more than are free is refused before any weights are read; 'auto': 'reserved' for a model "
           "whose own forward does not treat appended ids as text (Gemma 3n: ids past its per-layer embedding table "
           "go to the vision/audio embedders; the job's report says so), 'append' for every other model. 'append' "
           "on such a model is refused", choices=("auto", "append", "reserved"), api_group="root"),
    # initial rows (extension/rows/init.py, extension/rows/composition.py, extension/training/input_distillation.py);
    # measured in benchmarks/init_methods.py and, for 'distill' and 'subword_mean_norm' against the
    # composition, benchmarks/results/quality_{es,foldoc}_init_peers.md (chosen on those two only):
    # distill -6.03% / -1.93% against the base with every mined token kept, composition -4.79% /
    # -1.86% keeping 300 / 22 of them.
    Option("init", str, "auto",
           "how a new row starts from its original pieces' rows: 'composition' composes them the way the base "
           "vocabulary's own merges compose (a regression fitted on them; tokenizers without merges fall back to the "
           "mean), 'subword_mean' takes their mean, 'subword_mean_norm' rescales that mean to its pieces' mean norm; "
           "'distill' starts from the composition and, before training, distils the input rows so the model reads "
           "the text after each new token as it reads it after the original pieces (AweDist; trained jobs only); "
           "'subword_mean_distill' starts from the mean and distils the input rows the same way on the job's "
           "contexts while holding each tied row's logits where the mean put them (terms-only or trained jobs); "
           "'auto': distill for a trained corpus job, composition for a trained terms-only job (it starts training "
           "closer to where it ends), subword_mean_distill for a terms-only job of 0 steps, the mean for a corpus "
           "job of 0 steps (untrained, composed rows take more probability where they are not the answer)",
           choices=("auto", "composition", "subword_mean", "subword_mean_norm", "distill", "subword_mean_distill")),
    # Chosen with the CPU's steps on Spanish and FOLDOC: 2 contexts and 150 steps scored -7.00% /
    # -2.19% against the base where 4 and 100 scored -6.24% / -1.77%, every token kept either way
    # (quality_es_budget_candidate.md, quality_foldoc_budget.md), in 1.47x / 1.15x the composed
    # start's CPU time (issue 26's bound is 1.5x); the time the distillation gave up buys the steps.
    # Judged on CMake, the Perl manual and Chinese: quality_{cmake,perl,zh}_budget_restore.md.
    # Before: 4 against 8 contexts (quality_{es,foldoc}_distill_contexts.md).
    Option("distill_contexts", int, 2, "contexts per new token the input distillation reads (init 'distill'; "
           "AweDist uses up to 100): fewer cost less time, more train rare tokens' rows more", 1, 1000),
    # training of the new rows
    # 400 on a GPU, where they are cheap (benchmarks/results/quality_<domain>.md at 100 steps,
    # quality_<domain>_400steps.md at 400, SmolLM2, five domains): at 400 every domain keeps all
    # 300 mined tokens and all of their saving, and its test bits per byte are lower than at 100
    # everywhere but Chinese (-2.60% against the base vs -3.03%, which kept 163 tokens, 44.7% of
    # the saving); at 100 FOLDOC and the Perl manual keep 22 and 21. A CPU takes 150 (with 2
    # distillation contexts per token, above): 400 take four times as long there. A CPU that
    # computes bf16 in hardware (precision 'auto', devices.Placement.defaults_kind 'cpu_bf16')
    # steps in about 0.57x the time (benchmarks/results/bf16_step.md), so it takes 250: what
    # issue 26's 1.5x of the composed start's CPU time allows there with the distillation
    # (benchmarks/results/quality_<domain>_cpu_bf16.md; at 150 fp32 steps Chinese kept 61.5%).
    Option("steps", int, 150, "optimizer steps over the new rows (0: initialise them only; unset: the device's "
           "default; for a terms-only job without examples, 0 where the device writes fewer than 100 contexts per "
           "term, else at least the steps that read them all)", 0, 1_000_000, device_defaults=(("cpu_bf16", 250), ("cuda", 400))),
    Option("batch_size", int, 4, "sequences per training step", 1, 1024),
    Option("seq_len", int, 128, "tokens per training sequence (at most the model's context)", 8, 131_072),
    # Chosen on Spanish and FOLDOC only (benchmarks/results/init_methods.md: every mined token kept,
    # 100 steps, validation bits per byte vs the base): subword-mean rows +0.80% / +1.32% at the old
    # 1e-4, +0.03% / +0.49% composed; at 8e-4 -2.56% / +0.24% mean, -3.26% / -0.61% composed.
    # At the current CPU defaults 2e-3 scored worse on Spanish (-5.94% against -7.00%) and Chinese
    # (60.8% of the saving against 61.5%): quality_{es,zh}_lr2e-3.md.
    Option("lr", float, 8e-4, "base learning rate", 0, 1.0, exclusive_minimum=True),
    Option("embedding_lr_multiplier", float, 5.0, "learning-rate multiplier for the new input rows (sparse gradients)", 0, 100.0, exclusive_minimum=True),
    Option("weight_decay", float, 0.0, "AdamW weight decay on the new rows", 0, 1.0),
    Option("warmup_steps", int, 10, "linear learning-rate warmup steps before the cosine decay", 0, 1_000_000),
    Option("grad_clip", float, 1.0, "clip the new rows' gradient norm to this (0: no clipping)", 0, 1000.0),
    Option("seed", int, 0, "random seed (batches, generated contexts)", 0, 2**31 - 1),
    # A budget by time beside the one by steps (issue 26): a CPU job that can afford its steps takes
    # them, a large one stops when it must. Both stop the loop only; the learning-rate schedule is
    # still planned over `steps`, and neither is part of the run key, so a job resumed with a bigger
    # budget continues where it stopped.
    Option("max_train_seconds", int, 7200, "stop training once this many seconds of wall time have gone into it, "
           "validation included, across resumes (the rows of the best validated step are published as usual; "
           "unset: the device's default)", 1, 10_000_000, device_defaults=(("cuda", 3600),)),
    Option("validation_patience", int, 0, "stop training after this many validation checks in a row without a "
           "better score (0: never; only where the job has validation text)", 0, 1000),
    Option("checkpoint_every", int, 50, "steps between checkpoints in the work folder (0: only at the end)", 0, 1_000_000),
    # terms-only jobs: the contexts the base model writes for each term (extension/training/term_contexts.py).
    # Token Distillation (arXiv 2505.20133) writes 100 of 50 tokens per new token, affordable on a
    # GPU; a CPU writes what its time allows (benchmarks/results/context_writing.md: 64-token
    # contexts at about 0.4 s each there). Never more than training reads (steps x batch_size).
    Option("term_contexts", int, 4, "contexts per term a terms-only job trains on: snippets of the examples around the "
           "term first, then contexts the base model writes (at most what the training steps read; unset: the "
           "device's default)", 1, 1000, device_defaults=(("cuda", 100),)),
    Option("term_context_tokens", int, 64, "tokens the base model writes after each prompt of a terms-only job "
           "(unset: the device's default)", 8, 1024, device_defaults=(("cuda", 50),)),
    Option("term_prompts", str, "list",
           "what a terms-only job asks the base model to continue: 'list' alternates the term after a few other terms "
           "of the list (which sets the language and domain) and the term alone; 'term' always the term alone (Token "
           "Distillation's prompt); 'templates' five English frames around the term (the earlier default)",
           choices=("list", "term", "templates")),
    # what is published (extension/selection): the best validation step and the terms that pay
    Option("selection", str, "validation",
           "'validation': publish the training step (step 0, the init, included) that scores best on the validation "
           "split, and in corpus jobs drop the terms that cost more bits than they save; 'none': the last step, every term",
           choices=("validation", "none"), api_group="root"),
    # Once a selection round passes, removed tokens are offered back (selection/terms.restore_units).
    # Each restore buys length with bits; below the base alone let Chinese's judging half drift
    # 1.5024 -> 1.5208 -> 1.5269 bits per byte over its kept restores (issue 37 item 3). 0 (no
    # worse than the selection that passed): on Chinese, the one domain that restores at the
    # defaults, 0.01 kept 10 more tokens for -5.89% instead of -6.67% on the test split
    # (quality_zh_restore_tolerance.md). The other four keep every token, so no restore runs there.
    Option("restore_tolerance", float, 0.0, "how much worse, as a fraction of its bits per byte, the judging half of "
           "the validation text may read with removed tokens brought back than with the selection that passed (0: no "
           "worse; 0.01: up to a hundredth worse for the shorter text)", 0, 1.0, api_group="root"),
    # evaluation
    Option("eval_max_bytes", int, 50_000, "bytes of held-out domain text, and of general text, scored before and after",
           1000, 100_000_000, api_group="evaluation", api_name="max_bytes", flag="--eval-bytes"),
    # where the job runs (the operator's choice: on the service, the TIDE_DEVICE / TIDE_DEVICE_MAP
    # settings). The values are checked where the job runs (extension/plan/devices.py), which is the
    # only place that knows whether a GPU is there.
    Option("device", str, "auto", f"device every stage runs on: {', '.join(DEVICES)} (auto: the worker's GPU, cuda:0, "
           "when it has one, else cpu) (on the service: the TIDE_DEVICE setting)", 1, 16, api_group=None),
    # bf16 on these CPUs (AMX): a SmolLM2 training step in 0.57x the fp32 step's time
    # (benchmarks/results/bf16_step.md), which buys the CPU's bf16 steps default above.
    Option("precision", str, "auto", "what the frozen base model computes in: 'auto': bf16 where the device computes "
           "it in hardware (a GPU that supports it, a CPU with AMX or AVX-512 BF16), else the checkpoint's own dtype; "
           "'checkpoint': always the checkpoint's own dtype (slower on those devices). The published weights are the "
           "checkpoint's own either way (on the service: the TIDE_PRECISION setting)", choices=("auto", "checkpoint"),
           api_group=None),
    Option("device_map", str, "none", "spread the frozen base model over several devices with accelerate: none (all of it "
           f"on --device), {', '.join(DEVICE_MAP_STRATEGIES)} (accelerate's strategies over every visible GPU, then CPU "
           f"memory), or a JSON object {{module: device}} (devices: {', '.join(MAP_DEVICES)}) (on the service: the "
           "TIDE_DEVICE_MAP setting)", 1, 10_000, api_group=None),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
DEFAULTS: dict[str, Any] = {option.name: option.default for option in OPTIONS}  # on a CPU


def device_kinds(device: str, precision: str = "auto") -> list[str]:
    """Which devices' defaults (Option.device_defaults) a job can get under a device setting (auto,
    cpu, cuda, cuda:N) and a precision setting: with device auto, each worker's own device decides;
    with cpu and precision auto, whether the worker's CPU computes bf16 in hardware decides."""
    cpu = ["cpu", "cpu_bf16"] if precision == "auto" else ["cpu"]
    if device == "auto":
        return [*cpu, "cuda"]
    return cpu if device == "cpu" else [device.split(":")[0]]


def device_decisions(values: Any, device_type: str) -> dict[str, Any]:
    """What a job on this device fills in for the options `values` leaves unset: each option's
    device default, and a terms-only job's steps (terms_only_steps). `values` has the options as
    attributes, and `terms`, `corpus_path`, `examples`."""
    defaults = defaults_for_device(values, device_type)
    defaults.update(terms_only_steps(values, defaults))
    return defaults


def planned_steps(values: Any, device_type: str) -> int:
    """The steps a job takes on a device: as asked, else what the device decides."""
    return device_decisions(values, device_type).get("steps", getattr(values, "steps", None))


def defaults_for_device(values: Any, device_type: str) -> dict[str, Any]:
    """The device's default of every option `values` leaves unset (None), by name: what a job
    fills in once it knows where it runs (device_type: torch's, "cpu" or "cuda")."""
    return {option.name: option.default_on(device_type) for option in OPTIONS
            if option.device_defaults and getattr(values, option.name, None) is None}


# A terms-only job with no text of the user's trains its rows on contexts the base model writes.
# At a CPU's few contexts per term that made the domain's text worse than the untrained rows do
# (benchmarks/results/terms_only_{es,foldoc}.md: the output side loses), and so did a GPU's 400
# steps x 4 sequences, which read 16 per term of a 100-word glossary (+2.74% against +0.84%
# untrained, benchmarks/results/terms_only_es_gpu_default.md). Every one of Token Distillation's
# 100 per term read made a 30-word glossary -0.49% where the untrained rows are -0.11%
# (terms_only_es_gpu_default_30_terms.md, 750 steps). So such a job trains only where it writes
# 100 per term, and then takes the steps that read them all.
TERMS_ONLY_TRAINING_CONTEXTS = 100


def terms_only_steps(values: Any, device_defaults: dict[str, Any]) -> dict[str, Any]:
    """The steps of a terms-only job without examples that leaves `steps` to its device: 0 where the
    device writes fewer than TERMS_ONLY_TRAINING_CONTEXTS contexts per term, else at least the steps
    that read every one (batch_size sequences a step); {} for any other job."""
    if (getattr(values, "steps", None) is not None or getattr(values, "corpus_path", None) is not None
            or getattr(values, "examples", None)):
        return {}
    asked = device_defaults.get("term_contexts", getattr(values, "term_contexts", None))
    steps = device_defaults.get("steps")
    if asked is None or steps is None:
        return {}
    if asked < TERMS_ONLY_TRAINING_CONTEXTS:
        return {"steps": 0}
    terms = len(set(getattr(values, "terms", None) or []))
    batch_size = getattr(values, "batch_size", DEFAULTS["batch_size"])
    reading_all = -(-terms * asked // batch_size)
    return {"steps": reading_all} if reading_all > steps else {}


def check_options(values: Any, names: list[str] | None = None) -> None:
    """Check the named options (default: every option) on an object that has them as attributes;
    with every option, also the combinations that cannot run together (check_combinations)."""
    for name in names or list(BY_NAME):
        if hasattr(values, name):
            BY_NAME[name].check(getattr(values, name))
    if names is None:
        check_combinations(values)


def check_combinations(values: Any) -> None:
    """Options each valid alone that cannot run together: refused, never quietly replaced by
    something else (a job records what ran, so a substitute would be recorded as asked)."""
    init, steps = getattr(values, "init", None), getattr(values, "steps", None)
    if init == "distill" and steps == 0:
        # distillation reads the training texts, which a job of 0 steps never makes
        raise InvalidOptionError(option="init", problem=(
            "'distill' distils the input rows on the job's training texts, and a job of 0 steps makes none: "
            "train (steps above 0) or choose 'composition', the rows 'distill' starts from"))
    if init == "subword_mean_distill" and steps == 0 and getattr(values, "corpus_path", None) is not None:
        # a terms-only job of 0 steps writes its contexts anyway; a corpus job of 0 steps cuts no windows
        raise InvalidOptionError(option="init", problem=(
            "'subword_mean_distill' distils the input rows on the job's training texts, and a corpus job of 0 steps "
            "cuts none: train (steps above 0) or choose 'subword_mean', the rows it starts from"))


def by_api_path(path: str) -> Option | None:
    for option in OPTIONS:
        if option.api_path == path:
            return option
    return None


def option_error_for(exc: InvalidOptionError, *, style: str) -> tuple[str, str | None]:
    """(message, param) of an option error as a caller knows the option: style 'cli' or 'api'."""
    option = BY_NAME.get(exc.option or "")
    if option is None:
        return exc.message, exc.param
    label = option.cli_flag if style == "cli" else (option.api_path or f"the server setting TIDE_{option.name.upper()}")
    param = exc.param if style == "api" and option.api_path is None else label
    return f"{label} {exc.problem}", param
