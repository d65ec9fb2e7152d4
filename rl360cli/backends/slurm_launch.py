"""The `srun` command line of a component's job step, and where its files go.

A component runs as a job step inside its tier's allocation:

    srun --overlap --jobid=J [--het-group=G] --nodelist=NODES --nodes=K --ntasks=K --ntasks-per-node=1
         --kill-on-bad-exit=1 --job-name=TIER/NAME [--container-image=... --container-mounts=...]
         PYTHON -m rl360cli.backends.slurm_step STEP STATUS LOG -- ARGV...

`--overlap` lets it share CPUs with the allocation's holder step and with the
other components; one task per listed node; `--kill-on-bad-exit=1` takes the
whole step down as soon as one of its tasks fails. Pure: nothing here runs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFiles:
    """The files of one component in the shared run folder (rank 0's; rank r inserts `.r`)."""

    log: Path
    status: Path
    step: Path
    # srun's own output (its errors, e.g. "task 1: Exited with exit code 3"); `rl360 logs` skips it.
    srun_log: Path

    @classmethod
    def for_log(cls, log_path: str | Path) -> StepFiles:
        log = Path(log_path)
        return cls(log=log, status=log.with_suffix(".status.json"), step=log.with_suffix(".step.json"),
                   srun_log=log.with_suffix(".supervisor.log"))


def srun_argv(*, python: str, job_id: str, het_leader: str | None, het_group: int | None, nodes: list[str],
              name: str, files: StepFiles, argv: tuple[str, ...] | list[str], container_image: str | None = None,
              container_mounts: tuple[str, ...] = ()) -> list[str]:
    cmd = ["srun", "--overlap", f"--jobid={het_leader or job_id}"]
    if het_group is not None:
        cmd.append(f"--het-group={het_group}")
    cmd += [f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--job-name={name}"]
    if container_image:
        # The run folder is mounted at the same path so the step's log and status files land where rl360 reads.
        mounts = [str(files.log.parent.parent.parent), *container_mounts]
        cmd += [f"--container-image={container_image}", f"--container-mounts={','.join(mounts)}"]
    cmd += [*shlex.split(python), "-m", "rl360cli.backends.slurm_step", str(files.step), str(files.status),
            str(files.log), "--", *argv]
    return cmd
