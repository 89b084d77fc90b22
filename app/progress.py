"""Pipeline callbacks that draw on a terminal: a stage line each, a tqdm bar for every stage
that reports progress (generate, train, evaluate)."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from extension.plan.spec import Callbacks


class TerminalProgress:
    def __init__(self, work_dir: Path | None = None, stream=None):
        self.stream = stream or sys.stderr  # read at call time: tests and callers may swap sys.stderr
        self.bar: tqdm | None = None
        self.current_stage = "train"
        self.callbacks = Callbacks(
            on_stage=self.stage,
            on_progress=self.progress,
            on_warning=self.warning,
            work_dir=work_dir,
        )

    def __enter__(self) -> Callbacks:
        return self.callbacks

    def __exit__(self, *_exc) -> None:
        self._close_bar()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def stage(self, name: str) -> None:
        self._close_bar()
        self.current_stage = name
        print(f"[tide] {name}", file=self.stream, flush=True)

    def progress(self, step: int, total: int, metrics: dict) -> None:
        if total <= 0:
            return
        if self.bar is None or self.bar.total != total:
            self._close_bar()
            unit = metrics.get("unit", "step")
            self.bar = tqdm(total=total, desc=self.current_stage, unit=unit, file=self.stream)
        self.bar.update(step - self.bar.n)
        shown = {k: f"{v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))}
        self.bar.set_postfix(shown, refresh=False)

    def warning(self, message: str) -> None:
        tqdm.write(f"[tide] warning: {message}", file=self.stream)
