"""``dgl-oac``: the command line, parsed before anything heavy is imported.

This module imports neither torch nor DGL (each takes seconds): ``dgl-oac --help`` and a refused flag answer at
once, and only a run that parsed imports the training code (:mod:`dgl_oac.app.cli_train`). The options' choices
and defaults are therefore written here; tests/app/test_cli_help.py checks them against the tuples the library
checks and against :class:`~dgl_oac.app.tasks.TrainConfig`.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

DESCRIPTION = ("Learnable node embeddings in CPU memory, trained through a pipeline that is bitwise equal to "
               "synchronous training. 'dgl-oac train' with no options trains GraphSAGE with learnable embeddings "
               "on a synthetic graph generated in-process (nothing is downloaded). Under torchrun "
               "('torchrun --standalone --nproc_per_node=N -m dgl_oac train ...') N trainers train it together.")
#: what each exit status means (``--help``'s epilog, :func:`main`)
EXIT_OK, EXIT_USAGE, EXIT_NONFINITE, EXIT_INTERRUPTED = 0, 2, 3, 130
EPILOG = (f"exit status: {EXIT_OK} done, {EXIT_USAGE} bad option or dataset, {EXIT_NONFINITE} NaN/Inf in a step, "
          f"{EXIT_INTERRUPTED} Ctrl-C")
#: the smallest ``--num-nodes`` every synthetic task trains on (synthetic-mag needs 16; node/link place 10 edges
#: a node among at least 16)
MIN_SYNTHETIC_NODES = 16

#: choices of the options that have them (the library's own tuples: TASK_NAMES, BACKEND_MODES, OPTIMIZERS,
#: PRIORITIES, STALENESS, AUTOCAST, DENSE_SYNCS, SHARDINGS; tests/app/test_cli_help.py checks each)
CHOICES: Dict[str, tuple] = {
    "task": ("node", "link", "kg", "hetero-node"), "mode": ("sync", "async", "oac", "dgl"),
    "optimizer": ("sgd", "adagrad", "adam", "rowwise_adagrad"), "background_priority": ("auto", "idle", "normal"),
    "staleness": ("gap", "lookahead"), "autocast": ("auto", "off", "bf16"), "dense_sync": ("allreduce", "shadow"),
    "sharding": ("replicated", "rows")}
#: each option's parser and default (None: the task's default, or off); TrainConfig's fields, in its order
DEFAULTS: Dict[str, Any] = {
    "task": "node", "dataset": "synthetic", "root": None, "model": None, "mode": "oac", "prefetch": "auto",
    "background_priority": "auto", "staleness": None, "num_workers": None, "epochs": None, "batch_size": None,
    "fanouts": None, "negatives": None, "dim": None, "hidden": None, "lr": None, "dense_lr": None,
    "optimizer": None, "dropout": None, "seed": 0, "device": "auto", "eval_batch_size": 4096, "max_steps": None,
    "num_nodes": None, "threads": None, "progress": True, "out": None, "neg_dist": "uniform", "scorer": None,
    "scorer_layers": None, "scorer_hidden": None, "message_passing": None, "autocast": None, "loss": "auto",
    "regularizer": "n3", "reg_weight": None, "init_scale": None, "clip_grad_norm": None, "adv_temperature": None,
    "eval_limit": None, "checkpoint_dir": None, "checkpoint_every": None, "resume": False,
    "dense_sync": "allreduce", "shadow_every": 8, "sharding": "replicated"}
FLOATS = ("lr", "dense_lr", "dropout", "reg_weight", "init_scale", "clip_grad_norm", "adv_temperature")
INTS = ("num_workers", "epochs", "batch_size", "negatives", "dim", "hidden", "seed", "eval_batch_size", "max_steps",
        "num_nodes", "threads", "scorer_layers", "scorer_hidden", "eval_limit", "checkpoint_every", "shadow_every")

HELP = {
    "task": "node classification, link prediction, knowledge-graph embeddings, or node classification on a "
            "heterograph (R-GCN)",
    "dataset": "'synthetic' (generated), 'synthetic-mag' (hetero-node), an OGB name (ogbl-ddi, ...), a shared "
               "dataset (cora, pubmed, coauthor-physics, github-social, FB15k-237, WN18RR, codex-m) or a path",
    "root": "data root: dataset NAME is DIR/NAME/ (default: $DGL_OAC_DATA, else ../shared/data)",
    "model": "'sage' (node, link), 'rgcn' (hetero-node), 'distmult', 'complex' or 'transe' (kg)",
    "mode": "sync: one batch at a time; async: rows prefetched and read stale (Marius); oac: prefetched and "
            "validated, equal to sync; dgl: plain DGL",
    "prefetch": "batches gathered ahead of compute (async, oac): a number (0: sync's schedule), or 'auto' (0 to "
                "4, from measured step times)",
    "background_priority": "background threads: 'idle' (SCHED_IDLE), 'normal', or 'auto': idle unless "
                           "another process is busy on these cores",
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
    "num_nodes": f"nodes of the synthetic graph, >= {MIN_SYNTHETIC_NODES} (default: 100000)",
    "num_workers": "sampling processes, 0: the training thread (default: 0; on CUDA workers warn); same batches",
    "threads": "torch threads >= 1 (default: cores left by pipeline)",
    "out": "write a JSON summary (curve, best and last epoch, throughput, stats) here, and a PNG plot beside it",
    "neg_dist": "negative sampling: 'uniform' or 'degree' (degree ** 0.75)",
    "scorer": "edge scorer: 'dot', or 'mlp' on the Hadamard product",
    "scorer_layers": "linear layers of the 'mlp' scorer",
    "scorer_hidden": "width of the 'mlp' scorer's hidden layers",
    "message_passing": "'sampled' (blocks per --fanouts) or 'full' (the whole training graph every batch, as "
                       "OGB's full-batch baselines)",
    "autocast": "'bf16': dense matmuls in bfloat16; 'auto': bf16 where the device has it natively, else off",
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
#: (but ``extra``) is in one (tests/app/test_cli_help.py)
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


def task_defaults_module() -> ModuleType:
    """:mod:`dgl_oac.app.tasks.defaults` (the per-task defaults ``--help`` lists), without importing the
    ``tasks`` package: its ``__init__`` imports torch, and the module itself imports nothing. Once the package
    is imported (a training run, the tests) this is that package's module."""
    name = "dgl_oac.app.tasks.defaults"
    if name in sys.modules or "dgl_oac.app.tasks" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "tasks" / "defaults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a private copy of constant tables, never registered in sys.modules
    return module


