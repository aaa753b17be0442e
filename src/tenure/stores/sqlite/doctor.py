"""``tenure doctor`` for SQLite: where the file lives, and how durable its commits are.

SQLite's locking is not reliable on a network filesystem, and expiry uses each
host's own clock: one database file must serve the processes of one host.
``synchronous=normal`` may lose the last grants to a power loss.
"""

from __future__ import annotations

from pathlib import Path

from ..base import Finding

__all__ = ("NETWORK_FILESYSTEMS", "diagnose", "filesystem")

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "fuse.s3fs",
        "fuse.rclone",
        "virtiofs",
    }
)


def filesystem(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem that holds ``path`` (Linux: from /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = str(path.resolve())
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def diagnose(path: Path, synchronous: str) -> list[Finding]:
    """What the file's place and ``synchronous`` mean for the guarantees."""
    found = []
    kind = filesystem(path)
    if kind in NETWORK_FILESYSTEMS:
        found.append(
            Finding(
                "unsafe",
                f"{path} is on a network filesystem ({kind}): SQLite's locking is not "
                "reliable there, and expiry uses each host's own clock",
                "keep the database on a local disk of the one host whose processes share "
                "it; across hosts use Redis, PostgreSQL or etcd",
            )
        )
    else:
        found.append(Finding("ok", f"{path} is on a local filesystem ({kind or 'unknown'})"))
    if synchronous == "NORMAL":
        found.append(
            Finding(
                "warn",
                "synchronous=normal: a power loss can lose the last grants, and their fencing "
                "tokens can be handed out again (every holder on the host died with it)",
                "add ?synchronous=full when fenced resources live on other hosts",
            )
        )
    return found
