"""The rows training loop: exact resume, cancel, frozen base, validation, window sampling."""

from __future__ import annotations

import copy

import pytest
import torch

from extension.errors import InvalidCorpusError, InvalidOptionError, JobCancelled
from extension.rows.init import NewRows, is_tied
from extension.rows.adapter import attach
from extension.plan.spec import Callbacks
from extension.training.loop import (
    CHECKPOINT_NAME,
    TokenWindows,
    TrainConfig,
    max_positions,
    train_rows,
)

from .conftest import tiny_llama

BASE_VOCAB, NEW, DIM = 240, 6, 32


def _stream(length=4000, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, BASE_VOCAB, (length,), generator=g)
    spots = tokens[40:-40:37]  # away from the ends, where a window cannot be centred
    spots[:] = BASE_VOCAB + torch.arange(len(spots)) % NEW
    return tokens


def _setup(tied: bool, seed: int = 0):
    model = tiny_llama(tied=tied, seed=seed)
    rows = NewRows(input=torch.zeros(NEW, DIM), output=None if tied else torch.zeros(NEW, DIM))
    return model, attach(model, BASE_VOCAB, rows)


CONFIG = dict(steps=12, batch_size=2, seq_len=16, warmup_steps=3, checkpoint_every=4)


def _train(tied, work_dir=None, cancel_after=None, sampling="mixed", **overrides):
    model, adapter = _setup(tied)
    config = TrainConfig(**{**CONFIG, **overrides})
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=config.batch_size,
                        seq_len=config.seq_len, seed=config.seed, sampling=sampling)
    progress: list[tuple[int, int, dict]] = []
    callbacks = Callbacks(
        work_dir=work_dir,
        on_progress=lambda step, total, metrics: progress.append((step, total, metrics)),
        should_cancel=lambda: cancel_after is not None and len(progress) >= cancel_after,
    )
    return model, adapter, train_rows(model, adapter, data, config, callbacks), progress


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_resume_is_exact(tied, tmp_path):
    _, _, straight, _ = _train(tied, tmp_path / "a")
    with pytest.raises(JobCancelled):
        _train(tied, tmp_path / "b", cancel_after=5)
    saved = torch.load(tmp_path / "b" / CHECKPOINT_NAME, weights_only=False)
    assert saved["step"] == 5
    _, _, resumed, progress = _train(tied, tmp_path / "b")
    assert resumed.resumed_from == 5 and [p[0] for p in progress] == list(range(6, 13))
    assert torch.equal(straight.rows.input, resumed.rows.input)
    if not tied:
        assert torch.equal(straight.rows.output, resumed.rows.output)
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]
    assert not torch.equal(straight.rows.input, torch.zeros(NEW, DIM))


def test_cancel_stops_between_steps(tmp_path):
    with pytest.raises(JobCancelled):
        _train(True, tmp_path / "cancelled", cancel_after=3)
    assert torch.load(tmp_path / "cancelled" / CHECKPOINT_NAME, weights_only=False)["step"] == 3
    # a finished run resumes as done: no step is repeated
    _train(True, tmp_path / "done", steps=3)
    _, _, result, progress = _train(True, tmp_path / "done", steps=3)
    assert result.steps_done == 3 and progress == []


def test_more_steps_start_fresh_because_the_schedule_changes(tmp_path):
    """The cosine schedule depends on the total: rows from a 4-step run are not step 4 of 12."""
    _train(True, tmp_path, steps=4)
    warnings = []
    model, adapter = _setup(True)
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16, sampling="mixed")
    result = train_rows(model, adapter, data, TrainConfig(**CONFIG), Callbacks(work_dir=tmp_path, on_warning=warnings.append))
    assert result.resumed_from == 0 and "differs in: steps)" in warnings[0]
    _, _, straight, _ = _train(True, steps=12)
    assert torch.equal(result.rows.input, straight.rows.input)


def test_checkpoint_for_other_data_or_model_is_ignored(tmp_path):
    _train(True, tmp_path, steps=4)
    warnings = []
    model, adapter = _setup(True)
    other_data = TokenWindows(_stream().flip(0), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16, sampling="mixed")
    result = train_rows(model, adapter, other_data, TrainConfig(**{**CONFIG, "steps": 4}),
                        Callbacks(work_dir=tmp_path, on_warning=warnings.append), identity={"base_model": "other"})
    assert result.resumed_from == 0 and "differs in: base_model, data)" in warnings[0]


