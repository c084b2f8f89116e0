"""Composable, private and removable fine-tuning of vision transformers.

One concept per module; see docs/architecture.md for the map of the package.
"""
