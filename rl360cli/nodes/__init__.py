"""Reaching the nodes' Docker daemons: unix socket, ssh:// through paramiko, or a Slurm job step.

`runtime.connect(node)` is the entry point (it imports the docker SDK, so import it lazily);
`selector.select_nodes` parses `--nodes`; `slurm_step` builds the job-step commands for Slurm nodes.
"""
