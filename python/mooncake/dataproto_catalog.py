"""Which DataProto fragment holds each field of each logical row.

RL pipelines write a batch in pieces: the rollout publishes the prompts and
responses of some rows, the reward model later adds a score to the same
rows, in another order. Each piece is an immutable DataProto fragment (a
single-stage ref handle, see :mod:`mooncake.dataproto_ref`) whose row ``i``
belongs to ``keys[i]``. The catalog records, per partition and key, a tag
(free-form status the pipeline merges in) and, per field, the fragment and
row that hold it, so a reader can ask for any rows and fields and get back
the fragments to read and where in them (:meth:`DataProtoCatalog.resolve`).

It keeps metadata only: the bytes stay in the store and their lifetime with
whoever wrote them. A fragment is kept while some field of some key points
at it and forgotten when the last one moves elsewhere or is removed. Calls
on one catalog must be serialized by its owner. Every call validates all of
its arguments before it changes anything, so a refused call leaves the
catalog as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["DataProtoCatalog"]

Location = tuple[str, int]  # (fragment id = manifest key, row in the fragment)


@dataclass
class _Entry:
    tag: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Location] = field(default_factory=dict)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    return value


def _names(values: Any, what: str) -> tuple[str, ...]:
    """A non-empty sequence of unique non-empty strings (a lone string is
    refused: it is a sequence of characters, never what a caller meant)."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of non-empty strings")
    try:
        names = tuple(values)
    except TypeError:
        raise ValueError(f"{what} must be a sequence of non-empty strings") from None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must be non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be unique")
    return names


def _tags(tags: Optional[Sequence[Mapping[str, Any]]], count: int) -> Optional[list[dict]]:
    if tags is None:
        return None
    if len(tags) != count:
        raise ValueError("tags must have the same length as keys")
    if not all(isinstance(t, Mapping) for t in tags):
        raise TypeError("tags must be mappings")
    return [copy.deepcopy(dict(t)) for t in tags]


def _fragment(handle: Mapping[str, Any], rows: int) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """(fragment id, normalized handle, field names) of a single-stage handle
    whose batch has one row per key."""
    from .dataproto_ref import export_dataproto_ref, import_dataproto_ref

    ref = import_dataproto_ref(handle)
    if ref.batch_size != rows:
        raise ValueError(f"DataProto batch size {ref.batch_size!r} does not match {rows} logical keys")
    if len(ref.stage_refs) != 1:
        raise ValueError("catalog fragments must contain exactly one DataProto stage")
    (stage,) = ref.stage_refs.values()
    fragment_id = _text(stage.manifest_key, "manifest_key")
    fields = _names(ref.field_index, "field names")
    return fragment_id, export_dataproto_ref(ref), fields


class DataProtoCatalog:
    """Rows and fields of logical keys, mapped to immutable DataProto fragments."""

    def __init__(self) -> None:
        self._partitions: dict[str, dict[str, _Entry]] = {}
        self._handles: dict[str, dict[str, Any]] = {}
        self._uses: dict[str, int] = {}

    # ---- writes -----------------------------------------------------------

    def update(
        self,
        partition: str,
        keys: Sequence[str],
        *,
        tags: Optional[Sequence[Mapping[str, Any]]] = None,
        handle: Optional[Mapping[str, Any]] = None,
    ) -> dict[str, Any]:
        """Merges `tags[i]` into the tag of `keys[i]` and, with a `handle`,
        points every field of that fragment, for `keys[i]`, at its row `i`.
        Returns the keys, their merged tags and the union of their fields."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        new_tags = _tags(tags, len(keys))
        frag = _fragment(handle, len(keys)) if handle is not None else None
        if new_tags is None and frag is None:
            raise ValueError("catalog update requires tags or a DataProto handle")
        if frag is not None:
            known = self._handles.get(frag[0])
            if known is not None and known != frag[1]:
                raise ValueError(f"DataProto fragment id collision: {frag[0]!r}")

        entries = self._partitions.setdefault(partition, {})
        for row, key in enumerate(keys):
            entry = entries.setdefault(key, _Entry())
            if new_tags is not None:
                entry.tag.update(new_tags[row])
            if frag is not None:
                self._point(entry, frag[0], frag[1], frag[2], row)
        return {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": self._field_union(entries, keys),
        }

    def _point(self, entry: _Entry, fid: str, stored: dict, fields: tuple[str, ...], row: int) -> None:
        self._handles.setdefault(fid, stored)
        for name in fields:
            old = entry.fields.get(name)
            entry.fields[name] = (fid, row)
            if old is not None and old[0] == fid:
                continue  # same fragment, maybe another row: no new use
            self._uses[fid] = self._uses.get(fid, 0) + 1
            if old is not None:
                self._release(old[0])

    def remove(self, partition: str, keys: Sequence[str]) -> None:
        """Forgets `keys` (metadata only: the store keeps the bytes)."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        entries = self._partitions.get(partition)
        if entries is None:
            return
        for key in keys:
            entry = entries.pop(key, None)
            for fid, _row in (entry.fields.values() if entry else ()):
                self._release(fid)
        if not entries:
            del self._partitions[partition]

    def _release(self, fid: str) -> None:
        left = self._uses[fid] - 1
        if left:
            self._uses[fid] = left
        else:
            del self._uses[fid], self._handles[fid]

    # ---- reads ------------------------------------------------------------

    def resolve(
        self, partition: str, keys: Sequence[str], fields: Optional[Sequence[str]] = None
    ) -> dict[str, Any]:
        """Where to read `fields` (default: every field any of `keys` has) of
        `keys`, in that order: fields that share their locations row for
        row are grouped, with the handles of every fragment they name."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        entries = self._partitions.get(partition, {})
        missing = [k for k in keys if k not in entries]
        if missing:
            raise ValueError(f"keys were not found in partition {partition!r}: {missing}")
        wanted = list(_names(fields, "field names")) if fields is not None else self._field_union(entries, keys)
        if not wanted:
            raise ValueError("requested keys do not contain any fields")
        for k in keys:
            absent = [f for f in wanted if f not in entries[k].fields]
            if absent:
                raise ValueError(f"fields are not ready for key {k!r}: {absent}")

        groups: dict[tuple[Location, ...], list[str]] = {}
        for f in wanted:
            groups.setdefault(tuple(entries[k].fields[f] for k in keys), []).append(f)
        used = {fid for locs in groups for fid, _row in locs}
        return {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": wanted,
            "field_groups": [{"fields": fs, "locations": list(locs)} for locs, fs in groups.items()],
            "handles": {fid: copy.deepcopy(self._handles[fid]) for fid in used},
        }

    def list(self, partition: Optional[str] = None) -> dict[str, dict[str, Any]]:
        """Tags by partition and key (one partition, or all)."""
        if partition is not None:
            partition = _text(partition, "partition")
            names = [partition] if partition in self._partitions else []
        else:
            names = list(self._partitions)
        return {
            p: {k: copy.deepcopy(e.tag) for k, e in self._partitions[p].items()} for p in names
        }

    @staticmethod
    def _field_union(entries: Mapping[str, _Entry], keys: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(f for k in keys for f in entries[k].fields))
