"""Terms-only jobs: train the new rows without a corpus.

Contexts come from the user's `examples` where they hold the term (example_snippets.py), and
from the base model itself: a prompt in the list's own writing system (term_prompts.py) is
continued by sampling, so the text is what the base model expects around the term.
Two objectives over those texts (measured in benchmarks/results/terms_only_training.md):

- "distill" (Token Distillation, arXiv 2505.20133, extended to the output side): the student
  reads the text with the new tokens; the teacher is the same frozen model reading the term's
  ORIGINAL pieces. At every position the student's next-token distribution is trained towards
  the teacher's — after a term this teaches the input row to mean what the pieces meant. Where
  the next token is a new one, the teacher's probability of the whole piece chain
  (p(piece 1) * p(piece 2 | piece 1) * ...) moves from its first piece to the new token, which
  teaches the output row how likely the term is in that context. That holds only where the term
  was put into the text (each context's first new token: the prompt's term, or the term a snippet
  of the examples was cut around). Where the base model wrote the term itself, the sampled token
  is the target, as in plain next-token training: the term occurs there with the base model's own
  probability, so the chain AND the occurrence would count that probability twice while every
  other position says "probability 0". That pushed new tokens' output rows down: a 100-word
  Spanish glossary lost +271.7 bits at its new tokens over the decomposed test text where the
  untrained mean gained -194.0, and more training lost more (lr 4e-3: +1685.3).
- "lm": plain next-token loss on the same texts tokenised with the extended tokenizer.

Teacher ids are the student ids with each new token expanded to its original base ids, so every
student position has exactly one aligned teacher position.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..evaluation.scoring import context_token_id
from .example_snippets import snippets_around, split_examples
from .identity import run_identity
from .term_prompts import conditioning_prefix, term_prompts
from ..rows.adapter import IGNORE_INDEX, RowsAdapter

OBJECTIVES = ("distill", "lm")
CONTEXTS_FILE = "term_contexts.json"


@dataclass
class Context:
    student: list[int]  # extended-tokenizer ids (new ids included)
    teacher: list[int]  # the same text in base ids (each new id expanded to its original pieces)
    last_piece: list[int]  # per student position: teacher position of the last piece of that token
    first_piece: list[int]  # per student position: teacher position of the first piece


def expand(ids: list[int], base_vocab_size: int, pieces: dict[int, list[int]]) -> Context:
    teacher: list[int] = []
    first: list[int] = []
    last: list[int] = []
    for token in ids:
        first.append(len(teacher))
        teacher.extend(pieces[token] if token >= base_vocab_size else [token])
        last.append(len(teacher) - 1)
    return Context(student=list(ids), teacher=teacher, last_piece=last, first_piece=first)


def _prompt_ids(tokenizer, text: str) -> list[int]:
    """The text's ids after the token every held-out chunk is scored after (BOS, else EOS), which
    the tokenizer adds itself on Gemma but not on SmolLM2. Without it a context's first token, its
    term, sits where the model keeps its attention sink and is never a target: training never
    taught p(term | start), which is what held-out scoring asks first, and every term looked costly."""
    ids = tokenizer(text)["input_ids"]
    start = context_token_id(tokenizer)
    return ids if ids[:1] == [start] else [start, *ids]


def generate_texts(model, extended, *, per_term: int = 4, max_new_tokens: int = 64, seed: int = 0,
                   style: str = "list", batch_size: int | None = None, should_cancel=None, on_progress=None) -> list[str]:
    """`per_term` contexts per term, term by term, written by the BASE model (call before
    attaching the adapter) from prompts of `style` (term_prompts.py). Full texts, prompt included."""
    prompts = term_prompts([t.term for t in extended.terms], per_term, style=style, seed=seed)
    return continue_prompts(model, extended, prompts, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                            should_cancel=should_cancel, on_progress=on_progress)


@torch.no_grad()
def continue_prompts(model, extended, prompts: list[str], *, max_new_tokens: int = 64, seed: int = 0,
                     batch_size: int | None = None, should_cancel=None, on_progress=None) -> list[str]:
    """Each prompt continued by sampling `max_new_tokens` with the base model, which reads the
    prompt in the base tokenizer's pieces (new tokens expanded). `on_progress(done, total)` hears
    how many are written after every batch: on a CPU this takes minutes. Runs on the model's
    device, `batch_size` prompts per generate() call (default: the device's)."""
    from ..plan.devices import generation_batch_size, model_device

    tokenizer = extended.tokenizer
    batch_size = batch_size or generation_batch_size(model)
    pieces = {t.id: t.base_ids for t in extended.new_tokens}
    prompt_ids = [expand(_prompt_ids(tokenizer, prompt), extended.base_vocab_size, pieces).teacher for prompt in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = model_device(model)
    texts: list[str] = []
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if on_progress is not None:
            on_progress(0, len(prompt_ids))
        for start in range(0, len(prompt_ids), batch_size):
            if should_cancel is not None and should_cancel():
                from ..errors import JobCancelled

                raise JobCancelled("cancelled while generating term contexts")
            batch = prompt_ids[start : start + batch_size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_p=0.95,
                                 temperature=0.8, max_new_tokens=max_new_tokens, pad_token_id=pad)
            for row, prompt in zip(out, batch):
                texts.append(tokenizer.decode(row[width - len(prompt):].tolist(), skip_special_tokens=True))
            if on_progress is not None:
                on_progress(len(texts), len(prompt_ids))
    finally:
        torch.random.set_rng_state(generator_state)
    return texts


def term_contexts(model, extended, *, per_term: int = 4, max_new_tokens: int = 64, seed: int = 0, style: str = "list",
                  work_dir: Path | None = None, should_cancel=None, on_progress=None) -> list[str]:
    """generate_texts, cached in work_dir (see cached_continuations)."""
    prompts = term_prompts([t.term for t in extended.terms], per_term, style=style, seed=seed)
    return cached_continuations(model, extended, prompts, max_new_tokens=max_new_tokens, seed=seed, work_dir=work_dir,
                                should_cancel=should_cancel, on_progress=on_progress)


def cached_continuations(model, extended, prompts: list[str], *, max_new_tokens: int, seed: int,
                         work_dir: Path | None = None, should_cancel=None, on_progress=None,
                         drop: list[str | None] | None = None) -> list[str]:
    """continue_prompts, cached in work_dir so a resumed job trains on the very same texts (the
    cache key holds the prompts and the base model's identity: another model's texts are never
    reused). Each text loses its `drop[i]` prefix (term_prompts.conditioning_prefix) where it starts with it."""
    drop = drop or [None] * len(prompts)
    key = hashlib.sha256(json.dumps(
        [prompts, drop, max_new_tokens, seed, extended.base_vocab_size, run_identity(model, extended), "after-context-token"]
    ).encode()).hexdigest()
    cache = Path(work_dir) / CONTEXTS_FILE if work_dir else None
    if cache is not None and cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return saved["texts"]
    texts = continue_prompts(model, extended, prompts, max_new_tokens=max_new_tokens, seed=seed,
                             should_cancel=should_cancel, on_progress=on_progress)
    texts = [text[len(prefix):] if prefix and text.startswith(prefix) else text for text, prefix in zip(texts, drop)]
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "texts": texts}))
        tmp.replace(cache)
    return texts


