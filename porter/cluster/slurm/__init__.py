"""Slurm as the engine: porter writes job folders on the shared filesystem, submits them with Slurm's own
commands and reads results from files, never from Slurm's accounting.

- :mod:`.sbatch`: the job folder both runs share (``jobs/``, ``logs/``, the submission record, the scripts),
  submitted with plain ``sbatch``/``scontrol``/``squeue`` through the runner (a held array, a final job after it
  with ``afterok``, one release), and the settings every job asks for;
- :mod:`.matrix`: the matrix file (toolchains x components x versions) -> validated cells;
- :mod:`.matrix_run`: a matrix's folder (the frozen plan, one result per cell, the report) and what each job runs;
- :mod:`.shards`: one build as a job array of shards and a link (or report) job after them.
"""
