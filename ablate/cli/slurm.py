"""`ablate slurm GRID …`: write (and with ``--submit``, submit) the SLURM batch script of :mod:`ablate.service.execution.slurm`."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ablate.service.execution.options import add_run_options, options_from_args

__all__ = ["add_slurm_parser", "cmd_slurm"]


def cmd_slurm(args: argparse.Namespace) -> int:
    """Check the job, write ``<storage>/<run name>.sbatch`` (``<script dir>/…`` with ``--script-dir`` or a URI as
    storage), and print how to submit it (or submit it)."""
    from ablate.service.execution.slurm import job_output, slurm_job, submit, write_script

    job = slurm_job(
        args.grid, options_from_args(args), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node, partition=args.partition, time=args.time, script_dir=args.script_dir,
    )  # fmt: skip
    path = write_script(job)
    print(f"wrote {path}  (run directory: {job.run_dir})")
    if not args.submit:
        print(f"submit it with:\n  sbatch {path}")
        return 0
    job_id = submit(path)
    print(f"submitted batch job {job_id}")
    print(f"output: {job_output(job, job_id)}")
    print(f"follow it: squeue -j {job_id}; ablate status {shlex.quote(job.run_dir)}")
    return 0


def add_slurm_parser(sub: Any) -> None:
    """Add ``ablate slurm`` to the CLI's subparsers."""
    s = sub.add_parser(
        "slurm",
        help="write a SLURM batch script that runs a grid on Ray across the job's nodes and resumes it after a requeue",
    )
    s.add_argument("grid", help="a grid name (see `ablate list`) or a path to a grid YAML file")
    add_run_options(s, "slurm")
    s.add_argument("--nodes", type=int, default=1, help="nodes of the job (default 1): the Ray head and workers")
    s.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default 0)")
    s.add_argument("--cpus-per-node", type=int, help="CPUs per node (default: what the cluster gives a task)")
    s.add_argument("--partition", help="the SLURM partition")
    s.add_argument("--time", help="the job's time limit (SLURM's format, e.g. 2:00:00 or 1-0)")
    s.add_argument(
        "--script-dir",
        metavar="DIR",
        help="folder of the .sbatch script and SLURM's .slurm-<job id>.out files (default: the --storage folder; the "
        "current folder when --storage is a URI, s3://… or gs://…); it must exist at the same path on the job's "
        "first node",
    )
    s.add_argument("--submit", action="store_true", help="submit the script with sbatch and print the job id")
    s.set_defaults(func=cmd_slurm)
