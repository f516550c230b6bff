"""What a run is and did, in ablate's own files, and the only code that knows a run directory's layout: the file
names, the marker and the reader (:mod:`.rundir`), each trial's folder (:mod:`.record`), its id and checkpoints
(:mod:`.trial`), its result log (:mod:`.trial_log`), the plan a run makes from them (reuse, continue, start:
:mod:`.plan`), the locks, the provenance and the run's outcome; :mod:`.store`: where the files live (a local folder or
an object store's URI), whole-file reads and writes."""
