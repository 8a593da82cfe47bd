"""Bundles: named payloads under one JSON manifest in the store.

A bundle with object id ``<partition>/<uuid>`` keeps its metadata at
``<prefix>/<id>/meta``, each member at ``<prefix>/<id>/buffer/<name>`` (cut
into ``.../<i>`` chunks) and the manifest at ``<prefix>/<id>/manifest``::

    {"version": 1, "layout": "bundle", "object_id": "<partition>/<uuid>",
     "meta": PAYLOAD, "buffers": {name: PAYLOAD},
     "buffer_object_ids": [...], "cleanup_keys": [...]}   # the last two optional
    PAYLOAD = {"key": str, "bytes": int, "kind": "tensor",  # kind: written by the tensor calls
               "chunks": [{"key": str, "bytes": int}, ...]}  # one chunk: its key is "key"

A manifest that does not follow this (or names keys outside the transfer's
prefix) is refused, so a tampered manifest cannot make a reader touch or a
cleanup remove other objects.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..dataproto_ref import RemoteBundleRef
from ._transport import Transport, address, call_write, check_status, gather_into, has, split
from ._types import (
    BundleTransferPolicy,
    _DirectCopyPayload,
    _MultiBufferPayload,
    _TensorObjectBufferPayload,
    _TensorPayload,
)
from . import _tensors


def normalize_key_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise ValueError("bundle key_prefix must be a non-empty string")
    prefix = prefix.rstrip("/")
    for part in prefix.split("/"):
        validate_key_segment(part, "key_prefix")
    return prefix


def validate_key_segment(value: Any, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"bundle {name} must be a non-empty string")
    if "/" in value or value in (".", ".."):
        raise ValueError(f"bundle {name} must not contain '/' or be '.'/'..': {value!r}")
    if any(ord(c) < 32 for c in value):
        raise ValueError(f"bundle {name} must not contain control characters: {value!r}")


def validate_chunk_bytes(chunk_bytes: Any) -> int:
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    return int(chunk_bytes)


def validate_policy(policy: Optional[BundleTransferPolicy], max_inflight_put: Optional[int]) -> BundleTransferPolicy:
    policy = BundleTransferPolicy() if policy is None else policy
    if not isinstance(policy, BundleTransferPolicy):
        raise TypeError("policy must be a BundleTransferPolicy")
    if max_inflight_put is not None:
        policy = BundleTransferPolicy(max_inflight_put, policy.put_mode, policy.copy_mode)
    inflight = policy.max_inflight_put
    if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight <= 0:
        raise ValueError("max_inflight_put must be a positive integer")
    if policy.put_mode not in ("auto", "batch", "parallel"):
        raise ValueError(f"unsupported put_mode: {policy.put_mode!r}")
    if policy.copy_mode not in ("auto", "zero_copy", "copy"):
        raise ValueError(f"unsupported copy_mode: {policy.copy_mode!r}")
    return policy


def bytes_view(value: Any, name: str) -> memoryview:
    if isinstance(value, np.ndarray):
        return memoryview(np.ascontiguousarray(value)).cast("B")
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"bundle buffer {name} must be bytes-like, got {type(value).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _json_default(value: Any) -> Any:
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_json(value: Mapping[str, Any], label: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), default=_json_default).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{label} must be JSON-serializable: {exc}") from exc


def decode_json(payload: Any, label: str) -> dict[str, Any]:
    try:
        value = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{label} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{label} must be a JSON object")
    return value


class BundleStore:
    """Writes, reads and removes bundles under one key prefix."""

    def __init__(self, transport: Transport, key_prefix: str, default_chunk_bytes: int) -> None:
        self.transport = transport
        self.store = transport.store
        self.prefix = key_prefix
        self.default_chunk_bytes = default_chunk_bytes

    # ---- writes ------------------------------------------------------------

    def put_bundle(self, meta: Any, buffers: Mapping[str, Any], partition: str,
                   chunk_bytes: Optional[int], policy: BundleTransferPolicy,
                   config: Any = None, cleanup_keys: Sequence[str] = (),
                   ready_buffers: Optional[Mapping[str, Any]] = None,
                   force_lineage: bool = False) -> RemoteBundleRef:
        """Stores ``meta`` and ``buffers``; ``ready_buffers`` are payload specs
        of members already in the store that the manifest also lists."""
        validate_key_segment(partition, "partition")
        chunk = validate_chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.prefix}/{object_id}"
        written: list[str] = []
        keys: list[str] = []
        views: list[memoryview] = []
        staged: list[Any] = []
        specs: dict[str, Any] = {}

        def plan(key: str, view: memoryview) -> dict[str, Any]:
            pieces = split(view, chunk)
            names = [key] if len(pieces) == 1 else [f"{key}/chunk/{i}" for i in range(len(pieces))]
            keys.extend(names)
            views.extend(pieces)
            chunk_specs = [{"key": k, "bytes": p.nbytes} for k, p in zip(names, pieces)]
            return {"key": key, "bytes": view.nbytes, "chunks": chunk_specs}

        try:
            meta_spec = plan(f"{base}/meta", bytes_view(meta, "meta"))
            for name, value in buffers.items():
                validate_key_segment(name, "buffer name")
                key = f"{base}/buffer/{name}"
                if isinstance(value, (_TensorPayload, _TensorObjectBufferPayload)):
                    spec = _tensors.put_tensor_payload(self.transport, key, value, policy, config)
                    if spec is not None:
                        written.extend(c["key"] for c in spec["chunks"])
                        specs[name] = spec
                        continue
                    tensor_value = value
                    value, header = _tensors.tensor_bytes(value)
                    if value is None:
                        # No store tensor encoding here: torch.save bytes.
                        view = memoryview(_tensors.torch_save_bytes(tensor_value.tensor))
                        specs[name] = dict(plan(key, view), format="torch_save")
                        continue
                    if header:
                        # The store's own tensor encoding (header, then data):
                        # the object reads back with get_tensor too.
                        view = bytes_view(np.concatenate([np.frombuffer(header, np.uint8), value]), name)
                        specs[name] = dict(plan(key, view), data_offset=len(header))
                        continue
                if isinstance(value, (_MultiBufferPayload, _DirectCopyPayload)) and self._streams(policy):
                    spec, done = self._put_gathered(key, value, chunk, policy, config)
                    written.extend(done)
                    specs[name] = spec
                    continue
                if isinstance(value, (_MultiBufferPayload, _DirectCopyPayload)):
                    if policy.copy_mode == "zero_copy":
                        raise RuntimeError("zero-copy put requires tensor-object buffers")
                    parts = value.buffers if isinstance(value, _MultiBufferPayload) else value.arrays
                    if len(parts) == 1 and isinstance(value, _MultiBufferPayload):
                        view = bytes_view(parts[0], name)
                    else:
                        joined = np.empty(value.nbytes, dtype=np.uint8)
                        gather_into(list(parts), address(joined))
                        staged.append(joined)
                        view = memoryview(joined)
                else:
                    view = bytes_view(value, name)
                specs[name] = plan(key, view)
            if ready_buffers:
                specs.update(ready_buffers)
            # The metadata is small: always a plain copy, whatever the policy.
            meta_count = len(meta_spec["chunks"])
            copy = BundleTransferPolicy(policy.max_inflight_put, policy.put_mode, "copy")
            self.transport.put_chunks(keys[:meta_count], views[:meta_count], copy, config)
            written.extend(keys[:meta_count])
            self.transport.put_chunks(keys[meta_count:], views[meta_count:], policy, config)
            written.extend(keys[meta_count:])
            manifest: dict[str, Any] = {"version": 1, "layout": "bundle", "object_id": object_id,
                                        "meta": meta_spec, "buffers": specs}
            cleanup = list(dict.fromkeys(cleanup_keys))
            if ready_buffers or cleanup or force_lineage:
                ids = {self._object_id(s["key"]) for s in specs.values()}
                ids.update(self._object_id(k) for k in cleanup)
                manifest["buffer_object_ids"] = sorted(i for i in ids if i)
            if cleanup:
                manifest["cleanup_keys"] = cleanup
            self.validate_manifest(manifest)
            manifest_key = f"{base}/manifest"
            check_status(call_write(self.store.put, manifest_key, encode_json(manifest, "bundle manifest"),
                                    config=config), "put", manifest_key)
            written.append(manifest_key)
        except BaseException:
            try:
                self.transport.remove_keys(written + keys, strict=False)
            except Exception:
                pass  # the put's own error is the one to report
            raise
        return RemoteBundleRef(manifest_key=manifest_key, manifest=manifest)

    def _streams(self, policy: BundleTransferPolicy) -> bool:
        """Whether gathered payloads go chunk by chunk through pool leases."""
        return (self.transport.pool is not None and policy.copy_mode == "auto"
                and has(self.store, "batch_put_from"))

    def _put_gathered(self, key: str, value: Any, chunk: int, policy: BundleTransferPolicy,
                      config: Any = None) -> tuple[dict[str, Any], list[str]]:
        """A payload of several buffers, each chunk gathered into a lease."""
        parts = value.buffers if isinstance(value, _MultiBufferPayload) else value.arrays
        flat = [np.frombuffer(memoryview(np.ascontiguousarray(p) if isinstance(p, np.ndarray) else p)
                              .cast("B"), dtype=np.uint8) for p in parts]
        total = sum(f.nbytes for f in flat)
        if total == 0:
            return {"key": key, "bytes": 0, "chunks": []}, []
        bounds = list(range(0, total, chunk))
        names = [key] if len(bounds) == 1 else [f"{key}/chunk/{i}" for i in range(len(bounds))]
        pieces, at, index, offset = [], 0, 0, 0
        for start in bounds:
            end = min(start + chunk, total)
            group = []
            while at < end:
                f = flat[index]
                take = min(f.nbytes - offset, end - at)
                group.append(f[offset: offset + take])
                at, offset = at + take, offset + take
                if offset == f.nbytes:
                    index, offset = index + 1, 0
            pieces.append(group)
        self.transport.put_gathered(names, pieces, policy, config)
        spec = {"key": key, "bytes": total,
                "chunks": [{"key": n, "bytes": sum(p.nbytes for p in g)} for n, g in zip(names, pieces)]}
        return spec, names

    def _put_direct_copy_payload(self, key: str, value: Any, chunk_bytes: int,
                                 transfer_policy: BundleTransferPolicy, config: Any = None):
        return self._put_gathered(key, value, chunk_bytes, transfer_policy, config)

    def put_bundle_manifest(self, meta: Any, buffers: Mapping[str, Any], *, partition: str,
                            chunk_bytes: Optional[int], policy: Optional[BundleTransferPolicy],
                            cleanup_keys: Optional[Sequence[str]] = None, config: Any = None) -> RemoteBundleRef:
        """A new bundle over payloads already in the store (``buffers``:
        their specs), removing ``cleanup_keys`` along with it."""
        from ._bundle import validate_policy as _policy
        return self.put_bundle(meta, {}, partition, chunk_bytes, _policy(policy, None), config=config,
                               cleanup_keys=list(cleanup_keys or []), ready_buffers=dict(buffers),
                               force_lineage=True)

    def payload_keys(self, spec: Mapping[str, Any]) -> list[str]:
        return [c["key"] for c in spec["chunks"]]

    def _object_id(self, key: str) -> Optional[str]:
        rest = key[len(self.prefix) + 1:] if key.startswith(self.prefix + "/") else ""
        parts = rest.split("/")
        return "/".join(parts[:2]) if len(parts) >= 3 else None

    # ---- manifests ---------------------------------------------------------

    def resolve_manifest(self, ref: Any) -> dict[str, Any]:
        if isinstance(ref, RemoteBundleRef):
            manifest = ref.manifest or self._fetch(ref.manifest_key)
        elif isinstance(ref, Mapping):
            manifest = ref.get("manifest")
            if manifest is None:
                key = ref.get("manifest_key")
                if not isinstance(key, str):
                    raise ValueError("bundle ref must include manifest_key")
                manifest = self._fetch(key)
        else:
            raise TypeError(f"expected a RemoteBundleRef or mapping, got {type(ref).__name__}")
        self.validate_manifest(manifest)
        self.manifest_key(ref, manifest)
        return manifest

    def manifest_key(self, ref: Any, manifest: Mapping[str, Any]) -> str:
        expected = f"{self.prefix}/{manifest['object_id']}/manifest"
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        if key is not None and key != expected:
            raise ValueError(f"bundle manifest_key {key!r} does not match its manifest ({expected!r})")
        return expected

    def _fetch(self, key: str) -> dict[str, Any]:
        data = self.store.get(key)
        if data is None or len(data) == 0:
            raise KeyError(f"bundle manifest {key} not found")
        return decode_json(data, "bundle manifest")

    def _check_key(self, key: Any, what: str, base: Optional[str] = None, lineage: frozenset = frozenset()) -> None:
        if not isinstance(key, str) or not key.startswith(self.prefix + "/"):
            raise ValueError(f"bundle manifest {what} key {key!r} is outside namespace {self.prefix!r}")
        if base is not None and not key.startswith(base + "/"):
            # A payload lives under its own bundle, or under another bundle
            # the manifest names as one it took members over from.
            if self._object_id(key) not in lineage:
                raise ValueError(f"bundle manifest {what} key {key!r} is outside the bundle namespace {base!r}")

    def validate_manifest(self, manifest: Any) -> None:
        if not isinstance(manifest, Mapping):
            raise ValueError("bundle manifest must be a mapping")
        if manifest.get("version") != 1 or manifest.get("layout") != "bundle":
            raise ValueError("unsupported bundle manifest version or layout")
        if not isinstance(manifest.get("object_id"), str):
            raise ValueError("bundle manifest object_id must be a string")
        buffers = manifest.get("buffers")
        if not isinstance(buffers, Mapping):
            raise ValueError("bundle manifest buffers must be a mapping")
        lineage = manifest.get("buffer_object_ids", [])
        if not isinstance(lineage, list) or not all(isinstance(i, str) for i in lineage):
            raise ValueError("bundle manifest buffer_object_ids must be a list of strings")
        lineage = frozenset({manifest["object_id"], *lineage})
        base = f"{self.prefix}/{manifest['object_id']}"
        for name, spec in [("meta", manifest.get("meta")), *buffers.items()]:
            self._validate_payload(name, spec, base, lineage)
        cleanup = manifest.get("cleanup_keys", [])
        if not isinstance(cleanup, list):
            raise ValueError("bundle manifest cleanup_keys must be a list")
        for key in cleanup:
            if not isinstance(key, str) or self._object_id(key) not in lineage:
                raise ValueError(f"bundle manifest cleanup_keys entry {key!r} is outside the bundle's lineage")

    def _validate_payload(self, name: str, spec: Any, base: str, lineage: frozenset) -> None:
        if not isinstance(spec, Mapping) or not isinstance(spec.get("chunks"), list):
            raise ValueError(f"bundle manifest payload {name} is malformed")
        self._check_key(spec.get("key"), f"payload {name}", base, lineage)
        total = 0
        for chunk in spec["chunks"]:
            if not isinstance(chunk, Mapping):
                raise ValueError(f"bundle manifest payload {name} has a malformed chunk")
            self._check_key(chunk.get("key"), f"payload {name} chunk", base, lineage)
            size = chunk.get("bytes")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"bundle manifest payload {name} has a bad chunk size")
            total += size
        size = spec.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or (
                "kind" not in spec and size != total):
            raise ValueError(f"bundle manifest payload {name} size does not match its chunks")

    # ---- removal -----------------------------------------------------------

    def remove_bundle(self, ref: Any) -> None:
        manifest = self.resolve_manifest(ref)
        keys = [c["key"] for c in manifest["meta"]["chunks"]]
        for spec in manifest["buffers"].values():
            keys.extend(c["key"] for c in spec["chunks"])
        keys.extend(manifest.get("cleanup_keys", []))
        keys.append(self.manifest_key(ref, manifest))
        self.transport.remove_keys(keys, strict=True)

    def read_meta(self, manifest: Mapping[str, Any]) -> bytes:
        return self.transport.read_bytes(manifest["meta"])

