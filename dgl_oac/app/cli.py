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
from .tasks.common import DENSE_SYNCS
from .tasks.backend import BACKEND_MODES, OPTIMIZERS
from .tasks.defaults import describe, per_task_options
from .tasks.link import AUTOCAST

HELP = {
    "task": "what to train: node classification, link prediction, knowledge-graph embeddings, or node "
            "classification on a heterograph (hetero-node: R-GCN, learnable tables for featureless types)",
    "dataset": "'synthetic' (default, generated in-process), 'synthetic-mag' (an ogbn-mag-shaped heterograph, for "
               "--task hetero-node), an OGB name (ogbn-arxiv, ogbl-wikikg2, ...), a shared "
               "dataset name (cora, pubmed, coauthor-physics, github-social, FB15k-237, WN18RR, codex-m) or a path",
    "root": "where OGB datasets (or shared data) live; default: $DGL_OAC_OGB_ROOT / ../shared/data",
    "model": "node/link: 'sage'; hetero-node: 'rgcn'; kg: 'distmult', 'complex' or 'transe'",
    "mode": "sync: one batch at a time (exact); async: prefetch rows, stale reads (Marius-style); oac: prefetch "
            "and validate, exactly equal to sync; dgl: plain dgl.nn.NodeEmbedding + dgl.optim + DGL DataLoader",
    "prefetch": "batches gathered ahead of compute (async/oac): a number, or 'auto' (the depth, 0 to 4, chosen "
                "online from measured step times; oac is exact at every depth)",
    "background_priority": "async/oac: 'idle' runs the gather and write-back threads only on cores the training "
                           "thread leaves free (Linux SCHED_IDLE); 'normal' on machines shared with heavy jobs",
    "staleness": "async only: a rule for stale rows, 'gap' (Gap-Aware: stale gradients divided by how far the row "
                 "moved) or 'lookahead' (DANA-style: compute at Adam's momentum-predicted row); not exact either",
    "epochs": "passes over the training set",
    "batch_size": "seed nodes (node tasks) or edges/triples (link, kg) per batch",
    "fanouts": "neighbours sampled per layer, comma-separated (e.g. 10,5; -1 = all)",
    "negatives": "negative samples per batch (link, kg)",
    "dim": "embedding dimension",
    "hidden": "hidden dimension of the GNN",
    "lr": "learning rate of the sparse (embedding) optimizer",
    "dense_lr": "learning rate of the dense (model) optimizer (node/link: Adam; kg: the kind of --optimizer)",
    "optimizer": "sparse row optimizer",
    "dropout": "dropout between GNN layers",
    "seed": "seed of the batch stream and the model initialisation",
    "device": "auto (CUDA if present), cpu or cuda[:N]",
    "eval_batch_size": "nodes/triples per evaluation chunk (bounds evaluation memory)",
    "max_steps": "stop after this many training steps (smoke runs)",
    "num_nodes": "size of the synthetic graph (default 100000 nodes)",
    "num_workers": "sampling worker processes (0: sample on the training thread); the batches are the same for any "
                   "number",
    "threads": "torch intra-op threads (default: torch's choice)",
    "out": "write the JSON summary (per-epoch curve, 'best' = the best-validation epoch, 'final' = the last, "
           "throughput, loader stats) here, and a PNG plot beside it",
    "neg_dist": "negative sampling distribution (link, kg): 'uniform' or 'degree' (degree ** 0.75)",
    "scorer": "link: edge scorer on the encoder outputs, 'dot' or 'mlp' (MLP of the Hadamard product)",
    "scorer_layers": "link: linear layers of the 'mlp' scorer (ReLU and --dropout between them)",
    "scorer_hidden": "link: width of the 'mlp' scorer's hidden layers",
    "message_passing": "link: 'sampled' (neighbour-sampled blocks per --fanouts, the batch's edges excluded from "
                       "them, --negatives shared tails) or 'full' (every batch over the whole training graph, "
                       "--negatives random pairs per positive: OGB's full-batch baselines, for small dense graphs)",
    "autocast": "link: 'bf16' trains the dense model (encoder and scorer) under torch.autocast(bfloat16), its "
                "matrix products in bfloat16 (parameters, embedding table, optimizer state, loss and evaluation "
                "stay float32), or 'off'",
    "loss": "kg: 'ce' (softmax over the positive and its negatives), 'logsigmoid', 'softplus' or 'margin'; "
            "auto = ce for distmult/complex, logsigmoid for transe",
    "regularizer": "kg: 'n3', 'l2' or 'none', on the batch's head/relation/tail rows (see --reg-weight)",
    "reg_weight": "kg: weight of --regularizer (0 = off)",
    "init_scale": "kg: entities (and nothing else) start uniform in [-s, s] (default 0.1); link: the embedding "
                  "starts uniform in [-s, s] (default: normal with std 0.1; link on ogbl-ddi 0.0364, Xavier's bound)",
    "clip_grad_norm": "link: before each step, clip the gradient norm of the batch's embedding rows, of the "
                      "encoder and of the scorer, each to this value (default: off; link on ogbl-ddi 1.0, as OGB)",
    "adv_temperature": "kg: self-adversarial negative weighting temperature (losses other than ce)",
    "eval_limit": "link, kg: rank a fixed random subset of this many valid edges/triples every epoch (the "
                  "best-validation epoch is chosen on it) and of test ones; the test set is ranked in full at "
                  "the last epoch and at each new best validation epoch",
    "checkpoint_dir": "save checkpoints (table rows with optimizer state, models, loader position, RNG) to "
                      "DIR/checkpoint.ckpt, atomically, after every epoch (and see --checkpoint-every)",
    "checkpoint_every": "also save a checkpoint every N training steps (mid-epoch)",
    "resume": "continue from the checkpoint in --checkpoint-dir (from scratch when there is none yet); the result "
              "equals an uninterrupted run's (sync, oac)",
    "dense_sync": "several trainers (torchrun): 'allreduce' averages the dense gradients before every step (DDP's "
                  "semantics, exact); 'shadow' (ShadowSync, NOT exact) lets each trainer step its own dense "
                  "parameters and averages them in the background every --shadow-every steps and after every "
                  "epoch; refused with one process and with --checkpoint-dir",
    "shadow_every": "--dense-sync shadow: steps between background averagings of the dense parameters",
}


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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` after each option, the per-task defaults for the options that have them."""

    def _get_help_string(self, action: argparse.Action) -> str:
        name = action.dest
        if name in per_task_options():
            return f"{action.help} (default: {describe(name)})"
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The ``dgl-oac`` parser: one subcommand, ``train``, with a flag per :class:`~dgl_oac.app.tasks.TrainConfig`
    field (``--no-progress`` and ``--resume`` besides). Per-task defaults are shown in ``--help``."""
    parser = argparse.ArgumentParser(prog="dgl-oac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model", description=HELP["mode"],
                        formatter_class=_HelpFormatter)
    choices = {"task": TASK_NAMES, "mode": BACKEND_MODES, "optimizer": OPTIMIZERS,
               "background_priority": PRIORITIES, "staleness": STALENESS, "autocast": AUTOCAST,
               "dense_sync": DENSE_SYNCS}
    for f in fields(TrainConfig):
        if f.name in ("extra", "progress", "resume"):
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float}.get(str(f.type).replace("Optional[", "").rstrip("]"), str)
        if f.name == "prefetch":
            kind = _prefetch
        tr.add_argument(flag, type=kind, default=f.default, help=HELP[f.name], choices=choices.get(f.name))
    tr.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    tr.add_argument("--resume", action="store_true", help=HELP["resume"])
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
