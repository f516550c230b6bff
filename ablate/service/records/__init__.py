"""What a run is and did, in ablate's own files: each trial's id, log and checkpoints (:mod:`.trial`), the plan a
run makes from them (reuse, continue, start: :mod:`.plan`), the driver's lock and the run's outcome."""
