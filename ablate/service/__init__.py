"""The service, in three rooms: :mod:`.specs` (what to run: grids, presets, Optuna spaces, a trial's params),
:mod:`.records` (what a run is and did: trial ids, logs, checkpoints, the plan, the outcome) and :mod:`.execution`
(how it runs: the runner, the Trainables, the search, the cluster, SLURM). Imports run one way:
execution → records → specs."""
