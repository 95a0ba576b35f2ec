"""Torch 2.7.0's hang in ``destroy_process_group`` beside dgl-oac (issue 45, README's support table): 2 gloo ranks,
each cycle builds one ``NodeEmbedding`` (``variant="emb"``), or also trains a SparseAdam step (``"step"``), then
destroys the process group. On torch 2.7.0 a rank stays in ``destroy_process_group`` (``_world.tags_to_pg.clear()``,
a gloo group's destructor) within 30 cycles, with ``DGL_OAC_PEER_TIMEOUT=0`` too; on 2.13 and 2.15 it does not.
Each rank dumps its threads' stacks and exits 1 if a cycle takes over 25 s. Plain torch (a gloo side group, an
all_reduce, destroy) does not hang on 2.7.0.

    python scripts/repro_destroy_hang.py emb        # prints the exit codes: [0, 0] when no rank hung
"""
import datetime
import faulthandler
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, init: str, cycles: int, variant: str) -> None:
    import dgl_oac

    for i in range(cycles):
        faulthandler.dump_traceback_later(25, exit=True)
        dist.init_process_group("gloo", init_method=f"{init}-{i}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        emb = dgl_oac.NodeEmbedding(40, 6, f"m{i}", init_func=lambda t: t.fill_(0.5))
        if variant == "step":
            opt = dgl_oac.optim.SparseAdam([emb], lr=0.1)
            emb(torch.tensor([0, 1]) if rank == 0 else torch.tensor([0])).sum().backward()
            opt.step()
            del opt
        del emb
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    variant = sys.argv[1] if len(sys.argv) > 1 else "emb"
    ctx = mp.get_context("spawn")
    rendezvous = f"file://{tempfile.mkdtemp()}/rdv"
    procs = [ctx.Process(target=worker, args=(r, 2, rendezvous, 30, variant)) for r in range(2)]
    for p in procs:
        p.start()
    t0 = time.time()
    for p in procs:
        p.join(150)
    print(variant, torch.__version__, "exit codes", [p.exitcode for p in procs], f"{time.time() - t0:.1f} s")
