"""The docker-compose cluster, end to end: three agents from the project image plus an HTTP
sink (the same image running tests/e2e/sink with the standard library). An `@every 1s` job
POSTs to the sink while the leader's container is killed and restarted and a follower is cut
off its network; then the ledger is checked (one decision per slot, no gap) and the window is
judged by the fault suite's checker (tests/faults/checker.py: every slot delivered, none early,
duplicates only after a `lost` attempt a fault cut short), and the cluster is taken down and
brought up again on the same volumes.

The compose file the test runs is generated from docker-compose.yml with PyYAML: in compose
v1.29 an override's `ports` are appended to the base file's (8001-8003 would still be
published), so the test writes a whole file with the APIs on free 127.0.0.1 ports, no
`build:` section (the image is built beforehand) and the sink service added.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.faults.checker import Expect, check

from .conftest import ROOT, TIMINGS, compose_command, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NODES = ("n1", "n2", "n3")
JOB = "e2e-tick"
SINK_PORT = 8080
SCHEDULED = ("schedule", "catchup")


# ---- small helpers -------------------------------------------------------------------------

def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Poll check() until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - a node may be down while we wait
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r:.1500})")
        time.sleep(interval)


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy


def http(method: str, url: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _opener.open(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- the cluster ---------------------------------------------------------------------------

class ComposeCluster:
    """One compose project of our own: raftcron-e2e-<random>, three nodes and the sink."""

    def __init__(self, workdir: Path, image: str) -> None:
        self.project = f"raftcron-e2e-{secrets.token_hex(4)}"
        self.image = image
        self.ports = dict(zip(NODES, free_ports(len(NODES)), strict=False))
        self.file = workdir / "docker-compose.e2e.yml"
        self.cmd = compose_command() or ["docker-compose"]
        # No secret at all, as on a fresh checkout: the compose file's `secret` service makes
        # one. Compose reads .env from the project directory, the folder of the generated file
        # (nothing there), and the shell's COMPOSE_*/RAFTCRON_* variables are dropped so a
        # developer's settings do not leak in.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "RAFTCRON_"))}
        self.env.update(RAFTCRON_IMAGE=image)
        self.file.write_text(yaml.safe_dump(self._compose_doc(), sort_keys=False))
        self._ids: dict[str, str] = {}
        self.volumes: set[str] = set()  # every volume our containers mounted, anonymous ones too

    def _compose_doc(self) -> dict[str, Any]:
        with open(ROOT / "docker-compose.yml") as f:
            doc: dict[str, Any] = yaml.safe_load(f)  # resolves the file's anchors and `<<` merges
        doc = {k: v for k, v in doc.items() if not k.startswith("x-")}
        doc = json.loads(json.dumps(doc))  # no shared sub-objects: safe_dump would emit aliases
        services = doc["services"]
        assert set(NODES) <= set(services), f"docker-compose.yml has no services {NODES}: {list(services)}"
        for svc in services.values():
            svc.pop("build", None)  # we run with --no-build; its relative context would point at tmp
        for name in NODES:
            services[name]["ports"] = [f"127.0.0.1:{self.ports[name]}:8001"]
        first = services[NODES[0]]
        services["sink"] = {
            "image": first["image"],
            "init": True,
            "restart": "no",
            "entrypoint": ["python3", "-m", "sink"],
            "working_dir": "/opt/e2e",
            "environment": {"SINK_PORT": str(SINK_PORT)},
            "volumes": [f"{ROOT / 'tests' / 'e2e' / 'sink'}:/opt/e2e/sink:ro"],
            # The image declares VOLUME /var/lib/raftcron: without a mount there, every sink
            # container would get an anonymous volume that `down` (without -v) leaves behind.
            "tmpfs": ["/var/lib/raftcron"],
            "networks": copy.deepcopy(first["networks"]),
            "healthcheck": {
                "test": ["CMD", "python3", "-c",
                         f"import urllib.request as u; u.urlopen('http://127.0.0.1:{SINK_PORT}/health', timeout=2)"],
                "interval": "5s", "timeout": "3s", "retries": 3,
            },
        }
        return doc

    # compose and docker
    def compose(self, *args: str, timeout: float = 180.0, check: bool = True) -> str:
        proc = run([*self.cmd, "-p", self.project, "-f", str(self.file), *args], timeout,
                   f"compose {' '.join(args)}", check=check, env=self.env)
        return proc.stdout

    def up(self) -> None:
        self._ids.clear()
        self.compose("up", "-d", "--no-build")
        for service in (*NODES, "sink"):
            self.volumes |= {m["Name"] for m in self.inspect(service)["Mounts"] if m.get("Type") == "volume"}

    def exec_python(self, service: str, code: str) -> str:
        return run(["docker", "exec", self.container(service), "python", "-c", code], 30,
                   f"python in {service}").stdout.strip()

    def container(self, service: str) -> str:
        if service not in self._ids:
            cid = self.compose("ps", "-q", service, timeout=60).strip()
            assert cid, f"no container for service {service} in project {self.project}"
            self._ids[service] = cid.splitlines()[0]
        return self._ids[service]

    def inspect(self, service: str) -> dict[str, Any]:
        out = run(["docker", "inspect", self.container(service)], 30, f"docker inspect {service}").stdout
        info: dict[str, Any] = json.loads(out)[0]
        return info

    def network(self) -> str:
        nets = list(self.inspect("sink")["NetworkSettings"]["Networks"])
        assert len(nets) == 1, f"the sink should be on the cluster network only: {nets}"
        return str(nets[0])

    def ip(self, service: str) -> str | None:
        net = self.inspect(service)["NetworkSettings"]["Networks"].get(self.network())
        return net["IPAddress"] if net else None

    def logs(self, tail: int | str = 200) -> str:
        return self.compose("logs", "--no-color", "--timestamps", f"--tail={tail}", timeout=60, check=False)

    def save_logs(self, name: str) -> None:
        """All of the containers' logs into the test's tmp folder (kept by pytest for a few runs)."""
        (self.file.parent / f"{name}.log").write_text(self.logs("all"))

    # the API, from the host through the published ports
    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node]}"

    def get(self, node: str, path: str, timeout: float = 5.0) -> Any:
        status, body = http("GET", self.url(node) + path, timeout=timeout)
        assert status == 200, f"GET {path} on {node}: {status} {body}"
        return body

    def agreed_leader(self, among: tuple[str, ...] | list[str] = NODES) -> str | None:
        """The leader every node in `among` names, once all three are registered and the
        leader sees each of `among` reachable; None while that is not so."""
        views = {}
        for n in among:
            self.get(n, "/v1/health", timeout=2)
            views[n] = self.get(n, "/v1/cluster", timeout=2)
        leaders = {(v.get("leader") or {}).get("node_id") for v in views.values()}
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if not isinstance(leader, str) or leader not in among:
            return None
        members = {m["node_id"]: m for m in views[leader]["members"]}
        if not set(NODES) <= set(members) or not all(members[n]["reachable"] for n in among):
            return None
        return leader

    def wait_healthy(self, what: str, among: tuple[str, ...] | list[str] = NODES, timeout: float = 90.0) -> str:
        return str(wait_for(f"{what}: /v1/health on {', '.join(among)} and one leader they agree on, "
                        f"with {', '.join(NODES)} registered", lambda: self.agreed_leader(among), timeout))

    def runs(self, node: str, job: str = JOB) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        for _ in range(1000):
            body = self.get(node, f"/v1/jobs/{job}/runs?limit=500" + (f"&cursor={cursor}" if cursor else ""),
                            timeout=10)
            items += body["items"]
            cursor = body["next_cursor"]
            if not cursor:
                return items
        raise AssertionError("the runs of {job} did not end after 1000 pages")

    def latest_decision(self) -> tuple[float | None, str]:
        """The latest slot the ledger holds a schedule/catchup decision for, and what the
        nodes say about leadership (for the message when scheduling stalls)."""
        views = []
        for n in NODES:
            try:
                v = self.get(n, "/v1/cluster", timeout=2)
                views.append(f"{n}: {v.get('state')} term {v.get('term')} leader "
                             f"{(v.get('leader') or {}).get('node_id')} commit {v.get('commit_index')}")
            except Exception as exc:  # noqa: BLE001 - a node may be down
                views.append(f"{n}: {exc}")
        leader = self.agreed_leader() or NODES[0]
        slots = [ts(r["slot"]) for r in decisions(self.runs(leader))]
        return (max(slots) if slots else None), "; ".join(views)

    def wait_scheduling(self, what: str, until: float, timeout: float) -> None:
        """Wait until a slot at or after `until` (epoch seconds) is decided."""
        def check() -> bool:
            latest, _ = self.latest_decision()
            return latest is not None and latest >= until

        try:
            wait_for(what, check, timeout, interval=0.5)
        except AssertionError as exc:
            latest, views = self.latest_decision()
            raise AssertionError(
                f"{exc}\nthe cluster stopped scheduling: latest decided slot "
                f"{iso(latest) if latest else None}, {time.time() - (latest or 0):.0f}s ago; {views}\n"
                f"{self.leader_diagnosis()}") from None

    def leader_diagnosis(self, lines: int = 40) -> str:
        """What the agreed leader says about itself when scheduling stalls: its gauges
        and its latest log lines other than the per-slot "decided" ones, so the failure message
        alone (the compose logs at teardown can be cut short) shows why it stopped."""
        leader = self.agreed_leader()
        if leader is None:
            return "no agreed leader to ask"
        try:
            with _opener.open(self.url(leader) + "/metrics", timeout=5) as resp:
                text = resp.read().decode(errors="replace")
            gauges = [ln for ln in text.splitlines()  # the unlabelled ones: raft, leader, worker, runs
                      if ln.startswith("raftcron_") and "{" not in ln and not ln.startswith("raftcron_metrics")]
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
            gauges = [f"/metrics: {exc}"]
        logs = self.compose("logs", "--no-color", "--timestamps", "--tail=1000", leader, timeout=60, check=False)
        kept = [ln for ln in logs.splitlines() if " decided " not in ln][-lines:]
        return (f"leader {leader}, its gauges:\n  " + "\n  ".join(gauges)
                + f"\nits last {len(kept)} log lines other than decisions:\n  " + "\n  ".join(kept))

    def deliveries(self) -> list[dict[str, Any]]:
        """What the sink recorded, from its stdout (`docker logs`), headers lower-cased."""
        out = run(["docker", "logs", self.container("sink")], 60, "docker logs of the sink").stdout
        records = []
        for line in out.splitlines():
            if line.startswith("SINK {"):
                rec = json.loads(line[5:])
                if "headers" in rec:
                    rec["headers"] = {k.lower(): v for k, v in rec["headers"].items()}
                    records.append(rec)
        return records

    def sink_listening(self) -> bool:
        out = run(["docker", "logs", self.container("sink")], 60, "docker logs of the sink").stdout
        return '"listening"' in out


@dataclass
class _Delivery:
    at: float
    headers: dict[str, str]


class _Receiver:
    """The sink's records as the fault suite's checker reads a receiver (header names as sent)."""

    def __init__(self, c: ComposeCluster) -> None:
        self.c = c

    def of(self, job: str) -> list[_Delivery]:
        # Read when the checker asks, after it waited for the ledger to settle: read any earlier,
        # the retries that settled meanwhile were missing (seen: two slots "never received").
        out = []
        for d in self.c.deliveries():
            headers = {"-".join(w.capitalize() for w in k.split("-")): v for k, v in d["headers"].items()}
            if headers.get("X-Raftcron-Job") == job:
                out.append(_Delivery(float(d["t"]), headers))
        return out


@dataclass
class _ApiNode:
    url: str


class _Api:
    """The nodes' published API ports, as the checker reads a cluster."""

    def __init__(self, c: ComposeCluster) -> None:
        self.c = c

    def live(self) -> list[_ApiNode]:
        return [_ApiNode(self.c.url(n)) for n in NODES]


