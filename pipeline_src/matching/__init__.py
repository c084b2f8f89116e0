"""Parameter matching of transformers to an anchor before fusion.

Zhang et al., "Beyond the Permutation Symmetry of Transformers: The Role of Rotation for
Model Fusion", ICML 2025: per-head rotations of attention (Q/K, V/O), permutations of FFN
hidden units, and per-head scaling. Modules:

- `attention_rotation`: per-head Procrustes / permutation / head assignment on plain tensors,
  for one layer or many at once (`match_attention_layers`: one batched SVD for all heads).
- `scaling`: the quartic (eq. 12) for the per-head scale.
- `ffn_permutation`: linear assignment of hidden units.
- `sparse_assignment`: exact linear assignment on top-k candidates with an LP-duality
  certificate (falls back to scipy's dense solver), used by `ffn_permutation`.
- `match_models`: timm VisionTransformer state-dict adapter (`match_to_anchor`).
- `lsa_rotation`: adapter for LAST's low-rank attention side modules.
"""
from pipeline_src.matching.attention_rotation import HeadWeights, match_attention_heads, match_attention_layers
from pipeline_src.matching.lsa_rotation import LSAKeyNames, match_lsa_projections, match_lsa_state_dict
from pipeline_src.matching.match_models import (
    block_indices,
    match_many,
    match_to_anchor,
    matched_keys,
    parameter_distance,
)

__all__ = [
    "HeadWeights", "match_attention_heads", "match_attention_layers",
    "LSAKeyNames", "match_lsa_projections", "match_lsa_state_dict",
    "block_indices", "match_many", "match_to_anchor", "matched_keys", "parameter_distance",
]
