"""The local cluster's container images: built on this machine, never pulled.

No registry is reached here, so every image a node runs is built from the repository
and imported into each node's containerd (``ctr images import``); the pods name them
with ``imagePullPolicy: Never`` (or IfNotPresent, the image being present):

- ``localhost/cellplane/pause:<PAUSE_VERSION>``: the sandbox image, the static Go program
  of ``hack/pause``, one file in an image written here (no build tool needed for it).
- ``localhost/cellplane-operator:<version of pyproject.toml>``: the repository's
  ``Dockerfile``, built by podman with chroot isolation (no daemon). It is the chart's
  image, and with PostgreSQL 15 and cellplane in it, the cells' and the router's too.
- ``localhost/cellplane/etcd:<ETCD_VERSION>``: the etcd that hack/build-binaries.sh built
  (static), alone in an image like the pause program: the ownership table's members can
  run as Pods, one on each region's node, so that losing the region loses its member.

Each image is saved as a docker-archive tar, ``<cache>/images/<name>.tar``, beside a
stamp ``<name>.json`` that records its reference and the sha256 of everything it is
built from; a build whose inputs hash to the stamp's is skipped. The Dockerfile
installs the dependencies in a layer of their own before it copies the sources, so
after a change of Python only, podman rebuilds the last two layers: seconds, not the
minutes of the first build (README's setup section has the measured times).

    python -m cellplane_operator.localplane.images [--load SOCKET ...]   # or hack/images.sh
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cellplane_operator.errors import ImageBuildError
from cellplane_operator.localplane.binaries import built_bin_dir, default_cache_dir

__all__ = [
    "PAUSE_VERSION",
    "OPERATOR_REPOSITORY",
    "BASE_IMAGE",
    "ImageArchive",
    "source_root",
    "images_dir",
    "pause_reference",
    "operator_reference",
    "build_images",
    "build_pause_image",
    "build_etcd_image",
    "etcd_reference",
    "build_operator_image",
    "import_images",
    "context_files",
    "inputs_digest",
    "write_single_file_archive",
]

PAUSE_VERSION = "1.0"
"""Tag of the pause image; raise it with a change to hack/pause that matters to nodes."""

OPERATOR_REPOSITORY = "localhost/cellplane-operator"
"""The operator image's name: ``localhost/`` names an image no registry serves."""

BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
"""The Dockerfile's ``FROM``, as podman names it."""

Say = Callable[[str], None]


@dataclass(frozen=True)
class ImageArchive:
    """One image, saved where every node's containerd can import it."""

    name: str
    """Short name: the archive is ``<images_dir>/<name>.tar``."""
    reference: str
    """The reference pods and containerd's ``sandbox_image`` name it by."""
    archive: Path
    """A docker-archive tar (``docker save``'s format), which ``ctr images import`` reads."""
    inputs: str
    """sha256 of everything the image is built from (its stamp)."""


def source_root() -> Path:
    """The repository checkout this package is installed from (editable install)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "Dockerfile").is_file() or not (root / "hack" / "pause").is_dir():
        raise ImageBuildError(
            f"no repository checkout around {Path(__file__).parent}: the images are built "
            "from one (pip install -e . from a clone, as hack/setup.sh does)")
    return root


def images_dir(cache: Path | None = None) -> Path:
    """Where the image archives and their stamps are kept."""
    return (cache or default_cache_dir()) / "images"


def pause_reference() -> str:
    return f"localhost/cellplane/pause:{PAUSE_VERSION}"


def etcd_reference(source: Path) -> str:
    """``localhost/cellplane/etcd:<ETCD_VERSION of hack/versions.env>``."""
    for line in (source / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("ETCD_VERSION="):
            return f"localhost/cellplane/etcd:{line.split('=', 1)[1].strip()}"
    raise ImageBuildError("hack/versions.env pins no ETCD_VERSION")


def operator_reference(source: Path) -> str:
    """``localhost/cellplane-operator:<version>``, the version the chart's appVersion equals."""
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    return f"{OPERATOR_REPOSITORY}:{version}"


