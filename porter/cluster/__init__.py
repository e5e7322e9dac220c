"""Builds fanned out over many machines: a matrix of cells run here or as one Slurm job array.

- :mod:`porter.cluster.matrix`: the matrix file (toolchains x components x versions) -> validated cells;
- :mod:`porter.cluster.jobs`: the matrix folder on the shared filesystem (the frozen plan, the two job
  scripts, one result file per cell, the report) and what each job runs;
- :mod:`porter.cluster.slurm`: plain ``sbatch``/``scontrol`` through the runner (held array, afterok
  index job, one release);
- :mod:`porter.cluster.shards`: one ``ops build`` as a job array of shards and a link job after them;
- :mod:`porter.cluster.scaling`: a model of a big compile's wall time on N nodes, from a ``.ninja_log``.

Slurm is the engine; porter writes and submits jobs and reads results from files, never from Slurm's
accounting.
"""