@pytest.fixture
def cluster(e2e_image: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ComposeCluster]:
    c = ComposeCluster(tmp_path, e2e_image)
    try:
        yield c
    finally:
        failed = any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))
        c.save_logs("compose-at-teardown")
        if failed:
            print(f"===== compose logs of {c.project} =====\n{c.logs(300)}")
        c.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=180, check=False)
        # Whatever still carries our project label (a container a failed `down` left behind).
        label = f"label=com.docker.compose.project={c.project}"
        for kind, ls_cmd in (("container", ["docker", "ps", "-aq", "-f", label]),
                             ("volume", ["docker", "volume", "ls", "-q", "-f", label]),
                             ("network", ["docker", "network", "ls", "-q", "-f", label])):
            left = run(ls_cmd, 30, f"list {kind}s of {c.project}", check=False).stdout.split()
            for obj in left:
                run(["docker", kind, "rm", *(["-f"] if kind == "container" else []), obj], 60,
                    f"remove {kind} {obj}", check=False)
            assert not left or failed, f"`down -v` left {kind}s of {c.project}: {left}"
        existing = set(run(["docker", "volume", "ls", "-q"], 30, "list volumes").stdout.split())
        left = sorted(c.volumes & existing)
        for vol in left:
            run(["docker", "volume", "rm", vol], 60, f"remove volume {vol}", check=False)
        assert not left or failed, f"`down -v` left volumes our containers had mounted: {left}"


