"""``mooncake.async_store``: the store for asyncio code.

:class:`MooncakeDistributedStoreAsync` is a :class:`~mooncake.store.MooncakeDistributedStore`
whose every method ``name`` also has a coroutine twin ``async_name``: it runs
``name`` with the same arguments in the running loop's default executor and
returns its result (or raises its exception) when awaited, so calls from
several tasks overlap instead of blocking the loop::

    store = MooncakeDistributedStoreAsync()
    store.setup(...)
    await store.async_put("k", b"v")
    values = await asyncio.gather(*(store.async_get(k) for k in keys))

The synchronous methods stay available unchanged. A twin exists for any
callable attribute, including ones a subclass adds; ``async_name`` for a
missing or non-callable ``name`` raises ``AttributeError``.
"""

from __future__ import annotations

import asyncio
import functools

from .store import MooncakeDistributedStore

_PREFIX = "async_"


def _coroutine_twin(name: str, sync):
    """An ``async def`` method that runs ``self.<name>`` in the loop's default
    executor; ``sync`` lends its name and docstring."""

    @functools.wraps(sync)
    async def twin(self, *args, **kwargs):
        call = functools.partial(getattr(self, name), *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    twin.__name__ = twin.__qualname__ = _PREFIX + name
    return twin


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """A store whose methods also come as ``async_*`` coroutines that run the
    blocking call in an executor."""

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails: the class-level twins below
        # cover the store's own methods; this covers the rest (methods of a
        # subclass, attributes set on the instance).
        if not name.startswith(_PREFIX):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        sync_name = name[len(_PREFIX):]
        try:
            sync = getattr(self, sync_name)
        except AttributeError:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}' (nor '{sync_name}')"
            ) from None
        if not callable(sync):
            raise AttributeError(f"'{sync_name}' is not callable")
        bound = _coroutine_twin(sync_name, sync).__get__(self, type(self))
        # Cached on the instance, as the next lookup will not reach here.
        setattr(self, name, bound)
        return bound


# The store's public methods get their twins up front, so that they show in
# dir() and help() and need no per-instance lookup.
for _name in dir(MooncakeDistributedStore):
    _attr = getattr(MooncakeDistributedStore, _name)
    if not _name.startswith("_") and callable(_attr):
        setattr(MooncakeDistributedStoreAsync, _PREFIX + _name, _coroutine_twin(_name, _attr))
del _name, _attr

__all__ = ["MooncakeDistributedStoreAsync"]
