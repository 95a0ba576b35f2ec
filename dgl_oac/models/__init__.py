"""Models: GraphSAGE and R-GCN encoders, link predictors and KG embedding scorers."""
from .kg import ComplEx, DistMult, KGScorer, TransE, kg_loss, kg_regularization
from .link import LinkPredictor, link_bce_loss
from .rgcn import RGCN
from .sage import SAGE, NodeClassifier, sage_inference

__all__ = ["RGCN", "SAGE", "sage_inference", "NodeClassifier", "LinkPredictor", "link_bce_loss",
           "KGScorer", "DistMult", "ComplEx", "TransE", "kg_loss", "kg_regularization"]
