"""The topology in the preset: which level a put crosses, its links, sharing, latency."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import simpy
import yaml

from npusim.engine.flow import FlowNetwork
from npusim.errors import InputError
from npusim.hw.config import CONFIG_DIR, load_hardware
from npusim.hw.fabric import Fabric
from npusim.report.build import build_report
from npusim.scenario import load_scenario
from npusim.sim import simulate

ROOT = Path(__file__).resolve().parents[2]


def names(links) -> list[str]:
    return [r.name for r in links]


def test_a3_routes_by_the_innermost_common_level():
    """Ranks 0, 1 share a package; 0 and 2 a server of 16; 0 and 16 only the supernode."""
    fab = Fabric(load_hardware("atlas_a3").fabric, 32)
    links, lat = fab.route(0, 1)
    assert names(links) == ["rank0->rank1.package.link"] and lat == 200.0
    assert links[0].bandwidth == 224.0
    links, lat = fab.route(3, 14)
    assert names(links) == ["rank3.server.egress", "rank14.server.ingress"] and lat == 500.0
    links, lat = fab.route(5, 17)  # the same die ports, then the servers' uplinks
    assert names(links) == ["rank5.server.egress", "rank17.server.ingress",
                            "ranks0-15.supernode.uplink", "ranks16-31.supernode.downlink"]
    assert lat == 500.0 + 1000.0 and links[2].bandwidth == 16 * 196.0  # CloudMatrix384 bound
    assert fab.route(5, 17)[0][0] is fab.route(5, 6)[0][0]  # one port for both levels


@pytest.mark.parametrize("world,kinds", [
    (2, {"package.link"}),
    (16, {"package.link", "server.egress", "server.ingress"}),
    (32, {"package.link", "server.egress", "server.ingress", "supernode.uplink",
          "supernode.downlink"}),
])
def test_only_the_levels_a_world_reaches_have_links(world, kinds):
    fab = Fabric(load_hardware("atlas_a3").fabric, world)
    assert {r.kind for r in fab.resources()} == kinds
    pairs = sum(r.kind == "package.link" for r in fab.resources())
    assert pairs == world  # one per direction in each of world / 2 packages


def test_the_flat_950_is_one_switch_level():
    fab = Fabric(load_hardware("ascend950").fabric, 8)
    links, lat = fab.route(0, 7)
    assert names(links) == ["rank0.egress", "rank7.ingress"] and lat == 300.0
    assert [r.name for r in fab.resources()][:2] == ["rank0.egress", "rank1.egress"]


def lone_and_shared_finish(fab: Fabric, puts: list[tuple[int, int]], nbytes: int,
                           cap: float) -> list[float]:
    """When each put's last byte leaves (latency excluded), all started at t = 0."""
    env = simpy.Environment()
    net = FlowNetwork(env)
    ends: list[float] = [0.0] * len(puts)
    for i, (src, dst) in enumerate(puts):
        links, _ = fab.route(src, dst)

        def sent(i: int = i) -> None:
            ends[i] = env.now
        net.start(nbytes, cap, links, 0.0, lambda _t: None, sent)
    env.run()
    return ends


def test_one_pair_of_a2_cards_cannot_exceed_one_hccs_link():
    """Two cores of card 0 putting to card 1 at 24.94 GB/s each share one 28 GB/s link:
    14 GB/s each; a put to card 2 takes another link and keeps its 24.94."""
    fab = Fabric(load_hardware("atlas_a2").fabric, 16)
    n = 28_000
    same = lone_and_shared_finish(fab, [(0, 1), (0, 1)], n, 24.94)
    assert same == pytest.approx([n / 14.0, n / 14.0])
    apart = lone_and_shared_finish(fab, [(0, 1), (0, 2)], n, 24.94)
    assert apart == pytest.approx([n / 24.94, n / 24.94])


def test_a2_servers_share_each_cards_roce_port():
    """Card 0 to cards 8 and 9 (another server): both puts cross card 0's 25 GB/s RoCE
    egress, 12.5 GB/s each; its HCCS links are not on the path."""
    fab = Fabric(load_hardware("atlas_a2").fabric, 16)
    links, lat = fab.route(0, 8)
    assert names(links) == ["rank0.cluster.egress", "rank8.cluster.ingress"] and lat == 1500.0
    ends = lone_and_shared_finish(fab, [(0, 8), (0, 9)], 25_000, 24.94)
    assert ends == pytest.approx([25_000 / 12.5] * 2)


def a3_dispatch(tmp_path: Path, world: int) -> dict:
    doc = {"name": f"a3_w{world}", "hardware": "atlas_a3",
           "workload": {"op": "dispatch", "bs": 2, "h": 1024, "k": 2, "ep_world_size": world,
                        "experts_per_rank": 1, "timing_only": True,
                        "routing": {"kind": "uniform", "seed": 1}}}
    p = tmp_path / f"w{world}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return build_report(simulate(load_scenario(p)))["ops"][0]


