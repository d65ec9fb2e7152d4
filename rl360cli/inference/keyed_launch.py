"""Start a program whose command line needs values known only on its node: the run's API key, the node's address.

    python -m rl360cli.inference.keyed_launch [--api-key-file PATH] -- python -m sglang.launch_server \
        --host '<node address>' ... --api-key '<api-key file>'

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

Tested by tests/inference/test_api_key.py.
"""

from __future__ import annotations

import os
import socket
import sys

from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import KEY_PLACEHOLDER, read_api_key
from rl360cli.inference.templates import LaunchCommand

NODE_ADDRESS = "<node address>"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "", "*"})


def keyed_command(cmd: LaunchCommand, *, api_key_file: str | None, python: str) -> LaunchCommand:
    """`cmd` behind this launcher when its argv holds a placeholder only the node can fill; else `cmd` itself."""
    if KEY_PLACEHOLDER not in cmd.argv and NODE_ADDRESS not in cmd.argv:
        return cmd
    prefix = [python, "-m", "rl360cli.inference.keyed_launch"]
    if KEY_PLACEHOLDER in cmd.argv:
        if api_key_file is None:
            raise ValueError(f"{KEY_PLACEHOLDER} in a command without an api_key_file")
        prefix += ["--api-key-file", api_key_file]
    return LaunchCommand(argv=(*prefix, "--", *cmd.argv), env=cmd.env)


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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    key_file = None
    if args[:1] == ["--api-key-file"] and len(args) >= 2:
        key_file, args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        print("usage: python -m rl360cli.inference.keyed_launch [--api-key-file PATH] -- PROGRAM [ARGS...]",
              file=sys.stderr)
        return 2
    try:
        command = fill(args[1:], api_key_file=key_file)
    except Rl360Error as e:
        print(f"keyed_launch: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
