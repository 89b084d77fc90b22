"""One device decision per job: where the model is loaded, and where every stage runs.

A job names a device (`device`: auto, cpu, cuda, cuda:N) and, for models bigger than one GPU,
an accelerate device map (`device_map`: none, auto, balanced, sequential, or a JSON object of
module -> device). `resolve_placement` turns the two into a `Placement` once, at the start of
the job, on the machine that runs it (the only place that knows whether a GPU is there), and
raises InvalidOptionError naming the option when a value is malformed or names a device that is
not there.

Every stage then follows the model: the model is loaded straight onto the device in its compute
dtype (`precision` 'auto': bf16 where the device computes it natively, a GPU that supports it or
a CPU with AMX or AVX-512 BF16, else the checkpoint's own dtype; never an fp32 detour through the
CPU; the published weights are always the checkpoint's own), and generation, training,
evaluation and padding calibration run where the model's input embedding is (the new rows live with it). Batch sizes for generation and
evaluation come from the device: the CPU keeps the sizes it always had, a GPU gets bigger ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .device_options import DEVICE_MAP_STRATEGIES, device_map_problem, device_problem, parse_device_map  # noqa: F401
from ..errors import InvalidOptionError


# Evaluation: tokens per forward. The CPU value is what evaluation always used (its numbers and
# timings stay as they were); on a GPU the budget comes from free memory, within these bounds.
CPU_EVAL_BATCH_TOKENS = 4096
GPU_EVAL_BATCH_TOKENS = (8192, 131_072)
# Generation of term contexts: prompts per generate() call. On the CPU 64 wrote a context in 0.63x
# the time 16 took (benchmarks/results/context_writing.md, SmolLM2, one thread), as long as the
# batch's KV cache stays small: a CPU batch is cut so it fits CPU_GENERATION_CACHE_BYTES.
CPU_GENERATION_BATCH = 64
CPU_GENERATION_CACHE_BYTES = 2**30
GPU_GENERATION_BATCH = 256


@dataclass(frozen=True)
class Placement:
    """Where a job's model goes. `device` holds the inputs, the embedding and the new rows;
    `device_map` (None: the whole model on `device`) spreads the frozen base with accelerate."""

    device: torch.device
    device_map: str | dict | None = None
    precision: str = "auto"  # the option: "auto" (bf16 where native) or "checkpoint"

    @property
    def label(self) -> str:
        return str(self.device) if self.device_map is None else f"{self.device} (device_map {_map_label(self.device_map)})"

    @property
    def native_bf16(self) -> bool:
        """Does the job compute in bf16 because its device does so natively (precision 'auto')?"""
        if self.precision != "auto":
            return False
        if self.device.type == "cuda":
            return torch.cuda.is_bf16_supported()
        return self.device.type == "cpu" and cpu_computes_bf16()

    @property
    def defaults_kind(self) -> str:
        """Which of an option's device defaults the job takes (options.Option.device_defaults):
        'cuda', 'cpu_bf16' (a CPU computing in bf16: its steps cost about 0.57x an fp32 step's,
        benchmarks/results/bf16_step.md) or 'cpu'."""
        if self.device.type == "cuda":
            return "cuda"
        return "cpu_bf16" if self.native_bf16 else "cpu"

    def compute_dtype(self, checkpoint: torch.dtype) -> torch.dtype:
        """bf16 where the device computes it natively (precision 'auto'); otherwise the
        checkpoint's own dtype. Only floating checkpoints are cast."""
        if self.native_bf16 and checkpoint.is_floating_point:
            return torch.bfloat16
        return checkpoint

    def load_kwargs(self, checkpoint: torch.dtype, *, offload_folder: str | Path | None = None) -> dict[str, Any]:
        """Keyword arguments for `from_pretrained`: straight onto the device, in the compute dtype."""
        dtype = self.compute_dtype(checkpoint)
        if self.device_map is None:
            if self.device.type == "cpu":
                return {"dtype": "auto" if dtype == checkpoint else dtype}
            return {"dtype": dtype, "device_map": {"": str(self.device)}}
        kwargs: dict[str, Any] = {"dtype": dtype, "device_map": self.device_map}
        if isinstance(self.device_map, str) and self.device.type == "cpu":
            # --device cpu with a strategy: the CPU's memory, then disk; never a GPU
            kwargs["max_memory"] = {"cpu": available_host_memory()}
        if offload_folder is not None:
            kwargs["offload_folder"] = str(offload_folder)
        return kwargs


