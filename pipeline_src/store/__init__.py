"""What jobs write and what reads it back: atomic files, models, metrics, results db, audit."""
