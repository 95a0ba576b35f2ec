"""Checkpoint and resume: every table row (value ‖ optimizer state), the sparse optimizer's hyperparameters, the
dense modules and optimizers, the loader's position (mid-epoch) and the RNG states.

A checkpoint is a main file naming a folder of tables (:mod:`dgl_oac.checkpoint.file`). The tables go through
``torch.distributed.checkpoint`` (:mod:`dgl_oac.checkpoint.tables`): each rank writes its own rows, streamed in
chunks, never pickled or copied whole (a file-backed table, ``storage=path``, is copied rather than referenced:
training goes on writing its file). The small state is a ``torch.save`` payload of the main file, read back with
``weights_only=True`` (a checkpoint never runs code). The main file is written last, atomically, so a save killed
at any moment leaves the previous checkpoint whole. Loading checks the main file, the objects, and the sha256 of
every table file it reads before it changes anything, so a truncated, corrupted or mismatched checkpoint raises
:class:`CheckpointError` naming what is wrong (a table file and the rank that wrote it) and leaves the objects
untouched.

Resume is exact for sync and oac: the batch stream is a pure function of (seed, epoch, batch index) and the
loader restarts at the saved position, so a resumed run's table equals an uninterrupted run's bit for bit.

Several trainers (tables built after ``init_process_group``): saving and loading are collectives on the tables'
gloo group, and no step runs meanwhile. Rank 0 writes the main file: the dense state (equal on every rank:
DDP's average), every rank's RNG state and the loader's position. The folder must be one every rank sees (on
several machines, a shared file system).

Another number of trainers (written by N, loaded by M): the tables reshard (each rank loads the rows it holds
now), and the sparse optimizer, the dense modules and optimizers and ``extra`` are restored. What cannot carry
over is refused with a :class:`CheckpointError` rather than silently changed: each trainer's RNG state (pass
``restore_rng=False`` and seed the RNGs), and a mid-epoch loader position (N and M trainers split an epoch's
batches differently; a checkpoint saved at the end of an epoch resumes the loader at the next epoch's start).
"""
from .checkpointer import Checkpointer
from .file import CheckpointReader
from .load import load_checkpoint
from .rows import CheckpointError
from .save import save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointReader", "CheckpointError", "Checkpointer"]