def _map_label(device_map) -> str:
    return device_map if isinstance(device_map, str) else "{" + ", ".join(f"{k or '(all)'}: {v}" for k, v in device_map.items()) + "}"


def _check_cuda(name: str, value: str, index: int) -> None:
    if not torch.cuda.is_available():
        raise InvalidOptionError(
            option=name,
            problem=f"is {value!r} but this machine has no CUDA GPU that torch can use (torch.cuda.is_available() "
            f"is False: a CPU-only torch build, no driver, or no GPU visible in CUDA_VISIBLE_DEVICES); use auto or cpu",
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidOptionError(
            option=name,
            problem=f"is {value!r} but only {count} CUDA GPU{'s are' if count != 1 else ' is'} visible here "
            f"(cuda:0 to cuda:{count - 1}); use one of those, or auto",
        )


def cpu_computes_bf16() -> bool:
    """Does this CPU multiply bf16 matrices in hardware (AMX tiles or AVX-512 BF16)? Elsewhere
    torch emulates bf16 on the CPU, slower than fp32."""
    probes = (getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_is_avx512_bf16_supported", None))
    return any(probe is not None and bool(probe()) for probe in probes)


def resolve_placement(device: str = "auto", device_map: str = "none", precision: str = "auto") -> Placement:
    """The job's placement from its options, checked against this machine."""
    problem = device_problem(device)
    if problem:
        raise InvalidOptionError(option="device", problem=problem)
    mapping = parse_device_map(device_map)
    if device == "auto":
        resolved = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    elif device == "cpu":
        resolved = torch.device("cpu")
    else:
        index = int(device.partition(":")[2] or 0)
        _check_cuda("device", device, index)
        resolved = torch.device("cuda", index)
    if isinstance(mapping, dict):
        for value in set(mapping.values()):
            if value.startswith("cuda"):
                _check_cuda("device_map", value, int(value.partition(":")[2]))
    return Placement(device=resolved, device_map=mapping, precision=precision)


# -- what a checkpoint holds ------------------------------------------------------------------
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def checkpoint_dtype(config, model_path: str | Path | None = None) -> torch.dtype:
    """The dtype `from_pretrained(dtype="auto")` loads: the config's, else the first floating
    tensor's in the safetensors files, else float32."""
    for name in ("dtype", "torch_dtype"):
        value = getattr(config, name, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    if model_path is not None and Path(model_path).is_dir():
        for file in sorted(Path(model_path).glob("*.safetensors")):
            for entry in safetensors_header(file).values():
                if isinstance(entry, dict) and entry.get("dtype") in _SAFETENSORS_DTYPES:
                    return _SAFETENSORS_DTYPES[entry["dtype"]]
    return torch.float32


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(size))


# -- what a loaded model is on ----------------------------------------------------------------
def model_device(model) -> torch.device:
    """Where the model's inputs go: its input embedding's device (the new rows live there too)."""
    return model.get_input_embeddings().weight.device


def describe(model) -> dict[str, str]:
    """{"device", "dtype"} of a loaded model, for metrics.json; a spread model lists its devices."""
    dtype = str(model.get_input_embeddings().weight.dtype).removeprefix("torch.")
    device_map = getattr(model, "hf_device_map", None)
    devices: list[str] = []
    if device_map:
        for value in device_map.values():
            name = f"cuda:{value}" if isinstance(value, int) else str(value)
            if name not in devices:
                devices.append(name)
    if len(devices) > 1:
        return {"device": "+".join(devices), "dtype": dtype, "main": str(model_device(model))}
    return {"device": str(model_device(model)), "dtype": dtype}


def _module_device(mapping: dict, name: str) -> str | None:
    """The device a {module prefix: device} map gives module `name` (the longest prefix wins)."""
    best = None
    for prefix, device in mapping.items():
        if prefix == "" or name == prefix or name.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, device)
    return None if best is None else best[1]


def check_device_map(config, device_map) -> None:
    """Before loading: a JSON device map must keep the input embedding and the head readable (on a
    GPU, or on the CPU when no GPU is mapped): see check_spread."""
    if not isinstance(device_map, dict):
        return
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = {id(module): name for name, module in model.named_modules()}
    uses_gpu = any(value.startswith("cuda") for value in device_map.values())
    for label, module in (("input embedding", model.get_input_embeddings()), ("output head", model.get_output_embeddings())):
        if module is None:
            continue
        name = names[id(module)]
        device = _module_device(device_map, name)
        if device is None or device == "disk" or (device == "cpu" and uses_gpu):
            raise InvalidOptionError(option="device_map", problem=_offloaded_problem(label, f"{name}: {device or 'not mapped'}"))


def _offloaded_problem(label: str, where: str) -> str:
    return (f"offloads the model's {label} ({where}; offloaded weights are brought in per forward), but TIDE trains the "
            "new rows beside it and reads it directly; map it to a GPU, or to cpu when no GPU is used")


def check_spread(model) -> None:
    """A device map must leave the input embedding and the head where they can be read directly:
    the new rows live beside them and the loss reads the head's matrix."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    for name, module in (("input embedding", embedding), ("output head", head)):
        if module is not None and module.weight.device.type == "meta":
            raise InvalidOptionError(option="device_map", problem=_offloaded_problem(name, "after loading it is on meta"))


def offloaded(model) -> bool:
    """True when some weights live on the meta device (accelerate moved them to CPU or disk and
    brings them in per forward)."""
    return any(p.device.type == "meta" for p in model.parameters())


# -- batch sizes from the device -------------------------------------------------------------
def _dims(config) -> tuple[int, int]:
    config = getattr(config, "text_config", None) or config
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 1024
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return int(hidden), int(inner)


def free_device_memory(device: torch.device) -> int:
    """Bytes free on a CUDA device, or available to this process on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_host_memory()


def available_host_memory() -> int:
    """MemAvailable, capped by this process's cgroup (a container's memory limit) when it has one."""
    import psutil  # a dependency of accelerate

    available = int(psutil.virtual_memory().available)
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            available = min(available, max(0, int(limit) - usage))
        break
    return available


def eval_batch_tokens(model) -> int:
    """Tokens per evaluation forward for a loaded model (see eval_batch_tokens_for)."""
    weight = model.get_input_embeddings().weight
    return eval_batch_tokens_for(weight.device, model.config, weight.dtype)


def eval_batch_tokens_for(device: torch.device, config, dtype: torch.dtype) -> int:
    """Tokens per evaluation forward: the CPU's long-standing 4096; on a GPU, a quarter of the
    free memory over what one token's transient activations take (bounded)."""
    if device.type != "cuda":
        return CPU_EVAL_BATCH_TOKENS
    hidden, inner = _dims(config)
    per_token = (6 * hidden + 3 * inner) * torch.empty((), dtype=dtype).element_size()
    tokens = free_device_memory(device) // 4 // max(per_token, 1)
    low, high = GPU_EVAL_BATCH_TOKENS
    return int(min(high, max(low, tokens)) // 1024 * 1024)


def generation_batch_size(model, *, tokens: int = 96) -> int:
    """Prompts per generate() call for sequences of up to `tokens` (prompt + sampled)."""
    if model_device(model).type == "cuda":
        return GPU_GENERATION_BATCH
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    layers = getattr(config, "num_hidden_layers", None)
    hidden = getattr(config, "hidden_size", None)
    if not layers or not hidden:
        return CPU_GENERATION_BATCH
    heads = getattr(config, "num_attention_heads", None) or 1
    kv_width = (getattr(config, "num_key_value_heads", None) or heads) * (getattr(config, "head_dim", None) or hidden // heads)
    element = model.get_input_embeddings().weight.element_size()
    per_sequence = 2 * layers * kv_width * tokens * element  # keys and values, every layer
    return max(1, min(CPU_GENERATION_BATCH, CPU_GENERATION_CACHE_BYTES // max(per_sequence, 1)))


def release_cached_memory(device: torch.device) -> None:
    """Give the CUDA caching allocator's free blocks back between stages (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
