"""Checkpoint and resume (:mod:`.save`)."""
from .save import CheckpointError, Checkpointer, CheckpointReader, load_checkpoint, save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointReader", "CheckpointError", "Checkpointer"]
