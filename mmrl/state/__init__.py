"""A run's state on disk: atomic checkpoints and bit-exact resume (`checkpoint`, `resume`), sharded checkpoints
(`dcp`), loaders that never run code from a file (`safe_load`) and export to the model's own format (`export`)."""