# ---- the ledger checks (as tests/cluster/test_scheduling.py) --------------------------------

def decisions(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["trigger"] in SCHEDULED]


def assert_one_decision_per_slot(runs: list[dict[str, Any]], period: float = 1.0) -> list[float]:
    per_slot = Counter(r["slot"] for r in decisions(runs))
    doubled = {s: n for s, n in per_slot.items() if n > 1}
    assert not doubled, f"slots decided more than once: {doubled}"
    slots = sorted(ts(s) for s in per_slot)
    assert slots, "no slot decided at all"
    gaps = [(a, b) for a, b in zip(slots, slots[1:], strict=False) if abs((b - a) - period) > 0.001]
    assert not gaps, f"slots missing between decided ones (first gaps): {gaps[:5]}"
    return slots


# ---- the test ------------------------------------------------------------------------------

def test_compose_cluster_survives_kill_partition_and_restart(cluster: ComposeCluster) -> None:
    c = cluster
    t_start = time.monotonic()

    # 2-3. up, and healthy
    t0 = time.monotonic()
    c.up()
    leader = c.wait_healthy("the cluster after `up -d`")
    TIMINGS["up -d to a healthy cluster (empty volumes)"] = time.monotonic() - t0
    # The nodes agree on a secret nobody gave them: the one the `secret` service generated.
    secrets_seen = {c.exec_python(n, "print(open('/run/raftcron-secret/secret').read().strip())") for n in NODES}
    assert len(secrets_seen) == 1 and len(secrets_seen.pop()) == 64, "one generated 32-byte hex secret"
    wait_for("the sink to listen (its 'listening' line in docker logs)", c.sink_listening, 30)

    # 4. the job
    job = {"name": JOB, "schedule": "@every 1s", "executor": "http",
           "http": {"url": f"http://sink:{SINK_PORT}/hook", "method": "POST"}, "timeout": "20s",
           "catchup": {"policy": "all", "window": "5m"}}

    def put() -> Any:
        status, body = http("PUT", f"{c.url(c.agreed_leader() or leader)}/v1/jobs/{JOB}", job, timeout=8)
        if status in (200, 201):
            return body
        assert status in (503, 504), f"PUT /v1/jobs/{JOB}: {status} {body}"
        return None

    wait_for(f"PUT /v1/jobs/{JOB} answered 200/201", put, 30)
    wait_for("the first two deliveries at the sink", lambda: len(c.deliveries()) >= 2, 30)
    time.sleep(5)  # deliberate: let it run

    # 5. kill the leader's container; a new leader; start it again
    leader = c.wait_healthy("the leader before the kill", timeout=30)
    survivors = [n for n in NODES if n != leader]
    run(["docker", "kill", c.container(leader)], 60, f"docker kill {leader}")
    t_kill_wall, t_kill = time.time(), time.monotonic()
    new_leader = c.wait_healthy(f"a new leader among {survivors} after killing {leader}", survivors, timeout=30)
    TIMINGS[f"failover ({leader} killed -> {new_leader} agreed leader)"] = time.monotonic() - t_kill
    assert new_leader != leader
    assert not c.inspect(leader)["State"]["Running"], f"{leader} was restarted by docker after `docker kill`"
    time.sleep(4)  # deliberate: the new leader schedules alone for a while
    run(["docker", "start", c.container(leader)], 60, f"docker start {leader}")
    t_back_wall, t0 = time.time(), time.monotonic()
    leader = c.wait_healthy(f"{leader} back after docker start", timeout=60)
    TIMINGS["killed node back: docker start to healthy"] = time.monotonic() - t0

    # 6. cut a follower off the cluster network, then reconnect it (with its aliases)
    follower = next(n for n in NODES if n != leader)
    net = c.network()
    endpoint = c.inspect(follower)["NetworkSettings"]["Networks"][net]
    aliases = [a for a in (endpoint.get("Aliases") or []) if a]
    ip_before = endpoint["IPAddress"]
    run(["docker", "network", "disconnect", net, c.container(follower)], 60, f"disconnect {follower}")
    t_cut_wall, t0 = time.time(), time.monotonic()
    try:
        wait_for(f"the leader {leader} to see {follower} unreachable", lambda: not next(
            m for m in c.get(leader, "/v1/cluster", timeout=2)["members"] if m["node_id"] == follower)["reachable"], 5)
        TIMINGS[f"partition: disconnect to {follower} unreachable at the leader"] = time.monotonic() - t0
        time.sleep(max(0.0, 5 - (time.monotonic() - t0)))  # deliberate: the partition lasts 5 s
    finally:
        run(["docker", "network", "connect", *[f"--alias={a}" for a in aliases], net, c.container(follower)], 60,
            f"reconnect {follower} to {net}")
    t0 = time.monotonic()
    ip_after = c.ip(follower)
    leader = c.wait_healthy(f"{follower} rejoined after the partition (IP {ip_before} -> {ip_after})", timeout=60)
    TIMINGS[f"partitioned follower back: reconnect to healthy (IP {ip_before} -> {ip_after})"] = time.monotonic() - t0
    healed = time.time()
    # The cluster keeps scheduling: the leader decides slots about 2 s ahead, so a slot 3 s
    # after the reconnect is decided within a few seconds when all is well.
    c.wait_scheduling(f"a slot decided after the partition healed (>= reconnect + 3 s, {iso(healed + 3)})",
                      healed + 3, timeout=20)
    time.sleep(3)  # deliberate: let it run after the partition

    # 7. the ledger and the sink
    end = time.time() - 1.0  # slots up to here must be decided and delivered
    c.wait_scheduling(f"slots decided up to the end of the observed window ({iso(end)})", end, timeout=20)

    # Judged as every fault test is: every slot from the kill on delivered, none early, a second
    # delivery only after a lost attempt that a fault cut short, tokens increasing, nothing stuck.
    verdict = check(_Receiver(c), _Api(c), [Expect(JOB)], (t_kill_wall - 1, end),
                    faults=[(t_kill_wall, t_back_wall), (t_cut_wall, healed)], lease=5.0)
    assert verdict.ok, verdict.report()
    runs = c.runs(leader)
    window = [r for r in decisions(runs) if t_kill_wall - 1 <= ts(r["slot"]) <= end]
    slots = assert_one_decision_per_slot(runs)
    assert slots[0] <= t_kill_wall - 3, "the ledger should hold slots from before the kill"
    assert len(window) >= int(end - t_kill_wall) - 1, (len(window), end - t_kill_wall)
    statuses = Counter(r["status"] for r in runs)
    TIMINGS["ledger"] = f"{len(runs)} runs, {len(slots)} slots, statuses {dict(statuses)}; checker: {verdict.line()}"

    # 8. down (keeping the volumes) and up again: the job and the ledger are still there
    before = {r["id"] for r in runs}
    c.save_logs("compose-before-down")
    c.compose("down", "-t", "10", timeout=180)
    t0 = time.monotonic()
    c.up()
    leader = c.wait_healthy("the cluster after down and up on the same volumes")
    TIMINGS["up -d to a healthy cluster (existing volumes)"] = time.monotonic() - t0
    status, body = http("GET", f"{c.url(leader)}/v1/jobs/{JOB}")
    assert status == 200 and body["name"] == JOB, f"GET /v1/jobs/{JOB} after the restart: {status} {body}"
    t_up_wall = time.time()

    def runs_after_restart() -> list[dict[str, Any]] | None:
        r = c.runs(leader)
        return r if any(ts(x["slot"]) >= t_up_wall for x in decisions(r)) else None

    after = wait_for("a slot decided after the restart", runs_after_restart, 30)
    ids = {r["id"] for r in after}
    assert len(after) >= len(runs), f"{len(after)} runs after the restart, {len(runs)} before"
    assert before <= ids, f"runs gone after the restart: {sorted(before - ids)[:10]}"
    assert_one_decision_per_slot(after)  # the slots of the downtime were caught up, once each
    wait_for("a delivery at the new sink container", lambda: c.deliveries(), 30)
    TIMINGS["test body"] = time.monotonic() - t_start