def test_progress_reports_loss_speed_and_lr():
    _, _, result, progress = _train(True, steps=4)
    assert [(step, total) for step, total, _ in progress] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(set(metrics) == {"loss", "tokens_per_s", "lr"} for _, _, metrics in progress)
    assert all(metrics["tokens_per_s"] > 0 and metrics["loss"] > 0 for _, _, metrics in progress)
    assert result.history[-1]["tokens"] == 2 * 16


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_every_old_parameter_is_untouched(tied):
    model = tiny_llama(tied=tied)
    before = copy.deepcopy(model.state_dict())
    adapter = attach(model, BASE_VOCAB, NewRows(input=torch.zeros(NEW, DIM), output=None if tied else torch.zeros(NEW, DIM)))
    config = TrainConfig(**CONFIG)
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16)
    train_rows(model, adapter, data, config)
    adapter.merge()
    assert is_tied(model) == tied
    for key, value in model.state_dict().items():
        assert torch.equal(value[:BASE_VOCAB] if value.shape[:1] == (256,) else value,
                           before[key][:BASE_VOCAB] if value.shape[:1] == (256,) else before[key]), key
    assert not torch.equal(model.get_input_embeddings().weight[BASE_VOCAB:BASE_VOCAB + NEW], torch.zeros(NEW, DIM))


def test_checkpoint_of_another_run_is_ignored(tmp_path):
    _train(True, tmp_path, steps=4)
    warnings = []
    model, adapter = _setup(True)
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16, sampling="mixed")
    result = train_rows(model, adapter, data, TrainConfig(**{**CONFIG, "steps": 4, "lr": 2e-3}),
                        Callbacks(work_dir=tmp_path, on_warning=warnings.append))
    assert result.resumed_from == 0 and "differs in: lr)" in warnings[0]


def test_lr_schedule_warms_up_then_decays():
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10)
    lrs = [config.lr_at(s) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_embedding_rows_get_the_lr_multiplier():
    _, adapter = _setup(False)
    from extension.training.loop import param_groups

    groups = param_groups(adapter, TrainConfig(embedding_lr_multiplier=5, weight_decay=0.0))
    assert [(g["name"], g["lr_scale"], g["weight_decay"]) for g in groups] == [
        ("input_rows", 5, 0.0), ("output_rows", 1.0, 0.0)]


@pytest.mark.parametrize(
    "field, value, flag",
    [("steps", -1, "--steps"), ("seq_len", 257, "--seq-len"), ("batch_size", 0, "--batch-size"),
     ("lr", 0.0, "--lr"), ("weight_decay", -0.1, "--weight-decay")],
)
def test_bad_values_name_the_option_and_range(field, value, flag):
    from extension.plan.options import option_error_for

    model = tiny_llama()
    with pytest.raises(InvalidOptionError) as caught:
        TrainConfig(**{field: value}).validate(max_positions=max_positions(model))
    assert caught.value.param == field and caught.value.message.startswith(f"{field} must be")
    cli_message, _ = option_error_for(caught.value, style="cli")
    assert cli_message.startswith(f"{flag} must be") and repr(value) in cli_message
    if field == "seq_len":
        assert "context of 256 positions" in caught.value.message


def test_corpus_too_small_for_one_batch():
    with pytest.raises(InvalidCorpusError) as caught:
        TokenWindows(_stream(40), base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=16)
    assert caught.value.param == "corpus" and "batch_size 4 x seq_len 16" in caught.value.message


def test_windows_are_a_function_of_the_step():
    tokens = _stream()
    centred = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=32, sampling="centred")
    again = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=32, sampling="centred")
    assert torch.equal(centred.batch(7), again.batch(7)) and not torch.equal(centred.batch(7), centred.batch(8))
    for step in range(20):  # the occurrence sits in the middle half of every centred window
        batch = centred.batch(step)
        assert (batch[:, 8:26] >= BASE_VOCAB).any(dim=1).all()
    sequential = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=32, sampling="sequential")
    assert torch.equal(sequential.batch(0)[1], tokens[33:66])  # consecutive windows of seq_len + 1
    mixed = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=32, sampling="mixed")
    batch = mixed.batch(3)  # half centred, half the next consecutive windows (6 and 7 at step 3)
    assert (batch[:2, 8:26] >= BASE_VOCAB).any(dim=1).all()
    assert torch.equal(batch[2], tokens[6 * 33 : 7 * 33]) and torch.equal(batch[3], tokens[7 * 33 : 8 * 33])
    no_new = TokenWindows(tokens.clamp(max=BASE_VOCAB - 1), base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=32)
    assert no_new.sampling == "sequential"


