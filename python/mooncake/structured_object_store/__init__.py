"""``mooncake.structured_object_store``: structured objects and DataProto
batches in a Mooncake store.

A structured object is JSON metadata plus named members (arrays, tensors,
bytes), stored as a *bundle*: one store object per member chunk and a JSON
manifest naming them (:mod:`._bundle`). :class:`MooncakeBundleTransfer`
writes them (``put_structured_object``, ``put_object``, ``put_bundle``) and
reads them whole or in part through read specs (member selection, row
slices; :mod:`._structured`). On top of that, a DataProto batch (``batch``,
``non_tensor_batch``, ``meta_info``) is stored one *stage* at a time
(``put`` / ``put_dataproto``, ``append_dataproto_fields``) and read back by
field and row (``get`` / ``get_dataproto``); its ref travels between
processes as a JSON handle (:mod:`mooncake.dataproto_ref`).

Column structure inference for object columns is in :mod:`._inference`;
the column codecs in :mod:`._codecs`.
"""

from __future__ import annotations

from ..dataproto_ref import (
    DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    export_dataproto_ref,
    export_ref,
    import_dataproto_ref,
    import_ref,
    is_dataproto_ref_handle,
)
# Private names the reference's module has too: its tests (and callers that
# followed them) reach or replace them on the package.
try:
    from .._fast_copy import concat_arrays_into as _concat_arrays_into
except Exception:  # the extension is missing in a source checkout
    _concat_arrays_into = None

from ._bundle import decode_json as _decode_json
from ._codecs import _decode_msgpack_ragged_values, _encode_msgpack_ragged_values  # noqa: F401
from ._codecs import encode_with_schema as _encode_with_schema  # noqa: F401
from ._inference import (  # noqa: F401
    MAX_DEPTH,
    MISSING,
    LeafDecision,
    LeafPlan,
    StructureNode,
    _choose_leaf_codec,
    _escape_key,
    infer_structure,
)
from ._tensors import has_tensor_codec_helpers as _has_tensor_codec_helpers  # noqa: F401
from ._transport import config_for_keys as _config_for_grouped_keys  # noqa: F401
from ._typed import (  # noqa: F401
    _decode_typed_ragged_values,
    _encode_typed_ragged_regular_ndarray_rows,
    _encode_typed_ragged_values,
)
from ._transfer import MooncakeBundleTransfer
from ._types import (  # noqa: F401
    AUTO_PARALLEL_MIN_BYTES,
    AUTO_PARALLEL_MIN_CHUNKS,
    DEFAULT_BUNDLE_CHUNK_BYTES,
    MISSING_OBJECT_ERROR,
    STRUCTURED_FIELD_SPECS_KEY,
    BundleTransferPolicy,
    FieldSchema,
    StructuredMemberSlice,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    _DirectCopyPayload,
    _MultiBufferPayload,
    _PoolBackedNdarray,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
    _TensorPayload,
    raw_destination,
    tensor_object_buffer,
)



def _decode_manifest(payload: bytes) -> dict:
    return _decode_json(payload, "bundle manifest")


__all__ = [
    "AUTO_PARALLEL_MIN_BYTES",
    "AUTO_PARALLEL_MIN_CHUNKS",
    "BundleTransferPolicy",
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "DEFAULT_BUNDLE_CHUNK_BYTES",
    "FieldSchema",
    "LeafDecision",
    "LeafPlan",
    "MAX_DEPTH",
    "MISSING",
    "MISSING_OBJECT_ERROR",
    "MooncakeBundleTransfer",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "STRUCTURED_FIELD_SPECS_KEY",
    "StructureNode",
    "StructuredFieldLocation",
    "StructuredMemberSlice",
    "StructuredObjectPayload",
    "StructuredObjectReadSpec",
    "StructuredObjectResult",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "infer_structure",
    "is_dataproto_ref_handle",
    "raw_destination",
    "tensor_object_buffer",
]
