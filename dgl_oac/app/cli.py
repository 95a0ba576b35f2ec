"""``dgl-oac``: command line. ``dgl-oac train`` with no options trains GraphSAGE with learnable embeddings on
the built-in synthetic graph (generated in-process; nothing is downloaded). Under torchrun
(``torchrun --standalone --nproc_per_node=N -m dgl_oac train ...``) N trainers train it together
(:mod:`dgl_oac.app.tasks.launch`)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any, Dict, List, Optional

import torch

from ..config import PRIORITIES, STALENESS
from .tasks import TASK_NAMES, TrainConfig
from .tasks.common import DENSE_SYNCS, SHARDINGS
from .tasks.backend import BACKEND_MODES, OPTIMIZERS
from .tasks.defaults import describe, per_task_options
from .tasks.link import AUTOCAST

HELP = {
    "task": "node classification, link prediction, knowledge-graph embeddings, or node classification on a "
            "heterograph (R-GCN)",
    "dataset": "'synthetic' (generated), 'synthetic-mag' (hetero-node), an OGB name (ogbl-ddi, ...), a shared "
               "dataset (cora, pubmed, coauthor-physics, github-social, FB15k-237, WN18RR, codex-m) or a path",
    "root": "where OGB or shared datasets live (default: $DGL_OAC_OGB_ROOT, else ../shared/data)",
    "model": "'sage' (node, link), 'rgcn' (hetero-node), 'distmult', 'complex' or 'transe' (kg)",
    "mode": "sync: one batch at a time; async: rows prefetched and read stale (Marius); oac: prefetched and "
            "validated, equal to sync; dgl: plain DGL",
    "prefetch": "batches gathered ahead of compute (async, oac): a number, or 'auto' (0 to 4, from measured step "
                "times)",
    "background_priority": "background threads run on cores training leaves free ('idle', SCHED_IDLE) or as "
                           "any thread ('normal': machines shared with heavy jobs)",
    "staleness": "async only: correct stale rows by Gap-Aware or DANA-style lookahead (not exact either; "
                 "default: none)",
    "epochs": "passes over the training set",
    "batch_size": "seed nodes (node tasks) or edges/triples (link, kg) per batch",
    "fanouts": "neighbours sampled per layer, comma-separated (-1: all)",
    "negatives": "negative samples per batch",
    "dim": "embedding dimension",
    "hidden": "hidden dimension of the GNN",
    "lr": "learning rate of the sparse (embedding) optimizer",
    "dense_lr": "learning rate of the dense optimizer (Adam; kg: --optimizer's kind)",
    "optimizer": "sparse row optimizer",
    "dropout": "dropout between GNN layers",
    "seed": "seed of the batch stream and of the initialisation",
    "device": "'auto' (CUDA if present), 'cpu' or 'cuda[:N]'",
    "eval_batch_size": "nodes or triples per evaluation chunk (bounds its memory)",
    "max_steps": "stop after this many training steps (smoke runs)",
    "num_nodes": "nodes of the synthetic graph (default: 100000)",
    "num_workers": "sampling processes (0: on the training thread); the batches are the same for any number",
    "threads": "torch intra-op threads (default: torch's choice)",
    "out": "write a JSON summary (curve, best and last epoch, throughput, stats) here, and a PNG plot beside it",
    "neg_dist": "negative sampling: 'uniform' or 'degree' (degree ** 0.75)",
    "scorer": "edge scorer: 'dot', or 'mlp' on the Hadamard product",
    "scorer_layers": "linear layers of the 'mlp' scorer",
    "scorer_hidden": "width of the 'mlp' scorer's hidden layers",
    "message_passing": "'sampled' (blocks per --fanouts) or 'full' (the whole training graph every batch, as "
                       "OGB's full-batch baselines)",
    "autocast": "'bf16': the dense model's matrix products in bfloat16 (all else float32)",
    "loss": "'ce' (softmax over the positive and its negatives), 'logsigmoid', 'softplus', 'margin', or 'auto' "
            "(ce; transe: logsigmoid)",
    "regularizer": "'n3', 'l2' or 'none', on the batch's head, relation and tail rows",
    "reg_weight": "weight of --regularizer (0: off)",
    "init_scale": "tables start uniform in [-s, s] (default: kg 0.1; link N(0, 0.1); link on ogbl-ddi 0.0364)",
    "clip_grad_norm": "clip the gradient norms of the rows, encoder and scorer to this (default: off; link on "
                      "ogbl-ddi 1.0)",
    "adv_temperature": "self-adversarial negative weighting temperature (losses other than ce; default: off)",
    "eval_limit": "rank a fixed subset of this many valid/test edges or triples per epoch (the full test set at "
                  "the last and at new best epochs; default: all)",
    "checkpoint_dir": "save a checkpoint (rows, optimizer state, models, loader position, RNG) to "
                      "DIR/checkpoint.ckpt after every epoch",
    "checkpoint_every": "also save one every N training steps",
    "resume": "continue from --checkpoint-dir's checkpoint, if any (sync and oac: as if uninterrupted)",
    "dense_sync": "'allreduce': dense gradients averaged every step (DDP, exact); 'shadow': dense parameters "
                  "averaged in the background (ShadowSync, NOT exact)",
    "shadow_every": "--dense-sync shadow: steps between averagings",
    "sharding": "where the tables' rows live: 'replicated' (the whole table on every machine; reads are local) "
                "or 'rows' (each trainer holds its range of rows and reads the others' from their owners)",
    "progress": "hide the progress bar",
}

ALL_TASKS = ("node", "link", "hetero-node", "kg")
#: ``--help``'s groups, in order: (title, the tasks that read these options, the options); every TrainConfig field
#: (but ``extra``) is in one (tests/test_cli_help.py)
GROUPS = (
    ("what to train", ALL_TASKS, ("task", "dataset", "root", "model", "num_nodes")),
    ("pipeline", ALL_TASKS, ("mode", "prefetch", "background_priority", "staleness", "num_workers", "device",
                             "threads")),
    ("training", ALL_TASKS, ("epochs", "batch_size", "dim", "lr", "dense_lr", "optimizer", "seed", "max_steps")),
    ("GNN (node, link, hetero-node)", ("node", "link", "hetero-node"), ("fanouts", "hidden", "dropout")),
    ("negatives (link, kg)", ("link", "kg"), ("negatives", "neg_dist", "init_scale", "eval_limit")),
    ("link prediction", ("link",), ("scorer", "scorer_layers", "scorer_hidden", "message_passing", "autocast",
                                    "clip_grad_norm")),
    ("knowledge-graph embeddings (kg)", ("kg",), ("loss", "regularizer", "reg_weight", "adv_temperature")),
    ("evaluation and output", ALL_TASKS, ("eval_batch_size", "out", "progress")),
    ("checkpoints", ALL_TASKS, ("checkpoint_dir", "checkpoint_every", "resume")),
    ("several trainers (torchrun)", ALL_TASKS, ("dense_sync", "shadow_every", "sharding")),
)
#: the tasks that read each option (per-task defaults in --help are listed for those only)
USED_BY = {name: tasks for _, tasks, names in GROUPS for name in names}


def _prefetch(text: str) -> Any:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a positive integer, got {text!r}")
    return value


class _HelpFormatter(argparse.HelpFormatter):
    """Each default once, after the help: the per-task defaults of the tasks that read the option
    (:func:`~dgl_oac.app.tasks.defaults.describe`), a plain default where there is one; nothing for on/off flags,
    for options without a default, or where the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.dest in per_task_options():
            return f"{text} (default: {describe(action.dest, USED_BY.get(action.dest))})"
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default:" in text:
            return text
        return f"{text} (default: {action.default})"


