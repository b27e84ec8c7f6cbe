"""Reading the inputs of ``raftcron apply -f``.

A source is a file, a directory (every ``*.yaml``, ``*.yml`` and ``*.json`` directly in
it, sorted by name) or ``-`` for stdin. A file holds one or more YAML documents, or JSON;
a document is a job document, a list of job documents, a ``{"items": [...]}`` list, or a
job resource as printed by ``raftcron get jobs NAME -o json|yaml`` (its ``spec`` is
applied), so the output of ``get`` can be edited and applied back.

YAML is read with YAML 1.2 scalars for booleans and timestamps: ``on:`` (in ``alerts`` and
``depends_on``) stays the key ``"on"`` instead of PyYAML's 1.1 ``True``, ``yes``/``no``
stay strings, and ``starts_at: 2026-01-01T00:00:00Z`` stays the string the user wrote.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

__all__ = ["Document", "ManifestError", "parse_text", "read_source", "read_sources"]

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_RESOURCE_KEYS = {"name", "spec", "version", "created_at", "updated_at", "status", "change"}


@dataclass(frozen=True, slots=True)
class Document:
    """One job document and where it came from (``jobs.yaml``, ``jobs.yaml#2``)."""

    source: str
    body: dict[str, Any]

    @property
    def name(self) -> str | None:
        name = self.body.get("name")
        return name if isinstance(name, str) and name else None


class ManifestError(Exception):
    """A source that cannot be read; ``str()`` is ``source[:line]: message``."""

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        self.source = source
        self.message = message
        self.line = line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and without timestamp conversion."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def read_sources(paths: Iterable[str], stdin: TextIO | None = None
                 ) -> tuple[list[Document], list[ManifestError]]:
    """Read every source; a bad file is reported and the other files are still read."""
    documents: list[Document] = []
    errors: list[ManifestError] = []
    for path in paths:
        try:
            files = _expand(path)
        except ManifestError as exc:
            errors.append(exc)
            continue
        for file in files:
            try:
                documents.extend(read_source(file, stdin))
            except ManifestError as exc:
                errors.append(exc)
    return documents, errors


def read_source(path: str, stdin: TextIO | None = None) -> list[Document]:
    """The documents of one file, directory or ``-``; raises ManifestError at the first bad one."""
    if path == "-":
        stream = stdin if stdin is not None else sys.stdin
        return parse_text(stream.read(), "<stdin>")
    documents: list[Document] = []
    for file in _expand(path):
        documents.extend(_read_file(Path(file)))
    return documents


def _expand(path: str) -> list[str]:
    """A directory as its manifest files, sorted; anything else as itself."""
    target = Path(path)
    if path == "-" or not target.is_dir():
        return [path]
    files = sorted(str(p) for p in target.iterdir()
                   if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES)
    if not files:
        raise ManifestError(path, "no *.yaml, *.yml or *.json files in this directory")
    return files


def _read_file(path: Path) -> list[Document]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ManifestError(str(path), f"cannot read: {reason}") from exc
    as_json = path.suffix.lower() == ".json"
    return parse_text(text, str(path), as_json=as_json)


def parse_text(text: str, source: str, *, as_json: bool = False) -> list[Document]:
    """Split one text into job documents; YAML (which reads JSON too) unless ``as_json``."""
    raw = _load_json(text, source) if as_json else _load_yaml(text, source)
    bodies: list[tuple[int, Any]] = []
    for number, value in enumerate(raw, start=1):
        bodies.extend((number, body) for body in _flatten(value))
    many = len(bodies) > 1
    documents = []
    for position, (number, body) in enumerate(bodies, start=1):
        label = f"{source}#{position}" if many else source
        if not isinstance(body, dict):
            raise ManifestError(source, f"document {number}: expected a mapping (a job), "
                                        f"got {_type_name(body)}")
        documents.append(Document(label, _unwrap_resource(body)))
    return documents


def _load_json(text: str, source: str) -> list[Any]:
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as exc:
        raise ManifestError(source, f"invalid JSON: {exc.msg} (column {exc.colno})",
                            exc.lineno) from exc


def _load_yaml(text: str, source: str) -> list[Any]:
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "cannot parse"
        raise ManifestError(source, f"invalid YAML: {problem}", line) from exc
    except yaml.YAMLError as exc:
        raise ManifestError(source, f"invalid YAML: {exc}") from exc


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and set(value) == {"items"} and isinstance(value["items"], list):
        return list(value["items"])
    return [value]


def _unwrap_resource(body: dict[str, Any]) -> dict[str, Any]:
    """A job resource (``get -o json``) is applied as its spec; a job document as is."""
    spec = body.get("spec")
    if isinstance(spec, dict) and "name" in body and set(body) <= _RESOURCE_KEYS:
        return {**spec, "name": body["name"]}
    return body


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {str: "a string", list: "a list", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
