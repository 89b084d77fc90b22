"""Is bf16 slow on this CPU, or is it TIDE's bf16 path? (issue 23's bf16 quality run)

Times the bare built-in SmolLM2-135M forward + backward (input embeddings as the leaf, every
weight frozen, batch 4 x 128, as a job's step) in fp32 and in bf16, side by side in one run, and
writes benchmarks/results/bf16_step.md. A TIDE bf16 job step far slower than the bf16 row here
is a cost of the product's own bf16 path, not of the hardware.

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

from extension.models import ModelSources, resolve_model  # noqa: E402


def seconds_per_step(path: str, dtype: torch.dtype, ids: torch.Tensor, steps: int) -> float:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.requires_grad_(False)
    inputs = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    model(inputs_embeds=inputs, labels=ids).loss.backward()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        model(inputs_embeds=inputs, labels=ids).loss.backward()
    return (time.perf_counter() - started) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model("smollm2-135m", ModelSources(cache_dir=REPO / ".cache")).path
    torch.manual_seed(0)
    ids = torch.randint(0, 49_152, (4, 128))
    fp32 = seconds_per_step(path, torch.float32, ids, args.steps)
    bf16 = seconds_per_step(path, torch.bfloat16, ids, args.steps)
    lines = [
        "# SmolLM2-135M forward + backward per step, fp32 and bf16, on this CPU",
        "",
        f"Command: `python benchmarks/bf16_step.py --steps {args.steps}`; batch 4 x 128, weights frozen.",
        "",
        "| dtype | s per step | vs fp32 |",
        "| --- | ---: | ---: |",
        f"| float32 | {fp32:.2f} s | 1.00x |",
        f"| bfloat16 | {bf16:.2f} s | {bf16 / fp32:.2f}x |",
        "",
        f"Machine: {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads.",
    ]
    out = REPO / "benchmarks" / "results" / "bf16_step.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
