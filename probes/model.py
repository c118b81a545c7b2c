"""Model probe: the model directory's files and sizes, its download record, and its JSON configs.

Called by reconcile.plan.prober. The download record `.reconcile-model.json` is written by
actions/model.py ({"repo", "revision", "commit", "files": {name: size}}); this only reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from types import MappingProxyType

from probes.common import Absent, Invalid
from reconcile.record import Record
from reconcile.safety.names import name_problem
from reconcile.safety.untrusted import JSON_LIMIT, NotRegular, TooLarge, load_json, read_regular, walk_tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from reconcile.spec.models import Spec

RECORD_NAME = ".reconcile-model.json"
SEAL_NAME = ".reconcile-realization.json"  # reconcile.apply.model_store.SEAL
SKIP_DIRS = frozenset({".cache"})  # huggingface_hub's local-dir bookkeeping, not model files


class JsonDoc(Record):
    """A JSON file that parsed; `data` is its top-level object."""

    path: str
    data: Mapping[str, Any]


class DownloadRecord(Record):
    repo: str | None
    revision: str
    commit: str | None  # None for a copy of a local source
    files: Mapping[str, int]
    source: str | None = None  # the local directory the files were copied from
    source_files: Mapping[str, Any] = MappingProxyType({})  # name -> stamp + sha256 at copy


class ModelObservation(Record):
    dir: str
    files: Mapping[str, int]  # relative path -> size in bytes (symlinks followed), .cache/ skipped
    broken_links: tuple[str, ...]  # relative paths of symlinks whose target is gone
    record: DownloadRecord | Absent | Invalid
    config: JsonDoc | Absent | Invalid  # config.json
    config_backup: JsonDoc | Absent | Invalid  # config.json.bak
    quant_config: JsonDoc | Absent | Invalid  # hf_quant_config.json
    required: Mapping[str, bool]  # the spec's required_files -> present
    sealed: bool = False  # a store realization that converged (.reconcile-realization.json): never rewritten

    @property
    def missing_required(self) -> tuple[str, ...]:
        return tuple(name for name, present in self.required.items() if not present)


def probe(spec: Spec) -> ModelObservation | Absent | Invalid | None:
    if spec.model is None:
        return None
    return read_model_dir(spec.model.dir, spec.model.required_files)


def read_model_dir(path: str, required_files: list[str]) -> ModelObservation | Absent | Invalid:
    if not os.path.lexists(path):
        return Absent(path)
    if not os.path.isdir(path):
        return Invalid(path, f"{path} is not a directory")
    files, broken = list_files(path)
    return ModelObservation(
        dir=path,
        files=files,
        broken_links=broken,
        record=read_record(os.path.join(path, RECORD_NAME)),
        config=read_json(os.path.join(path, "config.json")),
        config_backup=read_json(os.path.join(path, "config.json.bak")),
        quant_config=read_json(os.path.join(path, "hf_quant_config.json")),
        required={name: os.path.isfile(os.path.join(path, name)) for name in required_files},
        sealed=SEAL_NAME in files,
    )


def list_files(root: str) -> tuple[dict[str, int], tuple[str, ...]]:
    files: dict[str, int] = {}
    broken: list[str] = []
    for directory, dirs, names in walk_tree(root):
        if directory == root:
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, root)
            try:
                files[rel] = os.stat(full).st_size
            except FileNotFoundError:
                broken.append(rel)
    return files, tuple(broken)


def read_json(path: str) -> JsonDoc | Absent | Invalid:
    """A JSON object file: parsed, absent, or invalid with the parser's message and the text."""
    try:  # as data: a FIFO in its place is named, never waited on; a bounded size
        text = read_regular(path, JSON_LIMIT, follow=True).decode("utf-8")
    except FileNotFoundError:
        return Absent(path)
    except (NotRegular, TooLarge) as exc:
        return Invalid(path, str(exc.strerror))
    except (OSError, UnicodeDecodeError) as exc:
        return Invalid(path, f"cannot read: {exc}")
    return parse_json_object(text, path)


def parse_json_object(text: str, path: str) -> JsonDoc | Invalid:
    try:
        data = load_json(text)
    except ValueError as exc:
        return Invalid(path, f"not valid JSON: {exc}", text)
    if not isinstance(data, dict):
        return Invalid(path, f"expected a JSON object, found {type(data).__name__}", text)
    return JsonDoc(path, data)


def read_record(path: str) -> DownloadRecord | Absent | Invalid:
    doc = read_json(path)
    if not isinstance(doc, JsonDoc):
        return doc
    return parse_record(doc)


def parse_record(doc: JsonDoc) -> DownloadRecord | Invalid:
    data = doc.data
    files = data.get("files")
    source = data.get("source")
    # A copy of a local source has no commit (and may have no revision).
    required = ("revision", "commit") if source is None else ()
    problems = [k for k in required if not isinstance(data.get(k), str)]
    if source is not None and not isinstance(source, str):
        problems.append("source")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in files.items()
    ):
        problems.append("files")
    if data.get("repo") is not None and not isinstance(data.get("repo"), str):
        problems.append("repo")
    if problems:
        message = f"download record has bad or missing {', '.join(problems)}"
        return Invalid(doc.path, message, json.dumps(data))
    for name in files:  # type: ignore[union-attr]  # checked above: a dict
        if (problem := name_problem(name)) is not None:
            message = f"download record lists {name!r}, which {problem} (reconcile never writes that)"
            return Invalid(doc.path, message, json.dumps(data))
    return DownloadRecord(
        data.get("repo"),
        str(data.get("revision") or ""),
        data.get("commit"),
        dict(files),  # type: ignore[arg-type]  # checked above: a dict of str -> int
        source,
        data["source_files"] if isinstance(data.get("source_files"), dict) else {},
    )
