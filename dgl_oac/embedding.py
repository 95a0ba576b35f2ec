"""``NodeEmbedding``: a learnable table in CPU memory, a drop-in for ``dgl.nn.NodeEmbedding``.

It owns the CPU table (:class:`~dgl_oac.store.RowStore`) and, once a pipelined loader uses it, the pieces of
the pipeline that belong to the table rather than to one loader: the version clock, the device write log (oac)
and the write-back thread. Reading ``emb.weight`` (or saving) first waits for pending write-backs, so what a
user sees is always every committed step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .config import resolve_pin
from .oac import VersionClock, WriteLog
from .store import RowStore, Storage, check_ids
from .transfer import Transfer
from .writeback import WriteBack


@dataclass(eq=False)  # identity, not tensor comparison
class Slot:
    """One batch's rows of one embedding, between hand-out and commit."""

    ids: torch.Tensor          # int64[n], CPU
    ids_dev: torch.Tensor      # int64[n], device
    rows: torch.Tensor         # float32[n, D+S], device: value ‖ optimizer state, as validated
    leaf: torch.Tensor         # float32[n, D], device, requires_grad: what the model reads
    mode: str                  # "sync" | "async" | "oac"
    rv: Optional[int] = None   # version the rows were read at (pipelined modes): the open read, until commit
    seen: Optional[int] = None  # sync, oac: newest step the rows are current through (see commit._refresh)
    unique: bool = True        # ids known to be unique (loader batches)
    check_finite: bool = True
    on_commit: List[Callable[["Slot", float], None]] = field(default_factory=list)
    _order: Optional[torch.Tensor] = None  # lazily: argsort of ids, for emb(ids) lookups inside a batch


