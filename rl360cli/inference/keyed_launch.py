"""Start a program whose command line needs values known only on its node: the run's API key, the node's address.

    python -m rl360cli.inference.keyed_launch [--api-key-file PATH] [--min-open-files N] -- \
        python -m sglang.launch_server --host '<node address>' ... --api-key '<api-key file>'

Launch commands are rendered where `rl360 serve` runs, and recorded in plans,
the state file and logs, so they hold placeholders instead:
`<api-key file>` becomes the key read from PATH (mode 0600), `<node address>`
the address this node has on the cluster network (`$RL360_NODE_ADDRESS`, else
the first non-loopback address its host name resolves to), so that a server
never listens on every interface. Then this process becomes the program
(`exec`): same pid, same signals, same exit code.

SGLang and sglang-router take the key only on the command line (given as `--api-key=VALUE`), so it is on
their command line once they run (visible to `ps` on that node); rl360's own
engine reads the file itself (`--api-key-file`) and never has it there.

`--min-open-files N` checks the node's own limit, where the program runs (a Slurm step's limits are
the node's, not those of the machine that ran `rl360 serve`): the soft limit is raised to the hard
one, and a hard limit below N ends the launch in one line that names the fix, before the program
starts (the router needs two descriptors per generation in flight: `router_open_files_needed`).

Tested by tests/inference/test_api_key.py (and the open-files check by tests/inference/test_launch.py).
"""

from __future__ import annotations

import os
import resource
import socket
import sys

from rl360cli.supervise import open_files_up_to_hard_limit
from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import KEY_PLACEHOLDER, read_api_key
from rl360cli.inference.templates import LaunchCommand

NODE_ADDRESS = "<node address>"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "", "*"})


def keyed_command(cmd: LaunchCommand, *, api_key_file: str | None, python: str,
                  min_open_files: int | None = None) -> LaunchCommand:
    """`cmd` behind this launcher when it has something to do on the node (fill a placeholder, check the
    open-files limit); else `cmd` itself."""
    if KEY_PLACEHOLDER not in cmd.argv and NODE_ADDRESS not in cmd.argv and min_open_files is None:
        return cmd
    prefix = [python, "-m", "rl360cli.inference.keyed_launch"]
    if KEY_PLACEHOLDER in cmd.argv:
        if api_key_file is None:
            raise ValueError(f"{KEY_PLACEHOLDER} in a command without an api_key_file")
        prefix += ["--api-key-file", api_key_file]
    if min_open_files is not None:
        prefix += ["--min-open-files", str(min_open_files)]
    return LaunchCommand(argv=(*prefix, "--", *cmd.argv), env=cmd.env)


def check_open_files(need: int) -> None:
    """Raise the soft limit to the hard one; refuse, naming the fix, when the hard limit is below `need`."""
    hard = open_files_up_to_hard_limit()
    if hard != resource.RLIM_INFINITY and hard < need:
        raise Rl360Error(f"{socket.gethostname()} allows {hard:,} open files and this program needs ~{need:,}",
                         "raise the node's hard limit (`ulimit -Hn`, /etc/security/limits.conf; Slurm passes the "
                         "submitting shell's limits to its steps), or lower [rollout] max_concurrent_sessions or "
                         "[engine] max_batch_size")


def node_address() -> str:
    """This node's address on the cluster network (never a loopback or wildcard address)."""
    explicit = os.environ.get("RL360_NODE_ADDRESS")
    if explicit:
        return explicit
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise Rl360Error(f"cannot resolve this node's name {name!r} ({e})",
                         "set RL360_NODE_ADDRESS to the node's cluster address") from None
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, *_, addr in infos:
            ip = addr[0]
            if fam == family and not ip.startswith("127.") and ip != "::1" and ip not in WILDCARD_HOSTS:
                return ip
    raise Rl360Error(f"this node's name {name!r} resolves only to loopback addresses",
                     "set RL360_NODE_ADDRESS to the node's cluster address")


def fill(argv: list[str], *, api_key_file: str | None) -> list[str]:
    """`argv` with its placeholders replaced (the key only when a key file is given)."""
    out = list(argv)
    if KEY_PLACEHOLDER in out:
        if api_key_file is None:
            raise Rl360Error(f"the command holds {KEY_PLACEHOLDER} but no --api-key-file was given",
                             "render it with rl360cli.inference.launch (it adds the file)")
        key = read_api_key(api_key_file)
        # `--api-key=KEY`, never `--api-key KEY`: a URL-safe key starts with "-" one time in 64, and argparse
        # (SGLang's and the router's launchers) then reads it as an option and refuses the command.
        joined: list[str] = []
        for a in out:
            if a == KEY_PLACEHOLDER and joined and joined[-1].startswith("--"):
                joined[-1] = f"{joined[-1]}={key}"
            else:
                joined.append(key if a == KEY_PLACEHOLDER else a)
        out = joined
    if NODE_ADDRESS in out:
        address = node_address()
        out = [address if a == NODE_ADDRESS else a for a in out]
    return out


USAGE = ("usage: python -m rl360cli.inference.keyed_launch [--api-key-file PATH] [--min-open-files N] -- "
         "PROGRAM [ARGS...]")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options: dict[str, str] = {}
    while len(args) >= 2 and args[0] in ("--api-key-file", "--min-open-files"):
        options[args[0]], args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2 or not options.get("--min-open-files", "0").isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if "--min-open-files" in options:
            check_open_files(int(options["--min-open-files"]))
        command = fill(args[1:], api_key_file=options.get("--api-key-file"))
    except Rl360Error as e:
        print(f"keyed_launch: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
