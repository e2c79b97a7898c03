"""The nodes' images, imported once and shared: a seed containerd root per set of images.

Importing the operator image (about 850 MB) into a containerd took about 2 minutes
on a loaded 2-core machine; three nodes at each cluster start would cost minutes
and 5 GB. Instead the images are imported once into a seed root, kept in the
cache under a key of the images' references and inputs (their stamps), and each
node's containerd root starts as a copy of it in which the content blobs and the
unpacked layers are hard links (read-only to containerd: a container writes to a
fresh snapshot of its own) and every other file (the bolt databases above all) is
a real copy. A node restarted after a kill keeps its root.

The seed's containerd runs without its CRI plugin (so it opens no TCP port) and in
no network namespace of ours: it only serves its unix socket to ``ctr import``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cellplane_operator.errors import LocalPlaneError
from cellplane_operator.localplane.binaries import default_cache_dir
from cellplane_operator.localplane.process import ManagedProcess

__all__ = ["seed_root", "copy_root"]

# Where containerd keeps what never changes once written: hard-linked, not copied.
_SHARED_PARTS = ("io.containerd.content.v1.content/blobs",
                 "io.containerd.snapshotter.v1.overlayfs/snapshots")


def _key(images: Sequence[Any]) -> str:
    digest = hashlib.sha256()
    for image in images:
        digest.update(f"{image.reference}\0{image.inputs}\0".encode())
    return digest.hexdigest()[:20]


def seed_root(images: Sequence[Any], *, containerd: Path, ctr: Path,
              say: Callable[[str], None], cache: Path | None = None) -> Path:
    """A containerd root holding ``images`` in the CRI's namespace, made once per set."""
    seeds = (cache or default_cache_dir()) / "cluster-seed"
    seeds.mkdir(parents=True, exist_ok=True)
    key = _key(images)
    seed = seeds / key
    with (seeds / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions starting clusters at once
        if (seed / "complete").exists():
            return seed / "root"
        for old in seeds.iterdir():
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)  # images changed: the old seed is dead weight
        partial = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=seeds))
        _import(partial, images, containerd=containerd, ctr=ctr, say=say)
        (partial / "complete").touch()
        partial.rename(seed)
        return seed / "root"


def _import(directory: Path, images: Sequence[Any], *, containerd: Path, ctr: Path,
            say: Callable[[str], None]) -> None:
    from cellplane_operator.localplane.images import import_images

    socket = directory / "c.sock"
    config = directory / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{directory / "root"}"\nstate = "{directory / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{socket}"\n[ttrpc]\n  address = "{socket}.ttrpc"\n'
        '[metrics]\n  address = ""\n')
    process = ManagedProcess("containerd-seed", [str(containerd), f"--config={config}",
                                                 "--log-level=warn"],
                             log=directory / "containerd.log")
    process.start()
    try:
        process.wait_until(
            lambda: subprocess.run([str(ctr), "--address", str(socket), "version"],
                                   capture_output=True, timeout=30, check=False).returncode == 0,
            timeout=120, what="seed containerd's socket")
        import_images(socket, list(images), ctr=str(ctr), say=say)
    finally:
        process.stop(grace=30)
    shutil.rmtree(directory / "state", ignore_errors=True)


def copy_root(seed: Path, target: Path) -> None:
    """``target`` becomes a containerd root with the seed's images: hard links for the
    blobs and unpacked layers, real copies for the rest."""
    if target.exists() and any(target.iterdir()):
        return  # a node restarting on its own data
    target.mkdir(parents=True, exist_ok=True)
    if not _same_filesystem(seed, target):
        _cp("-a", f"{seed}/.", f"{target}/")
        return
    # cp -al recreates the directories with their owners and modes and links every file
    # (whiteouts, which are device nodes, included); then every file containerd may
    # write is made a copy of its own.
    _cp("-al", f"{seed}/.", f"{target}/")
    for directory, subdirs, files in os.walk(target):
        relative = Path(directory).relative_to(target)
        subdirs[:] = [d for d in subdirs if str(relative / d) not in _SHARED_PARTS]
        for name in files:
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            private = path.with_name(f".{name}.copy")
            shutil.copy2(path, private)
            os.chown(private, path.stat().st_uid, path.stat().st_gid)
            private.replace(path)


def _cp(*args: str) -> None:
    result = subprocess.run(["cp", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LocalPlaneError(f"cp {' '.join(args)}: {result.stderr.strip()}")


def _same_filesystem(first: Path, second: Path) -> bool:
    return first.stat().st_dev == second.stat().st_dev
