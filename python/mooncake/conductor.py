"""A client of the Conductor KV indexer (``mooncake_conductor``), for routers.

The Conductor subscribes to the KV events of vLLM, SGLang and the Mooncake
master and answers, per instance, how much of a prompt's prefix each holds
and where (``GPU``, ``CPU``, ``DISK``, per data-parallel rank). See
``docs/conductor.md``.

    from mooncake.conductor import ConductorClient

    c = ConductorClient("http://127.0.0.1:13333")
    c.register(endpoint="tcp://10.0.0.5:5557", type="vLLM", modelname="qwen",
               instance_id="vllm-1", block_size=16, dp_rank=0)
    hits = c.query("qwen", token_ids, block_size=16)
    best = c.best_instance("qwen", token_ids, block_size=16)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterable, Optional

__all__ = ["ConductorClient", "ConductorError", "DEFAULT_URL", "DEFAULT_SEED", "seq_hashes"]

DEFAULT_URL = "http://127.0.0.1:13333"
DEFAULT_SEED = 1337


def seq_hashes(token_ids: Iterable[int], block_size: int, seed: int = DEFAULT_SEED) -> list:
    """The rolling hashes of a prompt's complete blocks under the hashing
    standard (XXH3-64 of each block's tokens as little-endian u32, rolled
    with the parent's hash; Dynamo's scheme): what ``query_by_hash`` takes
    and what a publisher of standard events (the master: an object key that
    is the decimal or ``0x`` hash) names a block by. Needs the ``xxhash``
    package."""
    try:
        import xxhash
    except ImportError:
        raise ImportError("seq_hashes needs the xxhash package (pip install xxhash)") from None
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    tokens = list(token_ids)
    bad = next((t for t in tokens if not 0 <= t <= 0xFFFFFFFF), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is not a u32")
    out: list = []
    for i in range(len(tokens) // block_size):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[i * block_size:(i + 1) * block_size])
        h = xxhash.xxh3_64_intdigest(block, seed=seed)
        if out:
            h = xxhash.xxh3_64_intdigest(out[-1].to_bytes(8, "little") + h.to_bytes(8, "little"), seed=seed)
        out.append(h)
    return out


class ConductorError(RuntimeError):
    """The Conductor refused a request (``status`` is its HTTP status) or
    could not be reached (``status`` is None)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class ConductorClient:
    """The Conductor's HTTP API, over the standard library only."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw).get("error", raw.decode(errors="replace"))
            except ValueError:
                msg = raw.decode(errors="replace")
            raise ConductorError(f"{method} {path}: {e.code}: {msg}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise ConductorError(f"{method} {path}: {e}") from None
        return json.loads(raw) if path != "/metrics" else raw.decode()

    def register(
        self,
        *,
        endpoint: str,
        type: str,
        modelname: str,
        instance_id: str,
        block_size: int,
        dp_rank: int = 0,
        replay_endpoint: Optional[str] = None,
        lora_name: Optional[str] = None,
        tenant_id: Optional[str] = None,
        additionalsalt: Optional[str] = None,
    ) -> dict:
        """Subscribes the Conductor to a publisher (``type``: ``vLLM``,
        ``SGLang`` or ``Mooncake``)."""
        return self._call(
            "POST",
            "/register",
            _drop_none(
                dict(
                    endpoint=endpoint,
                    replay_endpoint=replay_endpoint,
                    type=type,
                    modelname=modelname,
                    lora_name=lora_name,
                    tenant_id=tenant_id,
                    instance_id=instance_id,
                    block_size=block_size,
                    dp_rank=dp_rank,
                    additionalsalt=additionalsalt,
                )
            ),
        )

    def unregister(
        self,
        instance_id: str,
        *,
        tenant_id: Optional[str] = None,
        dp_rank: Optional[int] = None,
        type: Optional[str] = None,
    ) -> list:
        """Drops the instance's subscriptions (one rank's or type's when
        given) and their blocks; the names of those removed."""
        body = _drop_none(dict(instance_id=instance_id, tenant_id=tenant_id, dp_rank=dp_rank, type=type))
        return self._call("POST", "/unregister", body)["removed_instances"]

    def _query(self, path: str, model: str, block_size: int, key: str, values: list, **scope) -> dict:
        body = _drop_none(dict(model=model, block_size=block_size, **scope))
        body[key] = values
        tenant = scope.get("tenant_id") or "default"
        return self._call("POST", path, body).get(tenant, {})

    def query(
        self,
        model: str,
        token_ids: Iterable[int],
        block_size: int,
        *,
        lora_name: Optional[str] = None,
        lora_id: Optional[int] = None,
        tenant_id: Optional[str] = None,
        instance_id: Optional[str] = None,
        cache_salt: Optional[str] = None,
    ) -> dict:
        """Per instance of the tenant: ``{longest_matched, GPU, CPU, DISK,
        DP}``, in tokens."""
        return self._query(
            "/query", model, block_size, "token_ids", list(token_ids),
            lora_name=lora_name, lora_id=lora_id, tenant_id=tenant_id,
            instance_id=instance_id, cache_salt=cache_salt,
        )

    def query_by_hash(
        self,
        model: str,
        seq_hashes: Iterable[int],
        block_size: int,
        *,
        lora_name: Optional[str] = None,
        lora_id: Optional[int] = None,
        tenant_id: Optional[str] = None,
        instance_id: Optional[str] = None,
        cache_salt: Optional[str] = None,
    ) -> dict:
        """As ``query``, for the prompt's rolling block hashes (XXH3-64,
        seed 1337 by default: see ``docs/conductor.md``)."""
        return self._query(
            "/query_by_hash", model, block_size, "seq_hashes", list(seq_hashes),
            lora_name=lora_name, lora_id=lora_id, tenant_id=tenant_id,
            instance_id=instance_id, cache_salt=cache_salt,
        )

    def best_instance(
        self,
        model: str,
        token_ids: Iterable[int],
        block_size: int,
        candidates: Optional[Iterable[str]] = None,
        **scope,
    ) -> tuple:
        """``(instance_id, hit)`` of the instance with the longest match (ties:
        more on GPU, then CPU), among ``candidates`` when given; ``(None,
        None)`` when no instance is known."""
        hits = self.query(model, token_ids, block_size, **scope)
        allowed = None if candidates is None else set(candidates)
        best = None
        for name, hit in sorted(hits.items()):
            if allowed is not None and name not in allowed:
                continue
            key = (hit["longest_matched"], hit["GPU"], hit["CPU"])
            if best is None or key > best[0]:
                best = (key, name, hit)
        return (None, None) if best is None else (best[1], best[2])

    def instances(self) -> list:
        """Every subscription and the state of its event stream."""
        return self._call("GET", "/instances")

    def metrics(self) -> str:
        return self._call("GET", "/metrics")
