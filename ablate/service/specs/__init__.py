"""What to run: the grid, preset and Optuna spec models (every level typed, one error line naming the file, key and
what is allowed), a grid resolved at a scale into its trials, a trial's params and its RunConfig, and what a trial
costs. Nothing here starts Ray or writes a file."""