def test_window_prefix_is_prepended():
    tokens = _stream()
    data = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16, sampling="sequential", prefix=[1])
    batch = data.batch(0)
    assert batch.shape == (2, 17) and (batch[:, 0] == 1).all() and torch.equal(batch[0, 1:], tokens[:16])


# -- terms-only data (extension.training.term_contexts) -------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_extended(smollm2_tokenizer):
    from extension.tokenizer import extend_tokenizer

    return extend_tokenizer(smollm2_tokenizer, ["Macintosh", "Fortran"])


@pytest.fixture(scope="module")
def tiny_49k():
    return tiny_llama(vocab_size=49152, tied=True)


def test_teacher_ids_expand_new_tokens_to_their_original_pieces(smollm2_extended, smollm2_tokenizer):
    from extension.training.term_contexts import expand

    text = "Old Fortran code on a Macintosh."
    student = smollm2_extended.tokenizer(text)["input_ids"]
    pieces = {t.id: t.base_ids for t in smollm2_extended.new_tokens}
    context = expand(student, smollm2_extended.base_vocab_size, pieces)
    assert any(i >= smollm2_extended.base_vocab_size for i in student)
    assert context.teacher == smollm2_tokenizer(text)["input_ids"]
    for j, token in enumerate(student):
        span = context.teacher[context.first_piece[j] : context.last_piece[j] + 1]
        assert span == (pieces[token] if token >= smollm2_extended.base_vocab_size else [token])


def test_distillation_targets_move_the_piece_chain_to_the_prompted_term_and_keep_written_ones(smollm2_extended, tiny_49k):
    from extension.training.term_contexts import TermContextObjective

    ext = smollm2_extended
    model = tiny_49k
    texts = ["Programs in Fortran ran on every Macintosh."]
    data = TermContextObjective(texts, ext, batch_size=1, seq_len=64, objective="distill")
    context = data.contexts[0]
    adapter = attach(model, ext.base_vocab_size, NewRows(input=torch.zeros(len(ext.new_tokens), DIM)))
    try:
        targets = data.teacher_targets(adapter, [context], len(context.student))
        p_old, p_new = targets(0, len(context.student))
        with torch.no_grad():
            teacher = torch.softmax(model(input_ids=torch.tensor([context.teacher])).logits[0, :, : ext.base_vocab_size].float(), -1)
    finally:
        adapter.detach()
    assert torch.all(p_old[-1] == 0) and torch.all(p_new[-1] == 0)  # nothing after the last token
    assert torch.allclose(p_old.sum(1)[:-1] + p_new.sum(1)[:-1], torch.ones(len(context.student) - 1), atol=1e-5)
    new_positions = [j for j in range(len(context.student) - 1) if context.student[j + 1] >= ext.base_vocab_size]
    assert len(new_positions) == 2  # Fortran (put into the text), then Macintosh (as if the model wrote it)
    for j in range(len(context.student) - 1):
        nxt = context.student[j + 1]
        expected = teacher[context.last_piece[j]].clone()
        if j in new_positions[1:]:  # a term the base model wrote itself: the sampled token is the target
            assert p_new[j, nxt - ext.base_vocab_size] == 1 and p_new[j].sum() == 1 and torch.all(p_old[j] == 0)
            continue
        if nxt >= ext.base_vocab_size:
            first, last = context.first_piece[j + 1], context.last_piece[j + 1]
            chain = torch.prod(torch.stack([teacher[pos - 1, context.teacher[pos]] for pos in range(first, last + 1)]))
            assert p_new[j, nxt - ext.base_vocab_size] == pytest.approx(float(chain), rel=1e-4)
            expected[context.teacher[first]] -= chain
        else:
            assert torch.all(p_new[j] == 0)
        assert torch.allclose(p_old[j], expected, atol=1e-6)


def test_generated_contexts_are_seeded_and_cached(smollm2_extended, tiny_49k, tmp_path):
    from extension.training.term_contexts import CONTEXTS_FILE, term_contexts

    first = term_contexts(tiny_49k, smollm2_extended, per_term=2, max_new_tokens=6, seed=1, work_dir=tmp_path)
    assert len(first) == 4 and (tmp_path / CONTEXTS_FILE).exists()
    assert "Macintosh" in first[0] and "Fortran" in first[2]
    assert term_contexts(tiny_49k, smollm2_extended, per_term=2, max_new_tokens=6, seed=1, work_dir=tmp_path) == first
    from extension.training.term_contexts import generate_texts

    assert generate_texts(tiny_49k, smollm2_extended, per_term=2, max_new_tokens=6, seed=1) == first


