"""Report tables and plots, one module per study."""
