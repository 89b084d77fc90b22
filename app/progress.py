"""Pipeline callbacks that draw on a terminal: a stage line each, a tqdm bar for training."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from extension.spec import Callbacks


class TerminalProgress:
    def __init__(self, work_dir: Path | None = None, stream=None):
        self.stream = stream or sys.stderr  # read at call time: tests and callers may swap sys.stderr
        self.bar: tqdm | None = None
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
        print(f"[tide] {name}", file=self.stream, flush=True)

    def progress(self, step: int, total: int, metrics: dict) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc="train", unit="step", file=self.stream, initial=step - 1)
        self.bar.update(step - self.bar.n)
        shown = {k: f"{v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))}
        self.bar.set_postfix(shown, refresh=False)

    def warning(self, message: str) -> None:
        tqdm.write(f"[tide] warning: {message}", file=self.stream)
