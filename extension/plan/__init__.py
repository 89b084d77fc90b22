"""The job's decisions before any weights are read: what it asks for, where it runs, whether it fits.

    options.py         every option of a job, declared once: type, default, range, help
    spec.py            ExtendSpec (what a job asks for), Callbacks (how it reports back), STAGES
    device_options.py  the forms of the `device` / `device_map` options, checked without torch
    devices.py         where the model is loaded and every stage runs (Placement), dtypes
    memory.py          the memory a job needs, estimated from the config; refusing one that cannot fit
    models.py          resolving a base model name (built-in, models folder, hub) and loading it
    corpus.py          reading a corpus as documents and its stable train / validation / test split
    job.py             plan_inputs / plan_model: the above, made once, as a JobPlan

The API and the settings read options, spec and device_options without importing torch, so this
package loads its modules only when one of their names is asked for.
"""

from importlib import import_module

_EXPORTS = {
    "options": ("OPTIONS", "BY_NAME", "DEFAULTS", "Option", "check_options", "defaults_for_device"),
    "spec": ("STAGES", "Callbacks", "ExtendSpec"),
    "device_options": ("DEVICES", "DEVICE_MAP_STRATEGIES", "MAP_DEVICES"),
    "devices": ("Placement", "resolve_placement", "model_device", "describe", "release_cached_memory"),
    "memory": ("MemoryPlan", "InsufficientMemoryError"),
    "models": ("BUILTIN_MODELS", "ModelSources", "ResolvedModel", "resolve_model", "load_model", "load_tokenizer",
               "load_config", "builtin_tokenizer_dir"),
    "corpus": ("iter_documents", "split_documents", "train_documents", "check_corpus", "corpus_label"),
    "job": ("JobPlan", "plan_inputs", "plan_model", "validate_spec"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
