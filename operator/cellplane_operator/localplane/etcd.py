"""etcd as one member or as a cluster with one member per region, on loopback.

In production the ownership table runs as a member per region, so that losing a
region loses one vote and the other two keep quorum; the local cluster has the
same shape so tests can kill a "region's" member and watch what survives.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellplane_operator.localplane.binaries import Binaries
from cellplane_operator.localplane.ports import LOOPBACK, free_port
from cellplane_operator.localplane.process import ManagedProcess, wait_for

__all__ = ["EtcdMember", "EtcdCluster"]

# Heartbeat and election timeouts an order of magnitude below etcd's defaults
# (100 ms / 1000 ms) would make elections flap on a loaded 2-core CI machine;
# these are the defaults, spelled out so a reader sees what a failover costs.
_HEARTBEAT_MS = 100
_ELECTION_MS = 1000


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    log: Path
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client API, the form the gRPC client takes."""
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def healthy(self) -> bool:
        """etcd's own /health: true only when this member sees a leader and can serve."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (urllib.error.URLError, OSError, ValueError):
            return False


def _post_json(url: str) -> dict[str, Any] | None:
    """POSTs ``{}`` to etcd's JSON gateway; None when the member does not answer."""
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            body = json.loads(response.read())
            return body if isinstance(body, dict) else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class EtcdCluster:
    """N etcd members forming one cluster; N=1 is a single-member store, N=0 none."""

    def __init__(
        self,
        binaries: Binaries,
        base_dir: Path,
        *,
        member_names: list[str],
        cluster_token: str = "cellplane-local",
    ) -> None:
        self._binaries = binaries
        self._token = cluster_token
        self.members = [
            EtcdMember(
                name=name,
                data_dir=base_dir / f"etcd-{name}",
                client_port=free_port(),
                peer_port=free_port(),
                log=base_dir / "logs" / f"etcd-{name}.log",
            )
            for name in member_names
        ]

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    @property
    def client_urls(self) -> list[str]:
        return [member.client_url for member in self.members]

    def member(self, name: str) -> EtcdMember:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(f"no etcd member named {name!r}")

    def leader(self) -> str | None:
        """The name of the member that is raft leader now, asked of the live members."""
        for member in self.members:
            if not member.running:
                continue
            status = _post_json(f"{member.client_url}/v3/maintenance/status")
            if status is None:
                continue
            leader_id = status.get("leader")
            if leader_id is None:
                continue
            for candidate in self.members:
                if not candidate.running:
                    continue
                candidate_status = _post_json(f"{candidate.client_url}/v3/maintenance/status")
                if candidate_status and candidate_status.get("header", {}).get("member_id") == leader_id:
                    return candidate.name
        return None

    def start(self, *, timeout: float = 60) -> None:
        for member in self.members:
            self._start_member(member)
        for member in self.members:
            self._wait_healthy(member, timeout)

    def kill(self, name: str) -> None:
        """SIGKILL one member, as losing its region would."""
        member = self.member(name)
        if member.process is not None:
            member.process.kill()

    def pause(self, name: str) -> None:
        """SIGSTOP one member: it keeps its ports open and answers nothing."""
        process = self.member(name).process
        if process is not None:
            process.pause()

    def resume(self, name: str) -> None:
        process = self.member(name).process
        if process is not None:
            process.resume()

    def restart(self, name: str, *, timeout: float = 60) -> None:
        """Start a stopped member again on its old data dir; it rejoins the cluster."""
        member = self.member(name)
        self._start_member(member)
        self._wait_healthy(member, timeout)

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None:
                member.process.stop()

    def logs(self) -> list[Path]:
        return [member.log for member in self.members]

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def _start_member(self, member: EtcdMember) -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        member.data_dir.chmod(0o700)
        argv = [
            str(self._binaries.etcd),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.client_url}",
            f"--advertise-client-urls={member.client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={self._initial_cluster()}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self._token}",
            f"--heartbeat-interval={_HEARTBEAT_MS}",
            f"--election-timeout={_ELECTION_MS}",
            "--listen-metrics-urls=",
            "--log-level=warn",
        ]
        member.process = ManagedProcess(f"etcd-{member.name}", argv, log=member.log)
        member.process.start()

    def _wait_healthy(self, member: EtcdMember, timeout: float) -> None:
        process = member.process
        assert process is not None
        wait_for(
            member.healthy,
            timeout=timeout,
            what=f"etcd member {member.name} to report healthy at {member.client_url}/health",
            alive=process.check_alive,
        )