def _integer(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``; the refusal says the range (and ``why``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}{why}, got {text!r}")
        return value
    return parse


def _prefetch(text: str) -> Any:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0 (0: sync's schedule), got {text!r}")
    return value


#: options checked here, before anything is imported (the rest are checked by the task, with the same exit status)
RANGES: Dict[str, Callable[[str], Any]] = {
    "prefetch": _prefetch, "num_workers": _integer(0), "threads": _integer(1), "max_steps": _integer(1),
    "num_nodes": _integer(MIN_SYNTHETIC_NODES, " (the smallest synthetic graph every task trains on)")}


class _HelpFormatter(argparse.HelpFormatter):
    """Each default once, after the help: the per-task defaults of the tasks that read the option
    (``describe`` in :mod:`dgl_oac.app.tasks.defaults`), a plain default where there is one; nothing for on/off
    flags, for options without a default, or where the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        defaults = task_defaults_module()
        if action.dest in defaults.per_task_options():
            return f"{text} (default: {defaults.describe(action.dest, USED_BY.get(action.dest))})"
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default:" in text:
            return text
        return f"{text} (default: {action.default})"


def build_parser() -> argparse.ArgumentParser:
    """The ``dgl-oac`` parser: one subcommand, ``train``, with a flag per TrainConfig field (``--no-progress`` and
    ``--resume`` as on/off flags), grouped as :data:`GROUPS` says. Imports nothing heavy."""
    parser = argparse.ArgumentParser(prog="dgl-oac", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model", usage="dgl-oac train [options]", epilog=EPILOG,
                        description="Train a built-in task. Every option has a default; plain 'dgl-oac train' "
                                    "trains GraphSAGE over learnable embeddings on a synthetic graph in oac mode.",
                        formatter_class=_HelpFormatter)
    for title, _, names in GROUPS:
        group = tr.add_argument_group(title)
        for name in names:
            if name == "progress":
                group.add_argument("--no-progress", dest="progress", action="store_false", help=HELP[name])
            elif name == "resume":
                group.add_argument("--resume", action="store_true", help=HELP[name])
            else:
                kind = RANGES.get(name) or (float if name in FLOATS else int if name in INTS else str)
                metavar = None if name in CHOICES else "DIR" if name == "root" else name.split("_")[-1].upper()
                group.add_argument("--" + name.replace("_", "-"), type=kind, default=DEFAULTS[name],
                                   help=HELP[name], choices=CHOICES.get(name), metavar=metavar)
    return parser


def options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Dict[str, Any]:
    """The TrainConfig keyword arguments of parsed ``args``; refuses (``dgl-oac train: error: ...``, exit status 2)
    what no flag alone can check. ``--prefetch 0`` is sync's schedule (each batch gathered after the previous step), so
    it runs ``--mode sync``."""
    opts = {k: v for k, v in vars(args).items() if k != "command"}
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    if opts["num_nodes"] is not None and opts["dataset"].strip().lower() not in ("synthetic", "synthetic-mag"):
        train.error(f"argument --num-nodes: sizes the generated datasets (synthetic, synthetic-mag), not "
                     f"--dataset {opts['dataset']}")
    if opts["prefetch"] == 0:
        if opts["mode"] in ("async", "oac"):
            dropped = opts["mode"] == "async" and opts["staleness"]  # (oac refuses --staleness anyway)
            note = "; --staleness has nothing to correct there" if dropped else ""
            print(f"dgl-oac: --prefetch 0 gathers each batch after the previous step, sync's schedule: running "
                  f"--mode sync{note}", file=sys.stderr)
            opts.update(mode="sync", staleness=None if dropped else opts["staleness"])
        opts["prefetch"] = "auto"  # sync and dgl prefetch nothing at any setting
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``dgl-oac`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status (:data:`EPILOG`): 0; 2
    with ``dgl-oac: error: ...`` on stderr for a bad option, configuration, missing dataset or DGL (argparse exits 2
    itself for a flag it refuses); 3 with one line naming the step and the table when a step was NaN or Inf;
    130 with one line when interrupted (Ctrl-C). Under torchrun only rank 0 prints and writes ``--out``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    opts = options(parser, args)
    if opts.get("threads"):  # before torch starts OpenMP; and a count the user set (dgl_oac.engine.runtime)
        os.environ["OMP_NUM_THREADS"] = str(opts["threads"])
    try:
        from . import cli_train  # torch, DGL and the tasks: only for a run that parsed

        try:
            cfg, result, lead = cli_train.train(opts)
        except (ValueError, FileNotFoundError, TypeError) as exc:
            print(f"dgl-oac: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ImportError as exc:
            if exc.name != "dgl":  # a task that needs DGL, without it: dgl_oac.needs_dgl's advice, in one line
                raise
            print(f"dgl-oac: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except FloatingPointError as exc:
            print(f"dgl-oac: error: {exc}", file=sys.stderr)
            return EXIT_NONFINITE
        if lead:
            cli_train.report(cfg, result)
    except KeyboardInterrupt as exc:
        print(f"dgl-oac: interrupted (Ctrl-C){exc.args[0] if exc.args else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
