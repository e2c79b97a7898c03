"""Start-up time and memory of the local control plane, printed as a table.

    .venv/bin/python benchmarks/local_plane_footprint.py [--regions 3]

Starts etcd (one member per region), a kube-apiserver with the CRDs, a Postgres
primary and a streaming standby; reports how long each took to become ready and
the resident (RSS) and proportional (PSS) memory of each program's whole process
tree. PSS shares a page's cost among the processes mapping it, so the PSS column
adds up honestly where RSS would count Postgres' shared buffers once per backend.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cellplane_operator.localplane import LocalControlPlane
from cellplane_operator.localplane.controlplane import LocalPlaneConfig
from procstat import descendants


def _memory_kib(pid: int) -> tuple[int, int, int]:
    """(processes, RSS KiB, PSS KiB) of a process and its descendants."""
    pids = [pid, *descendants(pid)]
    rss = pss = 0
    for one in pids:
        for line in Path(f"/proc/{one}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    return len(pids), rss, pss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds to let the apiserver finish its start-up work before measuring")
    args = parser.parse_args()
    regions = tuple(f"region-{chr(ord('a') + i)}" for i in range(args.regions))

    plane = LocalControlPlane(LocalPlaneConfig(regions=regions, with_apiserver=False))
    timings: dict[str, float] = {}
    try:
        started = time.monotonic()
        plane.etcd.start()
        timings["etcd"] = time.monotonic() - started

        from cellplane_operator.localplane.apiserver import KubeApiServer

        started = time.monotonic()
        plane.apiserver = KubeApiServer(plane.binaries, plane.run_dir,
                                        etcd_servers=plane.etcd.client_urls)
        plane.apiserver.start()
        timings["kube-apiserver"] = time.monotonic() - started
        started = time.monotonic()
        plane.apply_crds()
        timings["CRDs Established"] = time.monotonic() - started

        started = time.monotonic()
        primary = plane.add_postgres("primary")
        timings["postgres primary"] = time.monotonic() - started
        started = time.monotonic()
        plane.add_standby("standby", primary=primary)
        timings["postgres standby"] = time.monotonic() - started

        time.sleep(args.settle)
        rows: list[tuple[str, str, int, int, int]] = []
        for member in plane.etcd.members:
            assert member.process is not None and member.process.pid is not None
            rows.append((f"etcd {member.name}", f"{timings['etcd']:.2f}",
                         *_memory_kib(member.process.pid)))
        assert plane.apiserver.process is not None and plane.apiserver.process.pid is not None
        rows.append(("kube-apiserver", f"{timings['kube-apiserver']:.2f}",
                     *_memory_kib(plane.apiserver.process.pid)))
        for name, pg in plane.postgres.items():
            assert pg.process is not None and pg.process.pid is not None
            rows.append((f"postgres {name}", f"{timings[f'postgres {name}']:.2f}",
                         *_memory_kib(pg.process.pid)))

        print("| component | ready after (s) | processes | RSS (MiB) | PSS (MiB) |")
        print("|---|---:|---:|---:|---:|")
        for name, ready, count, rss, pss in rows:
            print(f"| {name} | {ready} | {count} | {rss / 1024:.1f} | {pss / 1024:.1f} |")
        total_rss = sum(r[3] for r in rows) / 1024
        total_pss = sum(r[4] for r in rows) / 1024
        print(f"| **total** | {sum(v for k, v in timings.items()):.2f} | "
              f"{sum(r[2] for r in rows)} | {total_rss:.1f} | {total_pss:.1f} |")
        print(f"\nCRDs applied and Established in {timings['CRDs Established']:.2f}s "
              f"(counted in the total)")
    finally:
        plane.stop()
        plane.remove()


if __name__ == "__main__":
    main()
