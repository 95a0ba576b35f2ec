"""ogbl-ddi through the link task's full-graph path (the real shared data; skipped where it is absent), and the
full-graph edge sampler on a small graph."""
from __future__ import annotations

import dgl
import pytest
import torch

from dgl_oac.app.data import data_root
from dgl_oac.app.models.link import LinkPredictor
from dgl_oac.dgl_frontend.sampling.full_graph import FullGraphEdgeSampler
from dgl_oac.app.tasks import TrainConfig, build_task
from dgl_oac.app.tasks.backend import table_of

DDI = data_root() / "ogbl-ddi" / "ogbl_ddi"


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _epoch(mode, prefetch="auto"):
    """One epoch of the ddi recipe at a small width (17 batches of 64K edges): losses, final table, dense
    weights, the evaluation, loader stats."""
    cfg = TrainConfig(task="link", dataset="ogbl-ddi", mode=mode, prefetch=prefetch, dim=8, hidden=8, scorer_hidden=8,
                      epochs=1, seed=3, progress=False)
    task = build_task(cfg)
    try:
        losses = [task.step(batch) for batch in task.loader]
        task.sync()
        table = table_of(task.emb).clone()
        model = {k: v.clone() for k, v in task.model.state_dict().items()}
        return losses, table, model, task.evaluate(), task.loader.stats.as_dict()
    finally:
        task.close()


@pytest.mark.slow
@pytest.mark.skipif(not DDI.is_dir(), reason="shared data ogbl-ddi absent")
@pytest.mark.hang_timeout(240)
def test_ddi_oac_equals_sync_bitwise():
    """The real ogbl-ddi with its default recipe (full-graph message passing, every row in every batch): oac
    at the automatic depth and at depth 2 trains exactly what sync trains, though nearly every row it read
    ahead was written before hand-out (patched)."""
    ref = _epoch("sync")
    assert len(ref[0]) == 17 and all(x == x for x in ref[0])  # ceil(1,067,911 / 65,536) finite losses
    assert set(ref[3]) == {"valid_hits@20", "test_hits@20"}  # OGB's Evaluator("ogbl-ddi") metric
    for prefetch in ("auto", 2):
        losses, table, model, metrics, stats = _epoch("oac", prefetch)
        assert losses == ref[0]
        assert torch.equal(table, ref[1])
        assert all(torch.equal(model[k], ref[2][k]) for k in ref[2])
        assert metrics == ref[3]
        assert stats["rows_patched"] > 0 and stats["batches"] == 17


def _graph():
    src = torch.tensor([0, 1, 1, 2, 2, 3])
    return dgl.graph((torch.cat([src, torch.tensor([1, 0, 2, 1, 3, 2])]),
                      torch.cat([torch.tensor([1, 0, 2, 1, 3, 2]), src])), num_nodes=5)


def test_full_graph_sampler_layout():
    g = _graph()
    sampler = FullGraphEdgeSampler(num_layers=2, negatives=3)
    torch.manual_seed(0)
    input_nodes, pair, neg, blocks = sampler.sample(g, torch.tensor([0, 4]))
    assert torch.equal(input_nodes, torch.arange(5))
    assert [x.tolist() for x in pair.edges()] == [[0, 2], [1, 3]]
    assert pair.num_nodes() == neg.num_nodes() == 5 and torch.equal(pair.edata[dgl.EID], torch.tensor([0, 4]))
    assert neg.num_edges() == 6
    assert len(blocks) == 2 and all(b.num_src_nodes() == b.num_dst_nodes() == 5 for b in blocks)
    assert all(torch.equal(torch.stack(b.edges()), torch.stack(g.edges())) for b in blocks)
    # rows attached to one batch's block stay with that batch; the structure is built once
    blocks[0].srcdata["emb"] = torch.ones(5, 2)
    _, _, _, again = sampler.sample(g, torch.tensor([1]))
    assert "emb" not in again[0].srcdata and "emb" not in blocks[1].srcdata
    assert sampler.full_block(g) is sampler.full_block(g)
    # its negatives come from torch's generator: a seeded batch is re-made exactly
    torch.manual_seed(7)
    first = sampler.sample(g, torch.tensor([1]))[2].edges()
    torch.manual_seed(7)
    assert all(torch.equal(a, b) for a, b in zip(first, sampler.sample(g, torch.tensor([1]))[2].edges()))


