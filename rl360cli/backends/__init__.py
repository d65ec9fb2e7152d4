"""Where components run: `local` (subprocesses on this machine) and `slurm` (job steps through submitit)."""
