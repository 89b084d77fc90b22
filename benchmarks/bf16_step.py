"""Is bf16 slow on this CPU, or is it TIDE's bf16 path? (issue 23's bf16 quality run)

Times, side by side in one run, in fp32 and in bf16:
- the bare built-in SmolLM2-135M forward + backward (input embeddings as the leaf, every weight
  frozen, batch 4 x 128, as a job's step);
- the product's own training step on the same model: 300 new rows attached with
  extension.rows.adapter.attach (fp32 rows on the frozen model), `hidden` + the fused row loss +
  backward + the AdamW step of extension.training.loop, on batch 4 x 128 windows that hold new ids;
and writes benchmarks/results/bf16_step.md. A product step much slower in bf16 than in fp32
would be a cost of TIDE's own bf16 path, not of the hardware.

    .venv/bin/python benchmarks/bf16_step.py [--steps 3]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from extension.plan.models import ModelSources, resolve_model  # noqa: E402


def seconds_per_step(path: str, dtype: torch.dtype, ids: torch.Tensor, steps: int) -> float:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.requires_grad_(False)
    inputs = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    model(inputs_embeds=inputs, labels=ids).loss.backward()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        model(inputs_embeds=inputs, labels=ids).loss.backward()
    return (time.perf_counter() - started) / steps


def product_seconds_per_step(path: str, dtype: torch.dtype, ids: torch.Tensor, steps: int, new_rows: int) -> float:
    from extension.rows.init import NewRows
    from extension.rows.adapter import attach
    from extension.training.loop import TrainConfig, param_groups

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    base = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(1)
    pieces = torch.randint(0, base, (new_rows, 3), generator=g)
    rows = NewRows(input=model.get_input_embeddings().weight.detach()[pieces].float().mean(1))
    adapter = attach(model, base, rows)
    window = ids.clone()
    window[:, ::8] = base + torch.randint(0, new_rows, window[:, ::8].shape, generator=g)  # new ids, read and predicted
    config = TrainConfig()
    optimizer = torch.optim.AdamW(param_groups(adapter, config), lr=config.lr, betas=config.betas)

    def step() -> None:
        loss = adapter.loss(adapter.hidden(window[:, :-1]), window[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--new-rows", type=int, default=300, help="new rows attached in the product's step (a job's default)")
    args = parser.parse_args()
    path = resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path
    torch.manual_seed(0)
    ids = torch.randint(0, 49_152, (4, 128))
    fp32 = seconds_per_step(path, torch.float32, ids, args.steps)
    bf16 = seconds_per_step(path, torch.bfloat16, ids, args.steps)
    windows = torch.randint(0, 49_152, (4, 129))
    product_fp32 = product_seconds_per_step(path, torch.float32, windows, args.steps, args.new_rows)
    product_bf16 = product_seconds_per_step(path, torch.bfloat16, windows, args.steps, args.new_rows)
    lines = [
        "# SmolLM2-135M forward + backward per step, fp32 and bf16, on this CPU",
        "",
        f"Command: `python benchmarks/bf16_step.py --steps {args.steps} --new-rows {args.new_rows}`; batch 4 x 128, "
        f"weights frozen. The product's step: {args.new_rows} new fp32 rows attached (extension.rows.adapter), hidden states, "
        "the fused row loss, backward and the AdamW step.",
        "",
        "| step | dtype | s per step | vs fp32 |",
        "| --- | --- | ---: | ---: |",
        f"| bare model | float32 | {fp32:.2f} s | 1.00x |",
        f"| bare model | bfloat16 | {bf16:.2f} s | {bf16 / fp32:.2f}x |",
        f"| TIDE's training step | float32 | {product_fp32:.2f} s | 1.00x |",
        f"| TIDE's training step | bfloat16 | {product_bf16:.2f} s | {product_bf16 / product_fp32:.2f}x |",
        "",
        f"Machine: {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads.",
    ]
    out = REPO / "benchmarks" / "results" / "bf16_step.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