def test_full_graph_sampler_never_draws_an_edge_as_a_negative():
    """As OGB's negative_sampling: a random pair that is an edge of the graph is drawn again. On a 6-node graph
    with 26 of its 36 ordered pairs edges, 1,000 draws hit only the 10 non-edges, each of them."""
    n = 6
    pairs = [(u, v) for u in range(n) for v in range(n)]
    non_edges = {(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (0, 5), (5, 0), (1, 4), (4, 1)}
    src, dst = zip(*[p for p in pairs if p not in non_edges])
    g = dgl.graph((torch.tensor(src), torch.tensor(dst)), num_nodes=n)
    sampler = FullGraphEdgeSampler(1, negatives=100)
    torch.manual_seed(0)
    neg = sampler.sample(g, torch.arange(10))[2]
    drawn = set(zip(*[x.tolist() for x in neg.edges()]))
    assert neg.num_edges() == 1000 and drawn == non_edges
    complete = dgl.graph((torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])))
    with pytest.raises(ValueError, match="every pair of the graph's 2 nodes is an edge"):
        FullGraphEdgeSampler(1).sample(complete, torch.tensor([0]))


def test_clip_grad_norm_bounds_each_update_like_ogb():
    """--clip-grad-norm c (OGB's ddi script): the batch's embedding rows, the encoder and the scorer each get a
    gradient of norm <= c. With SGD rows (every row of the full-graph batch once, so the update is -lr * grad) the
    table moves by at most lr * c per step, and by more without the clip; oac still equals sync; other tasks and
    non-positive values are refused."""
    def run(mode, clip):
        cfg = TrainConfig(task="link", num_nodes=300, mode=mode, message_passing="full", fanouts="-1", negatives=1,
                          batch_size=256, dim=8, hidden=8, scorer="mlp", optimizer="sgd", lr=1.0, epochs=1, seed=2,
                          clip_grad_norm=clip, progress=False)
        task = build_task(cfg)
        try:
            moves, losses = [], []
            for batch in task.loader:
                task.sync()
                before = table_of(task.emb).clone()
                losses.append(task.step(batch))
                task.sync()
                moves.append(float((table_of(task.emb) - before).norm()))
            return moves, losses, table_of(task.emb).clone()
        finally:
            task.close()

    clipped, losses, table = run("sync", 1e-3)
    assert max(clipped) <= 1e-3 * (1 + 1e-5)
    assert max(run("sync", None)[0]) > 1e-2
    oac = run("oac", 1e-3)
    assert oac[1] == losses and torch.equal(oac[2], table)
    with pytest.raises(ValueError, match="--clip-grad-norm must be a positive number and is for --task link"):
        build_task(TrainConfig(task="node", num_nodes=200, clip_grad_norm=1.0, progress=False))
    with pytest.raises(ValueError, match="--clip-grad-norm must be a positive number"):
        build_task(TrainConfig(task="link", num_nodes=200, clip_grad_norm=0.0, progress=False))


def test_evaluation_scores_in_float32_under_bf16_autocast():
    """--autocast bf16 trains in bfloat16 but ranks in float32: bfloat16 logits tie at the top of a ranking
    (8 significant bits), which turns Hits@K, a count of positives strictly above the K-th negative, into 0."""
    cfg = TrainConfig(task="link", num_nodes=300, message_passing="full", fanouts="-1,-1", negatives=2,
                      batch_size=128, dim=8, hidden=8, scorer="mlp", epochs=1, seed=1, autocast="bf16",
                      progress=False)
    task = build_task(cfg)
    try:
        for batch in task.loader:
            task.step(batch)
        task.sync()
        h = torch.randn(10, 8)
        scores = task._scores(h, torch.arange(10), torch.arange(10).flip(0))
        assert scores.dtype == torch.float32
        with torch.no_grad():
            exact = task.model.score_pairs(h, h.flip(0))
        assert torch.equal(scores, exact)  # the float32 model, not its bfloat16 autocast
    finally:
        task.close()


def test_full_graph_sampler_errors():
    with pytest.raises(ValueError, match="num_layers must be a positive integer, got 0"):
        FullGraphEdgeSampler(0)
    with pytest.raises(ValueError, match="negatives must be a positive integer, got 0"):
        FullGraphEdgeSampler(2, negatives=0)
    hg = dgl.heterograph({("a", "r", "b"): ([0], [1])})
    with pytest.raises(TypeError, match="homogeneous graph"):
        FullGraphEdgeSampler(1).sample(hg, torch.tensor([0]))


def test_mlp_scorer_layers_and_dropout():
    """OGB's predictor: 3 linear layers, ReLU + dropout between them; 2 layers without dropout is the former
    default's exact module layout (so older checkpoints still load)."""
    ogb = LinkPredictor(emb_dim=8, scorer="mlp", hidden_dim=4, mlp_layers=3, dropout=0.5)
    assert [type(m).__name__ for m in ogb.mlp] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout",
                                                    "Linear"]
    assert [m.out_features for m in ogb.mlp if isinstance(m, torch.nn.Linear)] == [4, 4, 1]
    task = build_task(TrainConfig(task="link", num_nodes=200, hidden=16, scorer="mlp", scorer_layers=3,
                                  scorer_hidden=4, progress=False))  # --scorer-hidden sets the MLP's width alone
    try:
        assert [m.out_features for m in task.model.mlp if isinstance(m, torch.nn.Linear)] == [4, 4, 1]
        assert task.model.mlp[0].in_features == 16
    finally:
        task.close()
    two = LinkPredictor(emb_dim=8, scorer="mlp")
    assert [type(m).__name__ for m in two.mlp] == ["Linear", "ReLU", "Linear"]
    assert set(two.state_dict()) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
    with pytest.raises(ValueError, match="mlp_layers must be a positive integer, got 0"):
        LinkPredictor(emb_dim=8, scorer="mlp", mlp_layers=0)


