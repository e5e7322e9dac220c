"""Builds fanned out over many machines: a matrix of cells run here or as one Slurm job array.

- :mod:`porter.cluster.matrix`: the matrix file (toolchains x components x versions) -> validated cells;
- :mod:`porter.cluster.jobs`: the matrix folder on the shared filesystem (the frozen plan, the two job
  scripts, one result file per cell, the report) and what each job runs;
- :mod:`porter.cluster.slurm`: plain ``sbatch``/``scontrol`` through the runner (held array, afterok
  index job, one release).

Slurm is the engine; porter writes and submits jobs and reads results from files, never from Slurm's
accounting.
"""
