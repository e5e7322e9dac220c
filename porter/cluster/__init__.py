"""Porter on clusters, by concern: :mod:`porter.cluster.slurm` (builds fanned out as Slurm job arrays: the
matrix and the sharded build, on one job-folder framework) and :mod:`porter.cluster.site` (site profiles,
launch, preflight, the scaling model)."""
