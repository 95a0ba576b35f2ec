"""Models: GraphSAGE and R-GCN encoders, link predictors and KG embedding scorers; index-tensor blocks
(:mod:`.blocks`) for a device without DGL's CUDA build."""
from ...blocks import IndexBlock, IndexGraph, aggregate
from .kg import ComplEx, DistMult, KGScorer, TransE, kg_loss, kg_regularization
from .link import LinkPredictor, link_bce_loss
from .rgcn import RGCN
from .sage import SAGE, NodeClassifier, sage_inference

__all__ = ["IndexBlock", "IndexGraph", "aggregate", "RGCN", "SAGE", "sage_inference", "NodeClassifier", "LinkPredictor", "link_bce_loss",
           "KGScorer", "DistMult", "ComplEx", "TransE", "kg_loss", "kg_regularization"]
