"""images/busybox/Dockerfile builds offline from a root filesystem tarball, as images/README.md says, and runs."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, need
from tests.images.conftest import client_for

pytestmark = pytest.mark.docker


def test_busybox_dockerfile_builds_from_its_rootfs_and_runs(spare_up, tmp_path):
    need(Path("/bin/busybox").exists(), "/bin/busybox missing: `bash cluster/dev/docker-nodes.sh up` installs it")
    root = tmp_path / "root"
    for d in ("bin", "tmp", "etc"):
        (root / d).mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    subprocess.run(["chroot", str(root), "/bin/busybox", "--install", "-s", "/bin"], check=True)
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy(REPO / "images" / "busybox" / "Dockerfile", context / "Dockerfile")
    with tarfile.open(context / "rootfs.tar", "w") as tar:
        tar.add(root, arcname=".")
    tag = f"rl360-test/dockerfile-busybox:{uuid.uuid4().hex[:8]}"
    client = client_for(spare_up["docker_host"])
    try:
        client.images.build(path=str(context), tag=tag, rm=True, network_mode="none")
        out = client.containers.run(tag, ["sh", "-c", "echo ok; ls /bin/sh"], remove=True, network_mode="none")
        assert out.decode().split() == ["ok", "/bin/sh"]
        assert client.images.get(tag).attrs["Config"]["Cmd"] == ["sh"]
    finally:
        client.images.remove(tag, force=True)
        client.close()
