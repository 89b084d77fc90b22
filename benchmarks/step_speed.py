"""Speed and memory of ONE training step of the new rows, side by side (issue 3, benchmark b).

Systems, each on its own copy of the model, the same batch of token ids (10% new ids):
  limit   the frozen model's forward + backward to its input embeddings, no weight gradients
          (HF's own loss over full logits) — no method that trains rows can do less work
  ours    extension.rows.adapter adapter: frozen base, new rows in a small parameter, fused chunked loss,
          gradient clipping and AdamW over the new rows (what train_rows does per step)
  peft    PEFT TrainableTokens on the resized model (token_indices = the new ids), AdamW
  full    full-embedding fine-tuning of the resized model (embedding trainable, tied head), AdamW

Timing: all systems live in one process; every repetition runs one step of each, in rotating
order, and the medians are reported with their ratio to the limit. Memory: each system in a
fresh child process — the peak resident set (VmHWM, reset after setup) during two steps, minus
the resident set after setup, plus the absolute peak.

    nice -n 10 .venv/bin/python benchmarks/step_speed.py            # SmolLM2 + Gemma 3 270M
    .venv/bin/python benchmarks/step_speed.py --models tiny --reps 2  # smoke run

SmolLM2 is the real converted model; Gemma 3 270M is built from its published config with random
weights (the timing does not depend on the values).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SYSTEMS = ("limit", "ours", "peft", "full")


def build_model(name: str):
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "smollm2":
        from extension.plan.models import ModelSources, resolve_model

        path = resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if name == "gemma3":
        # google/gemma-3-270m's config.json values
        config = Gemma3TextConfig(
            vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
            max_position_embeddings=32768, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
            rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, hidden_activation="gelu_pytorch_tanh",
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, tie_word_embeddings=True,
        )
        return Gemma3ForCausalLM(config).eval()
    if name == "tiny":
        config = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        return LlamaForCausalLM(config).eval()
    raise SystemExit(f"unknown model {name}")


def batch(vocab: int, new: int, batch_size: int, seq_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=g)
    mask = torch.rand(ids.shape, generator=g) < 0.1
    return torch.where(mask, vocab + torch.randint(0, new, ids.shape, generator=g), ids)


def _resized(model, size: int):
    model.resize_token_embeddings(size, mean_resizing=False)
    model.tie_weights()
    return model


def setup(system: str, model, vocab: int, new: int, ids: torch.Tensor):
    """Returns a zero-argument function that runs one training step."""
    from extension.rows.init import NewRows, padded_vocab_size
    from extension.rows.adapter import IGNORE_INDEX, attach

    padded = padded_vocab_size(vocab + new, vocab, 64)
    base_ids = ids.clamp(max=vocab - 1)
    if system == "limit":
        model.requires_grad_(False)
        embedding = model.get_input_embeddings()

        def step():
            x = embedding(base_ids).detach().requires_grad_(True)
            model(inputs_embeds=x, labels=base_ids).loss.backward()
        return step
    if system == "ours":
        d = model.get_input_embeddings().weight.shape[1]
        adapter = attach(model, vocab, NewRows(input=torch.randn(new, d) * 0.02))
        optimizer = torch.optim.AdamW(adapter.parameters(), lr=1e-3, weight_decay=0.0)
        targets = ids.roll(-1, dims=1)
        targets[:, -1] = IGNORE_INDEX

        def step():
            adapter.loss(adapter.hidden(ids), targets).backward()
            torch.nn.utils.clip_grad_norm_(list(adapter.parameters()), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step
    if system == "peft":
        from peft import TrainableTokensConfig, get_peft_model

        model = get_peft_model(_resized(model, padded), TrainableTokensConfig(
            target_modules=["embed_tokens"], token_indices=list(range(vocab, vocab + new))))
    elif system == "full":
        model = _resized(model, padded)
        model.requires_grad_(False)
        model.get_input_embeddings().weight.requires_grad_(True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.0)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(model_name: str, system: str, new: int, batch_size: int, seq_len: int) -> dict:
    import gc
    import warnings

    warnings.filterwarnings("ignore")
    model = build_model(model_name)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = batch(vocab, new, batch_size, seq_len)
    step = setup(system, model, vocab, new, ids)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak: measure the steps only
    at_rest = _status_kb("VmRSS")
    for _ in range(2):  # the first step allocates the optimizer state; the second shows reuse
        step()
    peak = _status_kb("VmHWM")
    return {"rest_mb": at_rest / 1024, "peak_mb": peak / 1024, "step_peak_mb": (peak - at_rest) / 1024}


def time_steps(model_name: str, new: int, batch_size: int, seq_len: int, reps: int) -> dict[str, list[float]]:
    base = build_model(model_name)
    vocab = base.get_input_embeddings().weight.shape[0]
    ids = batch(vocab, new, batch_size, seq_len)
    steps = {system: setup(system, copy.deepcopy(base), vocab, new, ids) for system in SYSTEMS}
    del base
    for step in steps.values():  # warm-up: allocator, optimizer state, kernels
        step()
    times: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for rep in range(reps):
        order = SYSTEMS[rep % len(SYSTEMS):] + SYSTEMS[: rep % len(SYSTEMS)]
        for system in order:
            began = time.perf_counter()
            steps[system]()
            times[system].append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new", type=int, default=1000, help="new rows")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "step_speed.md")
    parser.add_argument("--memory-child", nargs=2, metavar=("MODEL", "SYSTEM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child, args.new, args.batch_size, args.seq_len)))
        return

    results = {}
    for model_name in args.models.split(","):
        times = time_steps(model_name, args.new, args.batch_size, args.seq_len, args.reps)
        memory = {}
        for system in SYSTEMS:
            child = subprocess.run(
                [sys.executable, __file__, "--memory-child", model_name, system, "--new", str(args.new),
                 "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--threads", str(args.threads)],
                capture_output=True, text=True, check=True,
            )
            memory[system] = json.loads(child.stdout.strip().splitlines()[-1])
        results[model_name] = {"times": times, "memory": memory}
        print(model_name, {s: round(statistics.median(t), 3) for s, t in times.items()}, flush=True)
    write_report(args, results)


def write_report(args, results: dict) -> None:
    lines = [
        "# One training step: ours vs PEFT Trainable Tokens vs full-embedding fine-tuning vs the limit",
        "",
        f"Command: `nice -n 10 .venv/bin/python benchmarks/step_speed.py --models {args.models} --reps {args.reps} "
        f"--new {args.new} --batch-size {args.batch_size} --seq-len {args.seq_len} --threads {args.threads}`",
        "",
        f"CPU only (torch threads: {torch.get_num_threads()}, torch {torch.__version__}), fp32, batch {args.batch_size} x "
        f"seq {args.seq_len}, {args.new} new rows, 10% of the input ids new. Step time: median of {args.reps} "
        "repetitions, systems interleaved in one process. Memory: each system in a fresh process; "
        "'step peak' is the peak resident set during two steps (the first allocates the optimizer "
        "state) above the resident set after setup; 'peak' is the absolute peak of that process.",
        "",
        "| model | system | step time (s) | x limit | step peak (MB) | peak RSS (MB) | step peak x PEFT |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model_name, data in results.items():
        limit = statistics.median(data["times"]["limit"])
        peft_peak = data["memory"]["peft"]["step_peak_mb"]
        for system in SYSTEMS:
            median = statistics.median(data["times"][system])
            mem = data["memory"][system]
            lines.append(
                f"| {model_name} | {system} | {median:.3f} | {median / limit:.2f} | {mem['step_peak_mb']:.0f} | "
                f"{mem['peak_mb']:.0f} | {mem['step_peak_mb'] / peft_peak:.2f} |"
            )
    lines += ["", "Raw step times (s):", "", "```json",
              json.dumps({m: d["times"] for m, d in results.items()}, indent=1), "```", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