def test_link_task_refuses_unknown_message_passing():
    cfg = TrainConfig(task="link", num_nodes=200, message_passing="everything", progress=False)
    with pytest.raises(ValueError, match="unknown --message-passing 'everything'; expected one of sampled, full"):
        build_task(cfg)
    with pytest.raises(ValueError, match="--init-scale must be positive"):
        build_task(TrainConfig(task="link", num_nodes=200, init_scale=0.0, progress=False))
    with pytest.raises(ValueError, match="--scorer-hidden must be a positive integer, got 0"):
        build_task(TrainConfig(task="link", num_nodes=200, scorer_hidden=0, progress=False))


def _train_full_synthetic(mode, autocast):
    """Two epochs of the full path on a small synthetic graph, MLP scorer with dropout: (losses, final table)."""
    cfg = TrainConfig(task="link", num_nodes=300, mode=mode, message_passing="full", fanouts="-1,-1",
                      negatives=2, batch_size=128, dim=8, hidden=8, scorer="mlp", scorer_layers=3, dropout=0.5,
                      init_scale=0.05, epochs=2, seed=1, autocast=autocast, progress=False)
    task = build_task(cfg)
    try:
        losses = [task.step(b) for _ in range(2) for b in task.loader]
        task.sync()
        return losses, table_of(task.emb).clone(), task.evaluate()
    finally:
        task.close()


@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_full_message_passing_on_synthetic_oac_equals_sync(autocast):
    """The full path on a small synthetic graph, with the MLP scorer and dropout, in float32 and under bfloat16
    autocast: oac == sync bitwise (losses, table, evaluation)."""
    ref = _train_full_synthetic("sync", autocast)
    got = _train_full_synthetic("oac", autocast)
    assert got[0] == ref[0] and torch.equal(got[1], ref[1]) and got[2] == ref[2]


def test_autocast_bf16_computes_in_bfloat16():
    """--autocast bf16 changes the dense model's arithmetic (not a no-op) but keeps the table float32 and the
    training close to float32's; an unknown value is refused by name."""
    f32 = _train_full_synthetic("sync", "off")
    bf16 = _train_full_synthetic("sync", "bf16")
    assert bf16[1].dtype == torch.float32
    assert bf16[0] != f32[0]
    assert max(abs(a - b) for a, b in zip(bf16[0], f32[0])) < 0.05
    with pytest.raises(ValueError, match="unknown --autocast 'fp8'; expected one of auto, off, bf16"):
        build_task(TrainConfig(task="link", num_nodes=200, autocast="fp8", progress=False))


@pytest.mark.parametrize("flags, want", [
    ("fpu sse2 avx2 fma avx512f avx512bw avx512_bf16", "bf16"),  # x86 with AVX512-BF16
    ("fpu sse2 avx2 amx_tile amx_bf16", "bf16"),                  # x86 with AMX
    ("fpu sse2 avx2 fma", "off"),                                 # x86 with AVX2 only: ogbl-ddi's 20x slow case
    ("fpu sse2 avx2 avx512f avx512bw", "off"),                    # AVX-512 without its bfloat16 instructions
])
def test_autocast_auto_is_bf16_only_where_the_cpu_computes_bfloat16(tmp_path, flags, want):
    """Regression (issue 49): the ogbl-ddi default ran bfloat16 on a CPU without AVX512-BF16, where DGL's
    bfloat16 message passing takes its generic kernels: 19 s a step instead of 1."""
    from dgl_oac.app.tasks.link import native_bf16, resolve_autocast

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    cpu = torch.device("cpu")
    assert native_bf16(cpu, str(info)) == (want == "bf16")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert native_bf16(cpu, str(arm)) and not native_bf16(cpu, str(tmp_path / "missing"))
    assert resolve_autocast("off", cpu) == "off" and resolve_autocast("bf16", cpu) == "bf16"
    assert resolve_autocast("auto", cpu) == ("bf16" if native_bf16(cpu) else "off")
    task = build_task(TrainConfig(task="link", num_nodes=200, autocast="auto", progress=False))
    try:
        assert task.autocast == resolve_autocast("auto", cpu)
    finally:
        task.close()
