"""The local cluster's images: the pause image's archive is `docker save`'s layout, and
a build is skipped exactly when nothing it is built from changed."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from cellplane_operator.errors import ImageBuildError
from cellplane_operator.localplane.images import (
    context_files,
    etcd_reference,
    inputs_digest,
    write_single_file_archive,
)

REPO = Path(__file__).resolve().parents[2]


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()  # type: ignore[union-attr]
                if m.isfile()}


def test_the_pause_archive_is_a_docker_save_of_one_executable(tmp_path: Path) -> None:
    program = tmp_path / "pause"
    program.write_bytes(b"\x7fELF static pause")
    archive = tmp_path / "pause.tar"
    write_single_file_archive(archive, reference="localhost/cellplane/pause:1.0",
                              program=program, path_in_image="/pause", user="65535:65535")
    members = _members(archive)
    [manifest] = json.loads(members["manifest.json"])
    assert manifest["RepoTags"] == ["localhost/cellplane/pause:1.0"]
    config_bytes = members[manifest["Config"]]
    assert manifest["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    config = json.loads(config_bytes)
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert (config["os"], config["architecture"], config["config"]["User"]) == \
        ("linux", "amd64", "65535:65535")
    [layer_name] = manifest["Layers"]
    layer = members[layer_name]
    # The diff_id is the uncompressed layer's digest, which is how containerd checks it.
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        [entry] = tar.getmembers()
        assert (entry.name, entry.mode, entry.uid) == ("pause", 0o755, 0)
        assert tar.extractfile(entry).read() == b"\x7fELF static pause"  # type: ignore[union-attr]


def test_the_same_program_gives_the_same_archive(tmp_path: Path) -> None:
    program = tmp_path / "pause"
    program.write_bytes(b"pause")
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    for archive in (first, second):
        write_single_file_archive(archive, reference="r:1", program=program,
                                  path_in_image="/pause", user="65535")
    assert first.read_bytes() == second.read_bytes()


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    (source / "pkg" / "__pycache__").mkdir(parents=True)
    (source / "pkg" / "core.py").write_text("x = 1\n")
    (source / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (source / "pkg" / "stale.pyc").write_bytes(b"\0")
    (source / "pyproject.toml").write_text("[project]\n")
    (source / "notes.md").write_text("not in the image\n")
    (source / ".dockerignore").write_text(
        "*\n!pyproject.toml\n!pkg/\n**/__pycache__\n**/*.pyc\n")
    return source


def test_the_build_context_is_what_dockerignore_lets_in(tmp_path: Path) -> None:
    source = _source(tmp_path)
    assert [p.relative_to(source).as_posix() for p in context_files(source)] == \
        ["pkg/core.py", "pyproject.toml"]


def test_a_python_change_changes_the_inputs_and_bytecode_does_not(tmp_path: Path) -> None:
    source = _source(tmp_path)
    before = inputs_digest(source, context_files(source), "base-id")
    (source / "pkg" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\1")
    (source / "notes.md").write_text("edited\n")
    assert inputs_digest(source, context_files(source), "base-id") == before
    (source / "pkg" / "core.py").write_text("x = 2\n")
    assert inputs_digest(source, context_files(source), "base-id") != before
    assert inputs_digest(source, context_files(source), "another-base") != \
        inputs_digest(source, context_files(source), "base-id")


def test_a_dockerignore_pattern_the_hash_cannot_follow_is_refused(tmp_path: Path) -> None:
    source = _source(tmp_path)
    (source / ".dockerignore").write_text("*\n!pkg/\ndocs\n")
    with pytest.raises(ImageBuildError, match="docs"):
        context_files(source)


def test_the_etcd_image_is_tagged_with_the_pinned_etcd() -> None:
    pinned = dict(line.split("=", 1) for line in (REPO / "hack" / "versions.env").read_text()
                  .splitlines() if line and not line.startswith("#"))["ETCD_VERSION"]
    assert etcd_reference(REPO) == f"localhost/cellplane/etcd:{pinned}"
