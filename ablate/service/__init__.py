"""The service: grid and preset specs, the Ray Tune Trainable, the runner, its callbacks and snapshots, and
the cluster helpers (ray.init, token authentication, the Ray dashboard)."""
