"""``TypeAlias`` on every supported Python (3.9 has it in typing_extensions)."""

import sys

if sys.version_info >= (3, 10):
    from typing import TypeAlias
else:  # pragma: no cover - 3.9 only
    from typing_extensions import TypeAlias

__all__ = ["TypeAlias"]
