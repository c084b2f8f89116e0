"""Process memory control shared by every layer (a leaf: it imports nothing of the package)."""
