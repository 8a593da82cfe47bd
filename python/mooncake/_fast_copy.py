"""Gathering copies for the structured-object layer.

``concat_arrays_into(arrays, dest_ptr, dest_size, start=0, count=-1,
nthreads=1)`` copies ``arrays[start:start + count]`` (C-contiguous NumPy
arrays or other buffers) back to back to the address ``dest_ptr`` and
returns the number of bytes copied. The copy runs in Rust with the GIL
released, split between ``nthreads`` threads by bytes. Unlike the
reference it checks the destination: an address that is not
``dest_size`` writable bytes of this process, or one that overlaps a
source, raises ``ValueError`` instead of crashing.
"""

from ._mooncake import concat_arrays_into

__all__ = ["concat_arrays_into"]
