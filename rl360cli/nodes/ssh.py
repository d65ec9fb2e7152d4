"""A docker SDK client for a node reached over SSH with paramiko, using the key and host keys the profile names.

The docker SDK's own `ssh://` transport reads the key only from `~/.ssh/config`
and the host keys only from `~/.ssh/known_hosts`; a cluster profile names both
per node instead (`NodeSpec.key_path`, `NodeSpec.known_hosts`). This module
gives the SDK's paramiko adapter those, and keeps its behaviour otherwise: one
SSH connection per node, one channel per HTTP connection, each running
`docker system dial-stdio` on the node (so the node needs the docker CLI, and
its DOCKER_HOST if its daemon is not at the default socket). An unknown host
key is refused, never added.

    client = ssh_docker_client("ssh://root@127.0.1.1:2222", key_path=KEY, known_hosts=KNOWN, timeout_s=60)

Test: tests/images/test_prewarm_ssh.py (the sshd nodes of cluster/dev/sshd-nodes.sh).
"""

from __future__ import annotations

import getpass
import logging
import urllib.parse

# API version used only to build the client before its transport exists; the daemon's own is asked right after.
_BOOT_VERSION = "1.41"


def ssh_docker_client(url: str, *, key_path: str | None, known_hosts: str | None, timeout_s: float):
    """A `docker.DockerClient` whose requests go over SSH to `url` (`ssh://user@host:port`)."""
    import docker
    import paramiko
    from docker.transport.sshconn import SSHHTTPAdapter

    class KeyedSSHAdapter(SSHHTTPAdapter):
        def _create_paramiko_client(self, base_url: str) -> None:
            logging.getLogger("paramiko").setLevel(logging.WARNING)
            parsed = urllib.parse.urlparse(base_url)
            self.ssh_client = paramiko.SSHClient()
            if known_hosts:
                self.ssh_client.load_host_keys(known_hosts)
            else:
                self.ssh_client.load_system_host_keys()
            self.ssh_client.set_missing_host_key_policy(paramiko.RejectPolicy())
            self.ssh_params = {
                "hostname": parsed.hostname,
                "port": parsed.port or 22,
                "username": parsed.username or getpass.getuser(),
                "key_filename": key_path,
                # With a key named, use only it: an agent or ~/.ssh keys could log in as someone else.
                "look_for_keys": key_path is None,
                "allow_agent": key_path is None,
                "timeout": min(timeout_s, 15.0),
                "banner_timeout": min(timeout_s, 15.0),
                "auth_timeout": min(timeout_s, 15.0),
            }

    api = docker.APIClient(base_url="tcp://127.0.0.1:9", version=_BOOT_VERSION, timeout=int(timeout_s))
    try:
        adapter = KeyedSSHAdapter(url, timeout=int(timeout_s), pool_connections=9, max_pool_size=10)
    except FileNotFoundError as e:
        raise OSError(f"{e.filename}: no such key or known_hosts file") from None
    api._custom_adapter = adapter
    api.mount("http+docker://ssh", adapter)
    api._unmount("http://", "https://")
    api.base_url = "http+docker://ssh"
    api._version = api._retrieve_server_version()
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api
    return client
