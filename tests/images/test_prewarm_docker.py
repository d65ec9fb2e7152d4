"""`rl360 prewarm-images` against the real dev Docker nodes and loopback registry (cluster/dev/docker-nodes.sh).

Each test pushes its own small images under a unique name, so the nodes start cold for them and the
shared base images are never touched; the node-down test stops only the spare node n9.
"""

from __future__ import annotations

import json

import pytest

from tests.images.conftest import SPARE, client_for, dev_script, max_overlap, node_digests, write_images, write_profile

pytestmark = pytest.mark.docker


def _prewarm(cli, profile, image_list, *extra: str):
    return cli("prewarm-images", "--profile", str(profile), "--images", str(image_list), *extra)


def _state(state_path) -> dict:
    return json.loads(state_path.read_text())


def test_two_images_onto_four_nodes_in_waves_of_two_then_nothing(dev, spare_up, images, tmp_path, cli, state_path):
    alpha, beta = images.push("alpha", size_kb=1024), images.push("beta", size_kb=1024)
    nodes = dev["nodes"][:3] + [spare_up]
    names = [n["name"] for n in nodes]
    image_list = write_images(tmp_path / "images.toml",
                              {"alpha": {"ref": alpha["short_ref"]}, "beta": {"ref": beta["short_ref"]}})
    profile = write_profile(tmp_path / "four.toml", nodes, max_pulls=8)

    proc = _prewarm(cli, profile, image_list, "--wave-size", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["pulled"] == 8 and report["ok"]
    assert [len(w) for w in report["waves"]] == [2, 2, 2, 2]

    state = _state(state_path)
    intervals = []
    for node in nodes:
        held = node_digests(node["docker_host"])
        for image in (alpha, beta):
            rec = state["nodes"][node["name"]]["images"][image["ref"]]
            assert rec["digest"] == image["digest"]
            assert rec["size"] >= image_kb_bytes(1024) and rec["seconds"] > 0 and rec["source"] == "prewarm"
            assert f"{image['repo']}@{image['digest']}" in held, f"{node['name']} lacks {image['ref']}"
            # The tag points at the recorded digest, so a sandbox started by tag uses the warm image.
            assert held[f"{image['repo']}@{image['digest']}"] == rec["image_id"]
            intervals.append((rec["started_at"], rec["pulled_at"]))
    assert max_overlap(intervals) <= 2
    # The state's cache records are the ones the events log reported for the same pulls.
    pulls = [e for e in _events(state_path) if e["action"] == "pull" and e["outcome"] == "ok"]
    assert sorted(e["subject"] for e in pulls) == sorted(f"{n}/{i}" for n in names for i in ("alpha", "beta"))

    again = _prewarm(cli, profile, image_list, "--wave-size", "2")
    assert again.returncode == 0, again.stderr
    assert "nothing to pull" in again.stdout
    assert _state(state_path)["nodes"]["n1"]["images"] == state["nodes"]["n1"]["images"]
    third = json.loads(_prewarm(cli, profile, image_list, "--json").stdout)
    assert third["pulled"] == 0 and {c["status"] for c in third["cells"]} == {"warm"} and len(third["cells"]) == 8


def image_kb_bytes(kb: int) -> int:
    return kb * 1024


def test_node_with_daemon_down_fails_alone_and_state_records_what_succeeded(dev, spare_up, images, tmp_path, cli,
                                                                            state_path):
    alpha = images.push("alpha")
    nodes = dev["nodes"][:3] + [spare_up]
    image_list = write_images(tmp_path / "images.toml", {"alpha": {"ref": alpha["short_ref"]}})
    profile = write_profile(tmp_path / "four.toml", nodes)
    dev_script("stop-node", SPARE)
    try:
        proc = _prewarm(cli, profile, image_list, "--json")
        assert proc.returncode == 1
        report = json.loads(proc.stdout)
        assert list(report["failed_nodes"]) == [SPARE]
        assert "cannot reach the Docker daemon" in report["failed_nodes"][SPARE]
        assert report["pulled"] == 3
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: prewarm failed on {SPARE}") and "rerun" in err[0]
        state = _state(state_path)
        for node in dev["nodes"][:3]:
            assert state["nodes"][node["name"]]["images"][alpha["ref"]]["digest"] == alpha["digest"]
        assert alpha["ref"] not in state["nodes"][SPARE]["images"]
        assert state["nodes"][SPARE]["prewarm"]["status"] == "failed"
        assert state["prewarm"]["failed_nodes"] == {SPARE: report["failed_nodes"][SPARE]}
    finally:
        dev_script("start-node", SPARE)
    healed = json.loads(_prewarm(cli, profile, image_list, "--json").stdout)
    assert healed["ok"] and healed["pulled"] == 1
    assert [c["node"] for c in healed["cells"] if c["status"] == "pulled"] == [SPARE]


def test_a_moved_tag_is_pulled_again_and_prune_drops_the_old_digest(dev, images, tmp_path, cli, state_path):
    nodes = dev["nodes"][:2]
    first = images.push("moving", tag="live")
    image_list = write_images(tmp_path / "images.toml", {"moving": {"ref": first["short_ref"]}})
    profile = write_profile(tmp_path / "two.toml", nodes)
    assert _prewarm(cli, profile, image_list).returncode == 0

    second = images.push("moving", tag="live")
    assert second["digest"] != first["digest"]
    report = json.loads(_prewarm(cli, profile, image_list, "--json").stdout)
    assert report["pulled"] == 2 and report["images"]["moving"]["digest"] == second["digest"]
    state = _state(state_path)
    for node in nodes:
        rec = state["nodes"][node["name"]]["images"][first["ref"]]
        assert rec["digest"] == second["digest"] and rec["superseded"] == [first["digest"]]
        client = client_for(node["docker_host"])
        try:
            assert f"{second['repo']}@{second['digest']}" in client.images.get(first["ref"]).attrs["RepoDigests"]
        finally:
            client.close()
        assert f"{first['repo']}@{first['digest']}" in node_digests(node["docker_host"])

    pruned = json.loads(_prewarm(cli, profile, image_list, "--prune", "--json").stdout)
    assert sorted((p["node"], p["outcome"]) for p in pruned["pruned"]) == [("n1", "removed"), ("n2", "removed")]
    for node in nodes:
        held = node_digests(node["docker_host"])
        assert f"{first['repo']}@{first['digest']}" not in held
        assert f"{second['repo']}@{second['digest']}" in held
        assert _state(state_path)["nodes"][node["name"]]["images"][first["ref"]]["superseded"] == []


def test_prune_in_the_run_that_pulls_a_moved_tag_removes_the_old_digest_once_the_new_one_is_there(
        dev, images, tmp_path, cli, state_path):
    node = dev["nodes"][0]
    first = images.push("moving", tag="live")
    image_list = write_images(tmp_path / "images.toml", {"moving": {"ref": first["short_ref"]}})
    profile = write_profile(tmp_path / "one.toml", [node])
    assert _prewarm(cli, profile, image_list).returncode == 0
    second = images.push("moving", tag="live")
    report = json.loads(_prewarm(cli, profile, image_list, "--prune", "--json").stdout)
    assert report["pulled"] == 1
    assert [(p["digest"], p["outcome"]) for p in report["pruned"]] == [(first["digest"], "removed")]
    held = node_digests(node["docker_host"])
    assert f"{second['repo']}@{second['digest']}" in held and f"{first['repo']}@{first['digest']}" not in held
    rec = _state(state_path)["nodes"][node["name"]]["images"][first["ref"]]
    assert rec["digest"] == second["digest"] and rec["superseded"] == []


def test_prune_removes_unlisted_images_but_never_one_a_running_container_uses(dev, images, tmp_path, cli,
                                                                              state_path):
    nodes = dev["nodes"][:2]
    keep, drop = images.push("keep"), images.push("drop", runnable=True)
    both = write_images(tmp_path / "both.toml",
                        {"keep": {"ref": keep["short_ref"]}, "drop": {"ref": drop["short_ref"]}})
    only_keep = write_images(tmp_path / "keep.toml", {"keep": {"ref": keep["short_ref"]}})
    profile = write_profile(tmp_path / "two.toml", nodes)
    assert _prewarm(cli, profile, both).returncode == 0

    n1 = client_for(nodes[0]["docker_host"])
    container = n1.containers.run(drop["ref"], ["sleep", "120"], detach=True, network_mode="none")
    try:
        dry = json.loads(_prewarm(cli, profile, only_keep, "--prune", "--dry-run", "--json").stdout)
        assert {(p["node"], p["outcome"]) for p in dry["pruned"]} == {("n1", "kept"), ("n2", "to remove")}
        assert f"{drop['repo']}@{drop['digest']}" in node_digests(nodes[1]["docker_host"])  # dry run removed nothing

        report = json.loads(_prewarm(cli, profile, only_keep, "--prune", "--json").stdout)
        outcome = {p["node"]: p for p in report["pruned"]}
        assert outcome["n1"]["outcome"] == "kept" and "running container" in outcome["n1"]["reason"]
        assert outcome["n2"]["outcome"] == "removed"
        assert f"{drop['repo']}@{drop['digest']}" in node_digests(nodes[0]["docker_host"])
        assert f"{drop['repo']}@{drop['digest']}" not in node_digests(nodes[1]["docker_host"])
        state = _state(state_path)
        assert drop["ref"] in state["nodes"]["n1"]["images"] and drop["ref"] not in state["nodes"]["n2"]["images"]
        assert keep["ref"] in state["nodes"]["n2"]["images"]
        container.reload()
        assert container.status == "running"
    finally:
        container.remove(force=True)
        n1.close()


def test_dry_run_shows_the_waves_and_changes_nothing(dev, images, tmp_path, cli, state_path):
    alpha = images.push("alpha")
    nodes = dev["nodes"][:3]
    image_list = write_images(tmp_path / "images.toml", {"alpha": {"ref": alpha["short_ref"]}})
    profile = write_profile(tmp_path / "three.toml", nodes)
    proc = _prewarm(cli, profile, image_list, "--dry-run", "--wave-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "wave 1: n1/alpha, n2/alpha" in proc.stdout and "wave 2: n3/alpha" in proc.stdout
    assert alpha["digest"][:19] in proc.stdout
    assert not state_path.exists()
    for node in nodes:
        assert f"{alpha['repo']}@{alpha['digest']}" not in node_digests(node["docker_host"])


def test_pin_map_pins_an_image_to_the_nodes_its_concurrency_needs(dev, images, tmp_path, cli, state_path):
    wide, narrow = images.push("wide"), images.push("narrow")
    nodes = dev["nodes"][:3]
    image_list = write_images(tmp_path / "images.toml", {
        "wide": {"ref": wide["short_ref"]},
        # 2 CPUs per node and 1 CPU per sandbox: 3 sandboxes at once need 2 nodes.
        "narrow": {"ref": narrow["short_ref"], "expected_concurrency": 3, "cpus": 1.0, "memory_mb": 256},
    })
    profile = write_profile(tmp_path / "three.toml", nodes)
    report = json.loads(_prewarm(cli, profile, image_list, "--json").stdout)
    assert report["images"]["wide"]["nodes"] == ["n1", "n2", "n3"]
    assert len(report["images"]["narrow"]["nodes"]) == 2 and report["images"]["narrow"]["capacity"] == 4
    state = _state(state_path)
    holders = [n for n in ("n1", "n2", "n3") if narrow["ref"] in state["nodes"][n]["images"]]
    assert holders == report["images"]["narrow"]["nodes"]
    assert state["prewarm"]["images"]["narrow"]["nodes"] == holders


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def warm_state(dev, images, tmp_path, cli, state_path):
    """A state file from one good run, to check that bad input leaves it byte for byte as it was."""
    alpha = images.push("alpha")
    image_list = write_images(tmp_path / "good.toml", {"alpha": {"ref": alpha["short_ref"]}})
    profile = write_profile(tmp_path / "prof.toml", dev["nodes"][:2])
    assert _prewarm(cli, profile, image_list).returncode == 0
    return {"alpha": alpha, "images": image_list, "profile": profile}


BAD = {
    "unknown image": ("images", "not in the registry", "push it first, or fix `ref`"),
    "registry does not answer": ("registry", "does not answer", "fix [registry] address"),
    "node not in profile": ("node", "node 'n42' is not in profile", "use one of: n1, n2"),
    "full disk budget": ("disk", "disk budget", "raise disk_budget_gb"),
    "pin to unknown node": ("pin", "pins node 'n7'", "use one of: n1, n2"),
    "wave size zero": ("wave", "--wave-size 0", "pass a positive number"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_naming_the_fix_and_leaves_state_unchanged(case, warm_state, dev, tmp_path, cli,
                                                                         state_path):
    kind, problem, fix = BAD[case]
    before = state_path.read_bytes()
    alpha = warm_state["alpha"]
    image_list, profile, extra = warm_state["images"], warm_state["profile"], []
    nodes = dev["nodes"][:2]
    if kind == "images":
        image_list = write_images(tmp_path / "bad.toml", {"ghost": {"ref": "rl360-test/absent/ghost:1"}})
    elif kind == "registry":
        profile = write_profile(tmp_path / "bad.toml", nodes, registry="127.0.0.1:1")
    elif kind == "node":
        extra = ["--nodes", "n1,n42"]
    elif kind == "disk":
        profile = write_profile(tmp_path / "bad.toml", nodes, disk_budget_gb=0.0001)
    elif kind == "pin":
        image_list = write_images(tmp_path / "bad.toml", {"alpha": {"ref": alpha["short_ref"], "pin": ["n1", "n7"]}})
    elif kind == "wave":
        extra = ["--wave-size", "0"]
    proc = _prewarm(cli, profile, image_list, *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert problem in lines[0] and fix in lines[0], lines[0]
    assert state_path.read_bytes() == before


def _events(state_path) -> list[dict]:
    return [json.loads(line) for line in (state_path.parent / "events.jsonl").read_text().splitlines()]
