"""Optimizers shared by the method libraries (a leaf package: it imports only torch)."""
