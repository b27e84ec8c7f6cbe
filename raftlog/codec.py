"""The versioned msgpack envelope every byte we write goes through.

``{"v": 1, "t": tag, "d": {...}}``: ``v`` is the envelope version, ``t`` a
stable string tag naming the command or record, ``d`` its fields. Pickle is
never used for our own bytes. A reader meeting a newer version fails with a
message saying which versions it understands, so a mixed-version cluster
stops loudly instead of misreading entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = ["VERSION", "SUPPORTED_VERSIONS", "Envelope", "CodecError", "encode", "decode", "pack", "unpack"]

VERSION = 1
SUPPORTED_VERSIONS = (1,)


class CodecError(ValueError):
    """Bytes that are not a well-formed envelope of a version we understand."""


@dataclass(frozen=True, slots=True)
class Envelope:
    tag: str
    data: dict[str, Any]
    version: int = VERSION


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise CodecError(f"not valid msgpack: {exc}") from exc


def encode(tag: str, data: dict[str, Any], *, version: int = VERSION) -> bytes:
    return pack({"v": version, "t": tag, "d": data})


def decode(raw: bytes) -> Envelope:
    body = unpack(raw)
    if not isinstance(body, dict) or not {"v", "t", "d"} <= body.keys():
        raise CodecError("not an envelope: expected a map with keys v, t, d")
    version, tag, data = body["v"], body["t"], body["d"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise CodecError(f"envelope version must be an integer, got {version!r}")
    if version not in SUPPORTED_VERSIONS:
        understood = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise CodecError(
            f"envelope version {version} is not understood by this build (it reads version {understood}); "
            "upgrade this node"
        )
    if not isinstance(tag, str) or not isinstance(data, dict):
        raise CodecError("envelope tag must be a string and data a map")
    return Envelope(tag=tag, data=data, version=version)