def build_parser() -> argparse.ArgumentParser:
    """The ``dgl-oac`` parser: one subcommand, ``train``, with a flag per :class:`~dgl_oac.app.tasks.TrainConfig`
    field (``--no-progress`` and ``--resume`` as on/off flags), grouped as :data:`GROUPS` says."""
    parser = argparse.ArgumentParser(prog="dgl-oac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model", usage="dgl-oac train [options]",
                        description="Train a built-in task. Every option has a default; plain `dgl-oac train` "
                                    "trains GraphSAGE over learnable embeddings on a synthetic graph in oac mode.",
                        formatter_class=_HelpFormatter)
    choices = {"task": TASK_NAMES, "mode": BACKEND_MODES, "optimizer": OPTIMIZERS,
               "background_priority": PRIORITIES, "staleness": STALENESS, "autocast": AUTOCAST,
               "dense_sync": DENSE_SYNCS, "sharding": SHARDINGS}
    config = {f.name: f for f in fields(TrainConfig)}
    for title, _, names in GROUPS:
        group = tr.add_argument_group(title)
        for name in names:
            if name == "progress":
                group.add_argument("--no-progress", dest="progress", action="store_false", help=HELP[name])
            elif name == "resume":
                group.add_argument("--resume", action="store_true", help=HELP[name])
            else:
                f = config[name]
                kind = {"int": int, "float": float}.get(str(f.type).replace("Optional[", "").rstrip("]"), str)
                group.add_argument("--" + name.replace("_", "-"), type=_prefetch if name == "prefetch" else kind,
                                   default=f.default, help=HELP[name], choices=choices.get(name),
                                   metavar=None if name in choices else name.split("_")[-1].upper())
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``dgl-oac`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status: 0, or 2 with
    ``dgl-oac: error: ...`` on stderr for a bad configuration or a missing dataset (argparse exits 2 itself for
    an unknown flag). Under torchrun only rank 0 prints and writes ``--out``."""
    args = build_parser().parse_args(argv)
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k != "command"})
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)  # --seed also fixes the model and embedding initialisation
    from .tasks import launch, train

    try:
        launch.start(cfg)  # under torchrun: this process is one of N trainers
        try:
            result = train(cfg)
            lead = launch.is_lead()
        finally:
            launch.stop()
    except (ValueError, FileNotFoundError, TypeError) as exc:
        print(f"dgl-oac: error: {exc}", file=sys.stderr)
        return 2
    if not lead:  # rank 0 reports
        return 0
    name = f"{cfg.task} on {result['dataset']['name']} [{cfg.mode}]"
    if result["curve"]:
        best, final = result["best"], result["final"]
        print(f"{name}, best validation at epoch {best['epoch']} of {final['epoch']}: {_metrics(best)}")
        note = " (test on a subset: --eval-limit)" if final.get("partial_test") else ""
        print(f"{name}, last epoch {final['epoch']}: {_metrics(final)}{note}")
    print(f"throughput: {result['batches_per_s']:.2f} batches/s, {result['rows_per_s']:,.0f} embedding rows/s "
          f"({result['steps']} steps{_on_each(result['trainers'])} in {result['train_seconds']:.1f}s of training)")
    if result["loader_stats"]:
        st = result["loader_stats"]
        print(f"pipeline: conflict rate {st['conflict_rate']:.3f}, rows patched {st['rows_patched']}, "
              f"max in flight {st['max_in_flight']}")
    if cfg.out:
        from .plot import plot_curves

        png = plot_curves({cfg.mode: result}, cfg.out)
        print(f"wrote {cfg.out}" + (f" and {png}" if png else ""))
    return 0


def _on_each(trainers: int) -> str:
    return f" on each of {trainers} trainers" if trainers > 1 else ""


def _metrics(point: Dict[str, Any]) -> str:
    """``test_* ..., valid_* ...`` of a curve point, test first."""
    keys = sorted((k for k in point if k.startswith(("test_", "valid_"))),
                  key=lambda k: not k.startswith("test_"))
    return ", ".join(f"{k}={point[k]:.4f}" for k in keys)


if __name__ == "__main__":
    sys.exit(main())