def test_generation_reports_its_progress(smollm2_extended, tiny_49k):
    from extension.training.term_contexts import generate_texts

    heard: list[tuple[int, int]] = []
    texts = generate_texts(tiny_49k, smollm2_extended, per_term=3, max_new_tokens=4, seed=1, batch_size=4,
                           on_progress=lambda done, total: heard.append((done, total)))
    assert len(texts) == 6 and heard == [(0, 6), (4, 6), (6, 6)]


@pytest.mark.parametrize("objective", ["distill", "lm"])
def test_terms_objectives_train(smollm2_extended, tiny_49k, objective):
    from extension.training.term_contexts import TermContextObjective

    texts = ["The Fortran compiler.", "A Macintosh computer runs Fortran programs.", "Fortran is old."]
    data = TermContextObjective(texts, smollm2_extended, batch_size=2, seq_len=32, objective=objective)
    rows = NewRows(input=torch.zeros(len(smollm2_extended.new_tokens), DIM))
    model = copy.deepcopy(tiny_49k)
    adapter = attach(model, smollm2_extended.base_vocab_size, rows)
    before = [float(data.loss(adapter, s)[0].detach()) for s in range(2)]
    # contexts now start after BOS/EOS; at lr 1e-2 the tiny model's distill loss overshot (237.59 vs 237.58)
    train_rows(model, adapter, data, TrainConfig(steps=16, batch_size=2, seq_len=32, lr=3e-3, warmup_steps=1))
    after = [float(data.loss(adapter, s)[0].detach()) for s in range(2)]
    assert sum(after) < sum(before)


# -- the real model -----------------------------------------------------------------------------
@pytest.mark.slow
def test_loss_goes_down_on_real_text_with_smollm2(smollm2_path, smollm2_tokenizer, tmp_path):
    """FOLDOC paragraphs (read from the installed dict-foldoc), 8 real terms, SmolLM2."""
    import gzip
    import itertools

    from transformers import AutoModelForCausalLM

    from extension.rows.init import subword_mean_rows
    from extension.tokenizer import extend_tokenizer
    from extension.training.loop import corpus_windows

    with gzip.open("/usr/share/dictd/foldoc.dict.dz", "rt", encoding="utf-8") as handle:
        lines = [line.strip() for line in itertools.islice(handle, 20_000, 26_000)]
    corpus = tmp_path / "foldoc.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    terms = ["programming", "Unix", "operating", "Fortran", "protocol", "hardware", "compiler", "Internet"]
    ext = extend_tokenizer(smollm2_tokenizer, terms)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    before_params = {n: p.clone() for n, p in model.named_parameters()}
    config = TrainConfig(steps=6, batch_size=2, seq_len=64, warmup_steps=1, lr=2e-3)
    data = corpus_windows(corpus, ext.tokenizer, base_vocab_size=ext.base_vocab_size, config=config, sampling="centred")
    assert len(data.occurrences) > 50
    adapter = attach(model, ext.base_vocab_size, subword_mean_rows(model, ext.new_tokens, ext.base_vocab_size))
    with torch.no_grad():
        before = sum(float(data.loss(adapter, s)[0]) for s in range(3))
    result = train_rows(model, adapter, data, config)
    with torch.no_grad():
        after = sum(float(data.loss(adapter, s)[0]) for s in range(3))
    adapter.detach()
    assert after < before * 0.98, (before, after, [h["loss"] for h in result.history])
    assert all(torch.equal(p, before_params[n]) for n, p in model.named_parameters())


def test_bf16_base_with_fp32_rows_merges_into_the_original_dtype():
    """The CUDA recipe (frozen base in bf16, rows in fp32, merge into a model in the checkpoint's
    dtype, as publishing does for a bf16 GPU job), run on the CPU, which has bf16 kernels too."""
    original = tiny_llama(tied=True)
    before = copy.deepcopy(original.state_dict())
    low = copy.deepcopy(original).to(torch.bfloat16)
    adapter = attach(low, BASE_VOCAB, NewRows(input=torch.zeros(NEW, DIM)))
    assert adapter.input_rows.dtype == torch.float32
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16)
    result = train_rows(low, adapter, data, TrainConfig(**{**CONFIG, "steps": 4}))
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
    assert result.history[-1]["grad_norm"] > 0
    adapter.merge(into=original)
    weight = original.get_input_embeddings().weight
    assert weight.dtype == torch.float32 and is_tied(original)
    assert torch.equal(weight[:BASE_VOCAB], before["model.embed_tokens.weight"][:BASE_VOCAB])
    assert torch.equal(weight[BASE_VOCAB:BASE_VOCAB + NEW], result.rows.input)