# held_out_text: a held-out context is only what the base model wrote after its prompt. With the
# prompt kept, every context opened on its term at the start of a text, and p(term | start), a
# position real text rarely puts a term in, ruled the check, and it called rows better than the
# base that are worse on the domain's text. The written part holds the terms where the base model
# put them itself, as a user's text does; with it the verdict agrees with the test split on both
# glossaries of benchmarks/results/terms_only_{es,foldoc}.md.


class TermContextObjective:
    """Batches of generated contexts; loss per `objective` (see the module docstring). Student
    and teacher sequences are at most `seq_len` positions."""

    def __init__(self, texts: list[str], extended, *, batch_size: int, seq_len: int, seed: int = 0,
                 objective: str = "distill"):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}")
        self.base_vocab_size = extended.base_vocab_size
        self.num_new = len(extended.new_tokens)
        pieces = {t.id: t.base_ids for t in extended.new_tokens}
        tokenizer = extended.tokenizer
        self.contexts = []
        for text in texts:
            context = expand(_prompt_ids(tokenizer, text)[:seq_len], self.base_vocab_size, pieces)
            # the teacher reads the expanded pieces: it must fit in seq_len positions too
            keep = sum(1 for last in context.last_piece if last < seq_len)
            if keep >= 2:
                self.contexts.append(expand(context.student[:keep], self.base_vocab_size, pieces))
        if not self.contexts:
            raise ValueError("no usable term contexts")
        self.validation_texts: list[str] = []  # held-out contexts that choose the step (terms_objective fills them in)
        self.judging_texts: list[str] = []  # held-out contexts no decision sees: what the job reports on
        self.plan: dict = {}  # where the texts came from (ContextPlan.to_json)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        self.batch_size, self.seed, self.objective = batch_size, seed, objective
        self._fingerprint = hashlib.sha256(json.dumps([texts, objective, seq_len]).encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        """A digest of the contexts and the objective (part of a checkpoint's key)."""
        return self._fingerprint

    def batch(self, step: int) -> list[Context]:
        chosen = []
        for i in range(self.batch_size):
            epoch, slot = divmod(step * self.batch_size + i, len(self.contexts))
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            chosen.append(self.contexts[int(torch.randperm(len(self.contexts), generator=g)[slot])])
        return chosen

    def _pad(self, rows: list[list[int]], device) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.pad] * (width - len(r)) for r in rows], device=device)

    def loss(self, adapter: RowsAdapter, step: int) -> tuple[torch.Tensor, int]:
        contexts = self.batch(step)
        device = adapter.input_rows.device
        student = self._pad([c.student for c in contexts], device)
        targets = torch.full_like(student, IGNORE_INDEX)
        for b, c in enumerate(contexts):
            targets[b, : len(c.student) - 1] = student[b, 1 : len(c.student)]
        hidden = adapter.hidden(student)  # right padding: causal attention never sees the pads
        if self.objective == "lm":
            return adapter.loss_sum(hidden, targets)
        return adapter.soft_loss_sum(hidden, self.teacher_targets(adapter, contexts, student.shape[1])), int(
            (targets != IGNORE_INDEX).sum())

    @torch.no_grad()
    def teacher_targets(self, adapter: RowsAdapter, contexts: list[Context], width: int):
        """A function (start, end) -> (p_old, p_new) over the flattened student positions, on the
        head's device (where the loss runs)."""
        teacher_ids = self._pad([c.teacher for c in contexts], adapter.input_rows.device)
        device = adapter._base_head.weight.device
        teacher_hidden = adapter.hidden(teacher_ids).to(device)  # only base ids: exactly the base model
        d = teacher_hidden.shape[-1]
        index = torch.zeros(len(contexts), width, dtype=torch.long)  # aligned teacher position
        valid = torch.zeros(len(contexts), width, dtype=torch.bool)
        chains: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # (flat row, first piece, new local id, [(pos, id)])
        sampled: set[int] = set()  # flat rows whose next new token the base model sampled itself
        for b, c in enumerate(contexts):
            n = len(c.student)
            index[b, : n - 1] = torch.tensor(c.last_piece[: n - 1])
            valid[b, : n - 1] = True
            prompted = False
            for j in range(n - 1):
                nxt = c.student[j + 1]
                if nxt >= self.base_vocab_size:
                    first = c.first_piece[j + 1]
                    steps = [(b * teacher_ids.shape[1] + pos - 1, c.teacher[pos])
                             for pos in range(first, c.last_piece[j + 1] + 1)]
                    chains.append((b * width + j, c.teacher[first], nxt - self.base_vocab_size, steps))
                    if prompted:
                        sampled.add(b * width + j)
                    prompted = True
        flat_teacher = teacher_hidden.reshape(-1, d)
        rows = flat_teacher[(index + torch.arange(len(contexts)).unsqueeze(1) * teacher_ids.shape[1]).flatten().to(device)]
        valid = valid.flatten().to(device)
        old_weight, old_bias = adapter._base_head.weight[: self.base_vocab_size], None
        head_bias = getattr(adapter._base_head, "bias", None)
        if head_bias is not None:
            old_bias = head_bias[: self.base_vocab_size]

        def teacher_log_probs(h: torch.Tensor) -> torch.Tensor:
            z = adapter.transform.apply_(F.linear(h.to(old_weight.dtype), old_weight, old_bias).float())
            return torch.log_softmax(z, dim=-1)

        chain_rows: dict[int, tuple[int, int, float]] = {}
        if chains:
            positions = torch.tensor([pos for *_, steps in chains for pos, _ in steps], device=device)
            ids = torch.tensor([tok for *_, steps in chains for _, tok in steps], device=device)
            logp = teacher_log_probs(flat_teacher[positions]).gather(1, ids.unsqueeze(1)).squeeze(1)
            at = 0
            for row, first, new_local, steps in chains:
                chain_rows[row] = (first, new_local, float(logp[at : at + len(steps)].sum().exp()))
                at += len(steps)

        def targets(start: int, end: int):
            p_old = teacher_log_probs(rows[start:end]).exp_()
            p_old.mul_(valid[start:end].unsqueeze(1))
            p_new = torch.zeros(end - start, self.num_new, device=device)
            for row in range(start, end):
                if row in sampled:
                    p_old[row - start] = 0.0
                    p_new[row - start, chain_rows[row][1]] = 1.0
                elif row in chain_rows:
                    first, new_local, chain = chain_rows[row]
                    chain = min(chain, float(p_old[row - start, first]))
                    p_old[row - start, first] -= chain
                    p_new[row - start, new_local] = chain
            return p_old, p_new

        return targets


