"""Third-party deprecation noise goes to the log, not to a CLI user's terminal.

A deprecation warning from a library TIDE calls (transformers telling PEFT that
`is_gradient_checkpointing` is deprecated, say) is about code the user cannot change and does not
run; printed, it reads as a problem with their model. Such warnings (DeprecationWarning,
PendingDeprecationWarning, FutureWarning raised from a file outside this repository) are logged
on the `tide.warnings` logger at INFO; every other warning prints as Python prints it.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

LOGGER = logging.getLogger("tide.warnings")
_OURS = Path(__file__).resolve().parent.parent  # the repository: app/, extension/, worker/
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def third_party_deprecation(category: type[Warning], filename: str) -> bool:
    if not issubclass(category, _DEPRECATIONS):
        return False
    path = Path(filename).resolve()
    return not path.is_relative_to(_OURS) or ".venv" in path.relative_to(_OURS).parts or "site-packages" in path.parts


@contextmanager
def deprecations_logged():
    """Within the block, third-party deprecation warnings are logged instead of shown."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if third_party_deprecation(category, filename):
            LOGGER.info("%s:%s: %s: %s", filename, lineno, category.__name__, message)
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = shown
