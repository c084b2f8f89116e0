"""Differential privacy for ViT fine-tuning: fast per-example gradient norms plugged into
Opacus, single-backward book-keeping clipping (`book_keeping`, mode "bk"), trainable-parameter
regimes, budget planning and a DP-SGD loop.

Importing this package registers the fast norm samplers (`norm_samplers`) and the
book-keeping rules (`book_keeping`), so any user of `train_private`/`wrap_fast` has them;
coverage is checked before training.
"""
from pipeline_src.dp.additive import AdditiveDelta
from pipeline_src.dp.bk_rules import BK_RULES, register_bk_rule
from pipeline_src.dp.book_keeping import BookKeepingModule, check_bk_supported
from pipeline_src.dp.budget import InfeasibleBudget, epsilon_for, plan_budget
from pipeline_src.dp.norm_samplers import (
                                           FAST_SQ_NORM_SAMPLERS,
                                           attach_fast_norm_samplers,
                                           check_fast_supported,
                                           register_fast_norm_sampler,
                                           wrap_fast,
)
from pipeline_src.dp.private_training import MODES, per_example_cross_entropy, train_private
from pipeline_src.dp.regimes import REGIMES, apply_regime, nlft_scope

__all__ = ["AdditiveDelta", "BK_RULES", "BookKeepingModule", "check_bk_supported", "register_bk_rule",
           "InfeasibleBudget", "epsilon_for", "plan_budget", "FAST_SQ_NORM_SAMPLERS",
           "attach_fast_norm_samplers", "check_fast_supported", "register_fast_norm_sampler", "wrap_fast",
           "MODES", "per_example_cross_entropy", "train_private", "REGIMES", "apply_regime", "nlft_scope"]