@dataclass
class ContextPlan:
    """How many texts of each kind a terms-only job reads, per term, and where they come from."""

    per_term: int  # training contexts per term (examples' snippets first, generated ones fill the rest)
    snippets: list[list[str]]  # per term: its training snippets from the examples
    deciding_examples: list[str]  # examples' documents that decide (empty: one generated context per term)
    judging_examples: list[str]  # examples' documents that judge (empty: one generated context per term)

    def to_json(self, terms: int) -> dict:
        from_examples = sum(len(found) for found in self.snippets)
        return {"per_term": self.per_term, "training_contexts": self.per_term * terms,
                "from_examples": from_examples, "generated": self.per_term * terms - from_examples,
                "deciding": "examples" if self.deciding_examples else "generated",
                "judging": "examples" if self.judging_examples else "generated"}


def plan_contexts(extended, config, *, per_term: int, examples: list[str] | None = None,
                  distilled_per_term: int = 0) -> ContextPlan:
    """Generation is the slow part on a CPU, so no more contexts per term are written than the run
    can read (steps x batch_size sequences over the terms, or the input distillation's
    `distilled_per_term`, whichever is more), but every term gets at least one."""
    terms = max(1, len(extended.terms))
    read = max(-(-config.steps * config.batch_size // terms), distilled_per_term)
    per_term = max(1, min(per_term, read))
    training, deciding, judging = split_examples(list(examples or []))
    snippets = [snippets_around(t.term, training, limit=per_term) for t in extended.terms]
    return ContextPlan(per_term, snippets, deciding, judging)


def terms_objective(model, extended, config, *, objective: str = "distill", per_term: int = 4,
                    max_new_tokens: int = 64, style: str = "list", examples: list[str] | None = None,
                    distilled_per_term: int = 0, work_dir: Path | None = None, should_cancel=None, on_progress=None,
                    hold_out: bool = True, with_deciding: bool = True) -> TermContextObjective:
    """The training data of a terms-only job (call before attaching the adapter): per term, its
    snippets from the user's `examples`, then contexts the base model writes (plan_contexts).

    With `hold_out`, two held-out parts are kept out of training: a deciding one
    (`objective.validation_texts`: the best step and which terms stay) and a judging one
    (`objective.judging_texts`), which no decision sees, so the before/after a job reports is not
    measured on the text that chose it. Each is the examples' own part where they have one, else
    one more generated context per term, without its prompt (held_out_text). Without
    `with_deciding` (a job that decides nothing: 0 steps) only the judging part is kept out."""
    plan = plan_contexts(extended, config, per_term=per_term, examples=examples, distilled_per_term=distilled_per_term)
    decide = hold_out and with_deciding and not plan.deciding_examples
    judge = hold_out and not plan.judging_examples
    extra = int(decide) + int(judge)
    needed = [plan.per_term - len(found) + extra for found in plan.snippets]
    width = max(needed)
    prompts = term_prompts([t.term for t in extended.terms], width, style=style, seed=config.seed)
    chosen = [(prompts[i * width + k], term.term, k >= count - extra)
              for i, (term, count) in enumerate(zip(extended.terms, needed)) for k in range(count)]
    written = cached_continuations(model, extended, [prompt for prompt, _, _ in chosen], max_new_tokens=max_new_tokens,
                                   seed=config.seed, work_dir=work_dir, should_cancel=should_cancel, on_progress=on_progress,
                                   drop=[prompt if held else conditioning_prefix(prompt, term, style)
                                         for prompt, term, held in chosen])
    # written texts come term by term, `needed[i]` each, in the cached order (a resumed job splits
    # them alike): the training fill first, then the deciding one, then the judging one
    train: list[str] = []
    deciding: list[str] = list(plan.deciding_examples) if hold_out and with_deciding else []
    judging: list[str] = list(plan.judging_examples) if hold_out else []
    at = 0
    for found, count in zip(plan.snippets, needed):
        own = written[at : at + count]
        at += count
        fill = plan.per_term - len(found)
        train += found + own[:fill]
        held = own[fill:]
        if decide:
            deciding.append(held.pop(0))
        if judge:
            judging.append(held.pop(0))
    built = TermContextObjective(train, extended, batch_size=config.batch_size, seq_len=config.seq_len,
                                 seed=config.seed, objective=objective)
    built.validation_texts, built.judging_texts = deciding, judging
    built.plan = plan.to_json(len(extended.terms))
    return built


def judging_texts(model, extended, config, *, max_new_tokens: int = 64, style: str = "list",
                  examples: list[str] | None = None, work_dir: Path | None = None, should_cancel=None,
                  on_progress=None) -> tuple[list[str], str]:
    """The held-out text an UNTRAINED terms-only job (steps 0) reports its before/after on, and
    where it came from ("examples" or "generated"): the examples' judging part where they have
    one, else one context per term the base model writes, without its prompt (held_out_text).
    Nothing is decided on it."""
    _, _, judging = split_examples(list(examples or []))
    if judging:
        return judging, "examples"
    terms = [t.term for t in extended.terms]
    prompts = term_prompts(terms, 1, style=style, seed=config.seed)
    written = cached_continuations(model, extended, prompts, max_new_tokens=max_new_tokens, seed=config.seed,
                                   work_dir=work_dir, should_cancel=should_cancel, on_progress=on_progress,
                                   drop=prompts)
    return written, "generated"
