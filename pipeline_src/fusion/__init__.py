"""Model fusion: uniform soup, Fisher-weighted averaging, RegMean.

Each works on state dicts with or without prior matching (`pipeline_src.matching`):
- `soup`: Wortsman et al., ICML 2022.
- `fisher`: Matena & Raffel, NeurIPS 2022.
- `regmean`: Jin et al., ICLR 2023.
`registry.fuse(method, ...)` is the single entry point used by the pipeline.
"""
from pipeline_src.fusion.fisher import diagonal_fisher, fisher_merge
from pipeline_src.fusion.registry import FUSION_METHODS, fuse, register
from pipeline_src.fusion.regmean import linear_input_grams, regmean_merge
from pipeline_src.fusion.soup import weighted_average

__all__ = ["weighted_average", "diagonal_fisher", "fisher_merge", "linear_input_grams", "regmean_merge",
           "FUSION_METHODS", "fuse", "register"]
