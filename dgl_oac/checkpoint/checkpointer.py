"""``dgl-oac train``'s checkpoints: one file, replaced every N steps, after each epoch and at the end."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from .file import PathLike
from .load import load_checkpoint
from .save import save_checkpoint


class Checkpointer:
    """The training driver's checkpoints (``dgl-oac train --checkpoint-dir D --checkpoint-every N --resume``):
    ``D/checkpoint.ckpt`` (and the tables folder it names), replaced atomically every N steps, after each epoch
    and at the end.
    ``progress`` is the driver's own state (curve, counters, the current epoch's losses so far)."""

    FILE = "checkpoint.ckpt"

    def __init__(self, folder: PathLike, every: Optional[int], task: Any) -> None:
        self.path = Path(folder) / self.FILE
        self.every = every
        self.parts = task.checkpoint_parts()  # what the task's checkpoint holds (TaskBase)
        self.saves = 0
        self.resumed_at: Optional[int] = None  # the step the run resumed after (set by the driver)

    def save(self, progress: Dict[str, Any]) -> None:
        """Write the checkpoint now (atomically replacing the previous one), ``progress`` as its ``extra``."""
        save_checkpoint(self.path, extra=progress, **self.parts)
        self.saves += 1

    def after_step(self, steps: int, progress: Any) -> None:
        """Save when ``steps`` is a multiple of ``every``; ``progress`` is a callable (built only then)."""
        if self.every and steps % self.every == 0:
            self.save(progress())

    def resume(self) -> Optional[Dict[str, Any]]:
        """Load the latest checkpoint into the task; its ``progress``, or None when there is none yet."""
        if not self.path.exists():
            return None
        return load_checkpoint(self.path, **self.parts)

