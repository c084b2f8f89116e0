"""Method kinds: per-kind facts (torch-free `kinds`), the registry, shared training and evaluation."""