def test_term_contexts_fit_the_sequence_length_on_both_sides(smollm2_extended):
    from extension.training.term_contexts import TermContextObjective

    texts = ["Fortran Macintosh Fortran Macintosh Fortran Macintosh Fortran Macintosh Fortran"]
    data = TermContextObjective(texts, smollm2_extended, batch_size=1, seq_len=7)
    context = data.contexts[0]
    assert len(context.student) <= 7 and len(context.teacher) <= 7
    assert context.last_piece[-1] == len(context.teacher) - 1


# --- issue 26: a budget by time, and stopping where validation stalls -------------------------


class HeldOutLoss:
    """A StepValidation as train_rows asks for one: the rows' next-token loss on a held-out token
    stream (the product's own TokenWindows and fused loss), checked after every step."""

    def __init__(self, tokens: torch.Tensor):
        self.windows = TokenWindows(tokens, base_vocab_size=BASE_VOCAB, batch_size=4, seq_len=16, sampling="sequential")

    def due(self, step: int) -> bool:
        return True

    def __call__(self, adapter) -> float:
        with torch.no_grad():
            total, count = self.windows.loss(adapter, 0)
        return float(total) / count


def test_a_time_budget_stops_training_and_a_bigger_one_resumes_it(tmp_path):
    """max_train_seconds stops the loop (stopped == "time_budget", fewer steps than planned); it is
    not part of the run key, so the same job resumed with a bigger budget continues from there,
    and resumed with the same budget it takes no extra step."""
    slow = dict(steps=600, batch_size=8, seq_len=64, warmup_steps=0, checkpoint_every=0)
    _, _, stopped, _ = _train(True, tmp_path, max_train_seconds=1, **slow)
    assert stopped.stopped == "time_budget" and 0 < stopped.steps_done < 600 == stopped.planned_steps
    assert len(stopped.history) == stopped.steps_done
    assert stopped.report() == {"steps": stopped.steps_done, "planned_steps": 600, "stopped": "time_budget",
                                "max_train_seconds": 1, "validation_patience": 0}
    _, _, again, progress = _train(True, tmp_path, max_train_seconds=1, **slow)
    assert again.stopped == "time_budget" and again.steps_done == stopped.steps_done and progress == []
    _, _, resumed, progress = _train(True, tmp_path, max_train_seconds=3600, **slow)
    assert resumed.resumed_from == stopped.steps_done and resumed.steps_done == 600 and resumed.stopped == "steps"
    assert progress[0][0] == stopped.steps_done + 1


def test_validation_patience_stops_training_where_validation_cannot_improve():
    """Every step of this learning rate (1.0, x100 for the rows: each coordinate moves by ~100)
    wrecks the rows, so no step scores better than the init: with patience 1 the loop stops after
    the first check without improvement, and the init (step 0) is what it returns."""
    model, adapter = _setup(True)
    config = TrainConfig(**{**CONFIG, "lr": 1.0, "embedding_lr_multiplier": 100, "warmup_steps": 0, "validation_patience": 1})
    data = TokenWindows(_stream(), base_vocab_size=BASE_VOCAB, batch_size=2, seq_len=16, sampling="centred")
    result = train_rows(model, adapter, data, config, validate=HeldOutLoss(_stream(seed=1)))
    assert result.stopped == "validation_stalled" and result.steps_done == 1 and result.planned_steps == 12
    assert result.best_step == 0 and [point["step"] for point in result.validation] == [0, 1]
    assert result.validation[1]["bits_per_byte"] > result.validation[0]["bits_per_byte"]
    assert torch.equal(result.rows.input, torch.zeros(NEW, DIM))
    # without patience the same run takes every step
    model, adapter = _setup(True)
    full = train_rows(model, adapter, data, TrainConfig(**{**config.__dict__, "validation_patience": 0}),
                      validate=HeldOutLoss(_stream(seed=1)))
    assert full.stopped == "steps" and full.steps_done == 12
