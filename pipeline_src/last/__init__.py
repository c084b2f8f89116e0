"""LAST: low-rank attention side-tuning on a frozen timm VisionTransformer.

Paper: Tang, Fu, Zhu, Wu, "Low-Rank Attention Side-Tuning for Parameter-Efficient
Fine-Tuning", arXiv:2402.04009, 2024.

    features.py         frozen no-grad feature extraction (z_0..z_m) and the block-indexed cache
    side_network.py     LSA module and the side network (bias correction, head)
    train.py            one side network, torch.optim.AdamW
    low_rank_stream.py  forward of M stacked side networks on shared features, residual stream in low-rank form
    grid.py             many side networks at once (stacked parameters, one AdamW step per group)
"""
from pipeline_src.last.features import extract_feature_dict, extract_features, feature_keys, side_inputs
from pipeline_src.last.grid import SideGrid, train_side_grid
from pipeline_src.last.side_network import LowRankSelfAttention, SideNetwork
from pipeline_src.last.train import batch_order, build_side_network, normalize_member, train_side_network

__all__ = [
    "extract_features", "extract_feature_dict", "feature_keys", "side_inputs",
    "LowRankSelfAttention", "SideNetwork",
    "normalize_member", "build_side_network", "batch_order", "train_side_network",
    "SideGrid", "train_side_grid",
]
