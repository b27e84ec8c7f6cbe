"""The cluster secret: how long it must be, and the file a compose cluster shares it in.

The raft port carries pickled objects; only the secret (HMAC and encryption) keeps a
stranger from running code through it. So the agent refuses a short secret and the
placeholder of ``.env.example``, and a compose cluster started with no ``.env`` gets a
random one: ``python -m api.secretfile PATH`` (its ``secret`` service) writes it once
into a volume the nodes share, and each node reads it with ``--secret-file PATH``.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

__all__ = ["MIN_SECRET_BYTES", "PLACEHOLDER", "check_secret", "ensure_secret_file", "read_secret_file"]

MIN_SECRET_BYTES = 32
PLACEHOLDER = "replace-me-with-the-output-of-the-command-above"
"""``RAFTCRON_SECRET`` in ``.env.example``: ``cp .env.example .env`` must not give a cluster."""


def check_secret(secret: str, source: str) -> None:
    """``ValueError`` naming ``source`` when ``secret`` is too weak to guard the raft port."""
    if secret.strip() == PLACEHOLDER:
        raise ValueError(
            f"{source} is the placeholder from .env.example: generate a secret with "
            "python3 -c 'import secrets;print(secrets.token_hex(32))'"
        )
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{source} is {len(secret.encode('utf-8'))} bytes, at least {MIN_SECRET_BYTES} are required: "
            "generate one with python3 -c 'import secrets;print(secrets.token_hex(32))'"
        )


def read_secret_file(path: Path) -> str:
    """The secret in ``path`` (surrounding whitespace dropped); ``ValueError`` if unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--secret-file {str(path)!r}: cannot read it: {exc}") from exc
    secret = text.strip()
    check_secret(secret, f"the secret in {str(path)!r}")
    return secret


def ensure_secret_file(path: Path) -> bool:
    """Write a random secret to ``path`` unless a file is there; True if this call wrote it.

    Several nodes may run this at once against a shared volume: the secret is written to
    a private temporary file and hard-linked into place, which fails if the name exists,
    so exactly one secret is ever published and nobody reads a half-written file.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists():
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m api.secretfile PATH", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        wrote = ensure_secret_file(path)
        read_secret_file(path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'generated a new cluster secret in' if wrote else 'keeping the cluster secret in'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