def test_a_w32_a3_run_shows_the_server_boundary_a_w16_run_does_not_cross(tmp_path):
    w16 = a3_dispatch(tmp_path, 16)["link_classes"]
    w32 = a3_dispatch(tmp_path, 32)["link_classes"]
    assert list(w16) == ["package.link", "server.egress", "server.ingress", "hbm"]
    assert list(w32) == ["package.link", "server.egress", "server.ingress",
                         "supernode.uplink", "supernode.downlink", "hbm"]
    up, down = w32["supernode.uplink"], w32["supernode.downlink"]
    assert up["links"] == down["links"] == 2  # two servers
    assert up["bytes"] == down["bytes"] > 0
    assert up["bytes"] < w32["server.egress"]["bytes"]  # in-server puts use the ports only


def test_a_world_beyond_the_outermost_level_is_an_input_error(tmp_path):
    doc = {"name": "too_big", "hardware": "atlas_a2",
           "hardware_overrides": {"fabric.levels.cluster.dies": 16},
           "workload": {"op": "dispatch", "bs": 2, "h": 1024, "k": 2, "ep_world_size": 32,
                        "experts_per_rank": 1}}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as info:
        load_scenario(p)
    assert info.value.key == "workload.ep_world_size"
    assert "cluster, holds 16 dies" in str(info.value) and "\n" not in str(info.value)


def edited_a3(tmp_path: Path, edit) -> str:
    doc = yaml.safe_load((CONFIG_DIR / "atlas_a3.yaml").read_text())
    edit(doc["fabric"]["levels"])
    p = tmp_path / "a3.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


@pytest.mark.parametrize("edit,key,says", [
    (lambda lv: lv["server"].update(sharing="mesh"), "fabric.levels.server.sharing",
     "allowed: pair"),
    (lambda lv: lv["supernode"].update(sharing="package"), "fabric.levels.supernode.sharing",
     "server (the die ports of level server)"),
    (lambda lv: lv["package"].pop("link_gbps"), "fabric.levels.package.link_gbps", "missing"),
    (lambda lv: lv["server"].update(link_gbps=10), "fabric.levels.server.link_gbps",
     "not with sharing: die"),
    (lambda lv: lv["server"].update(dies=15), "fabric.levels.server.dies", "a multiple of 2"),
    (lambda lv: lv["package"].update(uplink_gbps=10), "fabric.levels.package.uplink_gbps",
     "innermost"),
    (lambda lv: lv["server"].update(ports=2), "fabric.levels.server.ports", "unknown key"),
])
def test_a_bad_level_is_a_one_line_error_naming_the_key(tmp_path, edit, key, says):
    with pytest.raises(InputError) as info:
        load_hardware(edited_a3(tmp_path, edit))
    assert info.value.key == key and says in str(info.value) and "\n" not in str(info.value)


def test_flat_keys_beside_levels_are_refused(tmp_path):
    path = edited_a3(tmp_path, lambda lv: None)
    doc = yaml.safe_load(Path(path).read_text())
    doc["fabric"]["egress_gbps"] = 100
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(InputError, match="allowed here: levels") as info:
        load_hardware(path)
    assert info.value.key == "fabric.egress_gbps"


def test_the_flat_form_reports_its_old_hardware_dict():
    """The 950's report.json `hardware` keeps the flat keys (its baselines' digests)."""
    hw = load_hardware("ascend950")
    assert hw.to_dict()["fabric"] == {f: getattr(hw.fabric, f) for f in (
        "dies_per_package", "egress_gbps", "ingress_gbps", "link_latency_ns", "d2d_gbps",
        "d2d_latency_ns")}
    assert dataclasses.asdict(hw.fabric)["levels"] == ()


def test_the_shipped_w_sweep_spans_8_to_768_on_the_a3_timing_only():
    from npusim.sweep import load_sweep

    name, points = load_sweep(ROOT / "scenarios" / "sweeps" / "w_a3_bs8.yaml")
    ws = [p.values["workload.ep_world_size"] for p in points]
    assert ws[0] == 8 and ws[-1] == 768 and ws == sorted(ws)
    assert all(p.doc["hardware"] == "atlas_a3" and p.doc["workload"]["timing_only"]
               for p in points)


@pytest.mark.parametrize("uplink,rate", [(None, 24.94), (1000.0, 1000.0 / 201)])
def test_a_non_blocking_uplink_never_limits_and_a_narrower_one_shares(uplink, rate):
    """Rank 0 sends 200 puts out of its server, held to 0.98 GB/s each by its 196 GB/s
    egress; rank 1's single put to a rank nobody else uses then gets its full port, 24.94:
    the server's 3136 GB/s uplink (16 x 196) cannot be exceeded by its dies. Overridden to
    1000 GB/s it is a shared link: 201 flows, 1000 / 201 each."""
    overrides = {} if uplink is None else {"fabric.levels.supernode.uplink_gbps": uplink}
    fab = Fabric(load_hardware("atlas_a3", overrides).fabric, 32)
    puts = [(0, 16 + i % 15) for i in range(200)] + [(1, 31)]
    ends = lone_and_shared_finish(fab, puts, 10_000, 24.94)
    assert ends[-1] == pytest.approx(10_000 / rate)