# --- what an image is built from ------------------------------------------------------

def context_files(source: Path) -> list[Path]:
    """The files of the Docker build context: ``.dockerignore`` excludes everything, then
    lets back in the paths it names with ``!`` (and keeps out ``**/`` patterns), which is
    the only shape that file takes here (tests/unit/test_image.py checks the COPYs)."""
    kept: list[str] = []
    dropped: list[str] = []
    for line in (source / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line == "*":
            continue
        if line.startswith("!"):
            kept.append(line[1:].rstrip("/"))
        elif line.startswith("**/"):
            dropped.append(line[3:])
        else:
            raise ImageBuildError(f".dockerignore: pattern {line!r} is not understood by "
                                  "images.context_files (it hashes the build context)")
    files: list[Path] = []
    for entry in kept:
        path = source / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        for candidate in candidates:
            relative = candidate.relative_to(source)
            if candidate.is_file() and not any(
                    fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in dropped):
                files.append(candidate)
    return sorted(set(files))


def inputs_digest(source: Path, files: Iterable[Path], *extra: str) -> str:
    """sha256 over the files' paths (relative to ``source``), modes and contents, and
    ``extra`` strings (versions, a base image's id)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for value in extra:
        digest.update(b"\0" + value.encode())
    return digest.hexdigest()


def _stamp_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.json"


def _up_to_date(directory: Path, name: str, reference: str, inputs: str) -> bool:
    archive = directory / f"{name}.tar"
    try:
        stamp = json.loads(_stamp_path(directory, name).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return archive.is_file() and stamp == {"reference": reference, "inputs": inputs}


def _write_stamp(directory: Path, name: str, reference: str, inputs: str) -> None:
    _stamp_path(directory, name).write_text(
        json.dumps({"reference": reference, "inputs": inputs}, indent=2) + "\n")


# --- the pause image ------------------------------------------------------------------

def write_single_file_archive(archive: Path, *, reference: str, program: Path,
                              path_in_image: str, user: str) -> None:
    """A docker-archive of one image holding one executable, its entrypoint.

    The layout ``docker save`` writes: ``manifest.json``, the config blob named by its
    digest, and the layer as an uncompressed tar named by its digest (the diff_id).
    Every timestamp is zero, so the same program always gives the same bytes.
    """
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(path_in_image.lstrip("/"))
        data = program.read_bytes()
        info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o755, 0, 0, 0
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    layer_digest = hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": [path_in_image], "User": user, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": f"cellplane images.py: {program.name} as {path_in_image}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [reference],
                 "Layers": [f"{layer_digest}/layer.tar"]}]
    members = [(f"{layer_digest}/layer.tar", layer_bytes), (config_name, config_bytes),
               ("manifest.json", json.dumps(manifest).encode())]
    partial = archive.with_suffix(".tar.partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), 0o644, 0
            out.addfile(info, io.BytesIO(content))
    partial.replace(archive)


def build_pause_image(source: Path, directory: Path, say: Say) -> ImageArchive:
    """The sandbox image: hack/pause built static by the machine's Go, packed alone."""
    reference = pause_reference()
    pause_source = source / "hack" / "pause"
    go = shutil.which("go")
    if go is None:
        raise ImageBuildError("the Go toolchain (go on PATH) builds the pause program")
    go_version = _output([go, "env", "GOVERSION"]).strip()
    inputs = inputs_digest(source, sorted(p for p in pause_source.rglob("*") if p.is_file()),
                           reference, go_version)
    archive = directory / "pause.tar"
    if _up_to_date(directory, "pause", reference, inputs):
        say(f"{reference}: up to date ({archive})")
        return ImageArchive("pause", reference, archive, inputs)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        program = Path(scratch) / "pause"
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false",
                   GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"))
        _run([go, "build", "-trimpath", "-ldflags", f"-s -w -X main.version={PAUSE_VERSION}",
              "-o", str(program), "."], cwd=pause_source, env=env, what="go build hack/pause")
        # The kubelet's own pause image runs as this user, nobody's.
        write_single_file_archive(archive, reference=reference, program=program,
                                  path_in_image="/pause", user="65535:65535")
    _write_stamp(directory, "pause", reference, inputs)
    say(f"{reference}: built in {time.monotonic() - started:.1f} s ({archive})")
    return ImageArchive("pause", reference, archive, inputs)


def build_etcd_image(source: Path, directory: Path, say: Say) -> ImageArchive:
    """The pinned etcd, built static by hack/build-binaries.sh, alone in an image."""
    reference = etcd_reference(source)
    program = built_bin_dir() / "etcd"
    if not os.access(program, os.X_OK):
        raise ImageBuildError(f"{program} is missing: run bash hack/setup.sh")
    inputs = inputs_digest(program.parent, [program], reference)
    archive = directory / "etcd.tar"
    if _up_to_date(directory, "etcd", reference, inputs):
        say(f"{reference}: up to date ({archive})")
        return ImageArchive("etcd", reference, archive, inputs)
    # Root in the image: the pod's securityContext says who runs it.
    write_single_file_archive(archive, reference=reference, program=program,
                              path_in_image="/usr/local/bin/etcd", user="0:0")
    _write_stamp(directory, "etcd", reference, inputs)
    say(f"{reference}: packed ({archive})")
    return ImageArchive("etcd", reference, archive, inputs)


# --- the operator image ---------------------------------------------------------------

def _ensure_base_image(podman: str, work: Path, say: Say) -> str:
    """The Dockerfile's base in podman's store, and its id. Where no registry serves it
    (Docker Hub is not reached here), a Debian 12 root made by debootstrap from Debian's
    own packages is imported under its name."""
    if subprocess.run([podman, "image", "exists", BASE_IMAGE], check=False).returncode != 0:
        debootstrap = shutil.which("debootstrap")
        if debootstrap is None:
            raise ImageBuildError(f"{BASE_IMAGE} is not in podman's store and debootstrap, "
                                  "which makes it here, is missing: run bash hack/setup.sh")
        say(f"{BASE_IMAGE}: not in podman's store; making a Debian 12 root with debootstrap "
            "and importing it under that name (a few minutes, once)")
        started = time.monotonic()
        root = work / "base"
        log = work / "debootstrap.log"
        _run([debootstrap, "--variant=minbase", "bookworm", str(root)], log=log,
             what="debootstrap bookworm")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run([podman, "import", "-q", "-", BASE_IMAGE], stdin=tar.stdout,
                                  capture_output=True, text=True, check=False)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise ImageBuildError(f"podman import {BASE_IMAGE} failed: {imported.stderr.strip()}")
        shutil.rmtree(root)
        say(f"{BASE_IMAGE}: imported in {time.monotonic() - started:.0f} s")
    return _output([podman, "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]).strip()


def build_operator_image(source: Path, directory: Path, say: Say) -> ImageArchive:
    """The repository's Dockerfile, built by podman (chroot isolation: no daemon, no user
    namespaces) and saved as a docker-archive."""
    reference = operator_reference(source)
    podman = shutil.which("podman")
    if podman is None:
        raise ImageBuildError("podman builds the operator image: run bash hack/setup.sh")
    archive = directory / "operator.tar"
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        work = Path(scratch)
        base_id = _ensure_base_image(podman, work, say)
        files = [source / "Dockerfile", source / ".dockerignore", *context_files(source)]
        inputs = inputs_digest(source, files, reference, base_id)
        if _up_to_date(directory, "operator", reference, inputs):
            say(f"{reference}: up to date ({archive})")
            return ImageArchive("operator", reference, archive, inputs)
        started = time.monotonic()
        say(f"{reference}: podman build (Dockerfile)")
        _run([podman, "build", "--isolation", "chroot", "--layers", *_pip_ca_mounts(work),
              "-t", reference, str(source)], log=directory / "operator-build.log",
             what="podman build")
        built = time.monotonic()
        partial = directory / "operator.tar.partial"
        partial.unlink(missing_ok=True)
        _run([podman, "save", "--format", "docker-archive", "-o", str(partial), reference],
             log=directory / "operator-save.log", what="podman save")
        partial.replace(archive)
        _write_stamp(directory, "operator", reference, inputs)
        say(f"{reference}: built in {built - started:.1f} s, saved in "
            f"{time.monotonic() - built:.1f} s ({archive}, {archive.stat().st_size / 1e6:.0f} MB)")
    return ImageArchive("operator", reference, archive, inputs)


def _pip_ca_mounts(work: Path) -> list[str]:
    """pip inside the build trusts the CAs this machine trusts (a proxy's, say), through
    a mount, so they never enter the image."""
    host_ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if not host_ca.is_file():
        return []
    conf = work / "pip.conf"
    conf.write_text("[global]\ncert = /etc/host-pip-ca.crt\n")
    return ["-v", f"{host_ca}:/etc/host-pip-ca.crt:ro", "-v", f"{conf}:/etc/pip.conf:ro"]


# --- both, and the nodes --------------------------------------------------------------

def build_images(*, source: Path | None = None, cache: Path | None = None,
                 say: Say = print) -> list[ImageArchive]:
    """Builds what changed (nothing when every stamp matches) and returns every image the
    local cluster's nodes need, the pause image first."""
    root = source or source_root()
    directory = images_dir(cache)
    directory.mkdir(parents=True, exist_ok=True)
    return [build_pause_image(root, directory, say), build_operator_image(root, directory, say),
            build_etcd_image(root, directory, say)]


def import_images(containerd_socket: Path, images: Sequence[ImageArchive], *,
                  ctr: str = "ctr", namespace: str = "k8s.io", say: Say = print) -> None:
    """Loads the archives into one node's containerd, in the namespace the CRI plugin
    (so the kubelet) sees. An image of the same reference is replaced; layers the node
    already has are not unpacked again."""
    for image in images:
        started = time.monotonic()
        _run([ctr, "--address", str(containerd_socket), "--namespace", namespace,
              "images", "import", str(image.archive)], what=f"ctr images import {image.name}")
        say(f"{image.reference}: imported into {containerd_socket} in "
            f"{time.monotonic() - started:.1f} s")


# --- helpers ----------------------------------------------------------------------------

def _output(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"{' '.join(argv)} exited with {result.returncode}: "
                              f"{result.stderr.strip()}")
    return result.stdout


def _run(argv: Sequence[str], *, what: str, cwd: Path | None = None,
         env: dict[str, str] | None = None, log: Path | None = None) -> None:
    """Runs a build step; on failure the error carries the end of its output."""
    result = subprocess.run(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    if log is not None:
        log.write_bytes(result.stdout)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.decode(errors="replace").splitlines()[-40:])
        raise ImageBuildError(f"{what} exited with {result.returncode}:\n{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/images.sh", description="Build the local cluster's images (what changed "
        "only) and import them into the containerd of each node named with --load.")
    parser.add_argument("--load", metavar="SOCKET", type=Path, action="append", default=[],
                        help="a node's containerd socket; repeat for each node")
    parser.add_argument("--ctr", default="ctr", help="the ctr program (containerd's client)")
    args = parser.parse_args(argv)
    say: Say = lambda line: print(f"[images {time.strftime('%H:%M:%S')}] {line}", flush=True)
    try:
        images = build_images(say=say)
        # The nodes import at once: each reads the archives and unpacks on its own store.
        with ThreadPoolExecutor(max_workers=max(1, len(args.load))) as pool:
            for done in [pool.submit(import_images, socket, images, ctr=args.ctr, say=say)
                         for socket in args.load]:
                done.result()
    except ImageBuildError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    for image in images:
        print(f"{image.reference} {image.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
