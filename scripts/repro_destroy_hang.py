"""torch 2.7.0 and 2.7.1 deadlock now and then in ``destroy_process_group()`` when they destroy a gloo group that
nothing but c10d references (inside ``_world.tags_to_pg.clear()``: the group's destructor); torch 2.8, 2.13 and 2.15
do not.
dgl-oac's table group was such a group until ``dgl_oac.distributed.group`` held it itself (until the next default
group, or exit). 2 gloo ranks, ``cycles`` times: init, the variant's work, ``destroy_process_group()``; a rank
whose cycle takes over 25 s dumps its threads' stacks and exits 1.

    python scripts/repro_destroy_hang.py emb            # a NodeEmbedding a cycle: exit codes [0, 0]
    python scripts/repro_destroy_hang.py step           # ... and a SparseAdam step
    python scripts/repro_destroy_hang.py plain          # plain torch, an unreferenced side group: [1, 1] on 2.7.0
                                                        # and 2.7.1 (3 runs of 3 each), [0, 0] on 2.8.0
"""
import datetime
import faulthandler
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("emb", "step", "plain")


def worker(rank: int, world: int, init: str, cycles: int, variant: str) -> None:
    import dgl_oac

    for i in range(cycles):
        faulthandler.dump_traceback_later(25, exit=True)
        dist.init_process_group("gloo", init_method=f"{init}-{i}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        if variant == "plain":  # the side group referenced by c10d alone when the default group is destroyed
            dist.all_reduce(torch.ones(2), group=dist.new_group(backend="gloo"))
        else:
            emb = dgl_oac.NodeEmbedding(40, 6, f"m{i}", init_func=lambda t: t.fill_(0.5))
            if variant == "step":
                opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)
                emb(torch.tensor([0, 1]) if rank == 0 else torch.tensor([0])).sum().backward()
                opt.step()
                del opt
            del emb
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


def main(variant: str = "emb", cycles: int = 30) -> list:
    """Run the two ranks; returns their exit codes ([0, 0]: no rank hung)."""
    if variant not in VARIANTS:
        raise SystemExit(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    ctx = mp.get_context("spawn")
    rendezvous = f"file://{tempfile.mkdtemp()}/rdv"
    procs = [ctx.Process(target=worker, args=(r, 2, rendezvous, cycles, variant)) for r in range(2)]
    for p in procs:
        p.start()
    t0 = time.time()
    for p in procs:
        p.join(30 * cycles)
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    print(variant, torch.__version__, "exit codes", codes, f"{time.time() - t0:.1f} s")
    return codes


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "emb", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