class NodeEmbedding:
    """``NodeEmbedding(num_embeddings, embedding_dim, name, init_func=None)``, float32, rows in CPU memory.

    ``storage="memory"`` (default) or a file path for a table larger than RAM (memory-mapped). ``init_func``
    fills a ``float32[n, D]`` tensor in place (or returns one), like DGL's; the default is zeros, as in DGL.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str,
                 init_func: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, device: Any = None,
                 *, storage: Storage = "memory", pin: Any = "auto") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError("dgl_oac.NodeEmbedding keeps its table on the CPU; pass the compute device to the "
                             "DataLoader (device=...) instead")
        self.name = name
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        pin_table = storage == "memory" and resolve_pin(pin, torch.device("cuda" if torch.cuda.is_available()
                                                                          else "cpu"))
        self.store = RowStore(self.num_embeddings, self.embedding_dim, init_func, storage, pin_table)
        self.optimizer = None
        self.clock = VersionClock()
        self.step_count = 0                   # steps committed so far (= next step number)
        self.log: Optional[WriteLog] = None   # oac only, on the compute device
        self.writer: Optional[WriteBack] = None
        self.transfer: Optional[Transfer] = None
        self.pending: List[Slot] = []         # handed out, not yet committed
        self.current: Optional[Slot] = None   # the batch emb(ids) resolves against

    # --- DGL surface ----------------------------------------------------------------------------------------
    @property
    def weight(self) -> torch.Tensor:
        """``float32[N, D]``, CPU: the table's values after every committed step (waits for write-backs)."""
        self.flush()
        return self.store.value()

    @property
    def optm_state(self) -> torch.Tensor:
        self.flush()
        return self.store.state()

    def __call__(self, node_ids: torch.Tensor, device: Any = torch.device("cpu")) -> torch.Tensor:
        """Rows for ``node_ids: int64[n]`` on ``device``, tracked for the next ``opt.step()``.

        Inside a loader iteration the ids must belong to the batch's input nodes and the rows come from the
        batch (validated, differentiable); outside one they are read from the table now.
        """
        cur = self.current
        if cur is not None and (node_ids is cur.ids or node_ids is cur.ids_dev):
            return cur.leaf  # the common case, emb(input_nodes, device): no check, no host-device sync
        check_ids(node_ids, self.num_embeddings, f"ids passed to NodeEmbedding {self.name!r}")
        if cur is not None:
            same = cur.ids_dev if node_ids.device == cur.ids_dev.device else cur.ids.to(node_ids.device)
            if node_ids.shape == same.shape and torch.equal(node_ids, same):
                return cur.leaf
            return cur.leaf[self._positions(cur, node_ids.cpu()).to(cur.leaf.device)]
        self.flush()
        dev = torch.device(device)
        ids = node_ids.cpu()
        rows = self.store.gather(ids).to(dev)
        leaf = rows[:, : self.embedding_dim].contiguous().requires_grad_(True)
        self.pending.append(Slot(ids, ids.to(dev), rows, leaf, "sync", seen=self.step_count - 1, unique=False))
        return leaf

    def _positions(self, slot: Slot, ids: torch.Tensor) -> torch.Tensor:
        if slot._order is None:
            slot._order = torch.argsort(slot.ids)
        ordered = slot.ids[slot._order]
        pos = torch.searchsorted(ordered, ids).clamp_max(ordered.numel() - 1)
        missing = ordered[pos] != ids
        if bool(missing.any()):
            raise KeyError(f"ids {ids[missing][:5].tolist()} are not input nodes of the current batch of "
                           f"{self.name!r}; inside a loader iteration only the batch's rows can be looked up")
        return slot._order[pos]

    # --- pipeline plumbing (used by the loader and the commit) ----------------------------------------------
    def _attach_optimizer(self, opt: Any) -> None:
        if self.optimizer is not None and self.optimizer is not opt:
            raise RuntimeError(f"NodeEmbedding {self.name!r} already has a sparse optimizer")
        self.store.widen(opt.state_width(self.embedding_dim))
        self.optimizer = opt

    def _prepare(self, device: torch.device, pin: bool, mode: str, writeback_depth: int,
                 priority: str = "normal", steps_in_flight: int = 0) -> None:
        """Create the per-table pipeline parts a loader of ``mode`` on ``device`` needs (the write-back thread
        keeps the ``priority`` of the first pipelined loader)."""
        if self.transfer is not None and self.transfer.device != device:
            raise ValueError(f"NodeEmbedding {self.name!r} is already used on {self.transfer.device}, not {device}")
        if self.transfer is None:
            self.transfer = Transfer(device, pin)
        if mode != "sync" and self.writer is None:
            self.writer = WriteBack(self.store, self.clock, writeback_depth, self.name, priority,
                                    recycle=self.transfer.recycle)
        if mode == "oac" and self.log is None:
            self.log = WriteLog(self.num_embeddings, self.store.width, device)
        if self.log is not None:
            self.log.steps_hint = max(self.log.steps_hint, steps_in_flight)

    def flush(self) -> None:
        """Wait until every committed step is in the CPU table."""
        if self.writer is not None:
            self.writer.flush()

    def drop_pending_without_grad(self) -> None:
        """Forget handed-out batches that got no gradient (evaluation, or a loop left before backward)."""
        keep = []
        for slot in self.pending:
            if slot.leaf.grad is None:
                if slot.rv is not None:
                    self.clock.end_read(slot.rv)
            else:
                keep.append(slot)
        self.pending = keep
        if self.current is not None and not any(self.current is s for s in keep):
            self.current = None

    def drop_pending(self) -> None:
        """Forget handed-out batches that will never be committed (no gradient / loop left early)."""
        for slot in self.pending:
            if slot.rv is not None:
                self.clock.end_read(slot.rv)
        self.pending.clear()
        self.current = None

    def close(self) -> None:
        """Apply pending write-backs and stop the write-back thread. Idempotent."""
        self.drop_pending()
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()

    # --- state ----------------------------------------------------------------------------------------------
    def _store_state_copy(self) -> torch.Tensor:
        self.flush()
        return self.store.state().clone()

    def _load_store_state(self, state: torch.Tensor) -> None:
        self.flush()
        want = (self.num_embeddings, self.store.state_width)
        if tuple(state.shape) != want:
            raise ValueError(f"optimizer state for {self.name!r} has shape {tuple(state.shape)}, expected {want}")
        self.store.state().copy_(state)

    def state_dict(self) -> Dict[str, Any]:
        """``{"weight": float32[N, D]}`` (a copy, CPU)."""
        return {"weight": self.weight.clone()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Replace the values (e.g. on resume). The device write log is reset: no batch may be in flight."""
        if self.pending or self.clock.open_reads():
            raise RuntimeError(f"cannot load {self.name!r} while batches are in flight; close the loader first")
        w = state["weight"]
        if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"weight for {self.name!r} has shape {tuple(w.shape)}, "
                             f"expected {(self.num_embeddings, self.embedding_dim)}")
        self.flush()
        self.store.value().copy_(w)
        self.log = None  # recreated on first use; its last_slot pointed at replaced values

    def __repr__(self) -> str:
        return (f"NodeEmbedding(num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
                f"name={self.name!r}, state_width={self.store.state_width})")
