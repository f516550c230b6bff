"""How it runs: the runner (one fresh Ray Tune experiment over the work a run's record says remains), the thin
Trainables (solo and pack), the driver's result log callback, the Optuna search, the cluster (``ray.init``, the
dashboard), SLURM, the memory check and the signals that stop a run."""
