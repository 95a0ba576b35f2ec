"""Models of the training application: GraphSAGE and R-GCN encoders, link predictors and KG embedding scorers.
They take DGL's blocks or, on a device without DGL's CUDA build, :mod:`dgl_oac.blocks`' index tensors."""
from .kg import ComplEx, DistMult, KGScorer, TransE, kg_loss, kg_regularization
from .link import LinkPredictor, link_bce_loss
from .rgcn import RGCN
from .sage import SAGE, NodeClassifier, sage_inference

__all__ = ["RGCN", "SAGE", "sage_inference", "NodeClassifier", "LinkPredictor", "link_bce_loss", "KGScorer",
           "DistMult", "ComplEx", "TransE", "kg_loss", "kg_regularization"]
