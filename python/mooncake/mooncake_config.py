"""``MooncakeConfig``: the settings inference-engine integrations (vLLM,
SGLang, LMCache) pass to ``MooncakeDistributedStore.setup``, read from a JSON
file (``MOONCAKE_CONFIG_PATH``) or from ``MOONCAKE_*`` environment variables,
with the reference's field names and defaults."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}
_TRUE = {"true", "1", "yes", "on", "enable"}
_FALSE = {"false", "0", "no", "off", "disable", ""}
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")
# Protocol names a Mooncake config may carry (transports of either
# implementation's engine and store modes). Others pass through with a
# warning, since the engine, not the config, decides what it supports.
KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex",
    "cxl", "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
})


def parse_size(value: Any) -> int:
    """A byte count from an int or a string such as ``"3GB"``, ``"16 mb"``,
    ``"0.5G"`` (binary units)."""
    if isinstance(value, bool):
        raise ValueError(f"Invalid size: {value!r}")
    if isinstance(value, int):
        return value
    s = str(value).strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = s[len(num):].strip() if num else s
    if not num or unit not in _UNITS:
        raise ValueError(f"Invalid size: {value!r}")
    return int(float(num) * _UNITS[unit])


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning(
                "Unrecognised protocol %r; passing it through to the Mooncake engine unchanged. "
                "Known protocols are: %s.", self.protocol, ", ".join(sorted(KNOWN_PROTOCOLS)),
            )
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}. Size must be non-negative.")
        for name in _REQUIRED:
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, got {v!r}.")

    @staticmethod
    def from_dict(config: Dict[str, Any]) -> "MooncakeConfig":
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=parse_size(config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=parse_size(config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config["master_server_address"],
            enable_ssd_offload=parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path=str(config.get("ssd_offload_path") or ""),
            tenant_id=str(config.get("tenant_id") or "default"),
            enable_client_http_server=parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """Loads a JSON config file."""
        with open(file_path) as f:
            return MooncakeConfig.from_dict(json.load(f))

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """``MOONCAKE_CONFIG_PATH`` (a JSON file) if set, else ``MOONCAKE_MASTER``
        (required), ``MOONCAKE_LOCAL_HOSTNAME``, ``MOONCAKE_TE_META_DATA_SERVER``,
        ``MOONCAKE_GLOBAL_SEGMENT_SIZE``, ``MOONCAKE_LOCAL_BUFFER_SIZE``,
        ``MOONCAKE_PROTOCOL``, ``MOONCAKE_DEVICE`` and the offload/tenant variables."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' is set.")
        return MooncakeConfig(
            local_hostname=os.getenv("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=os.getenv("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=parse_size(os.getenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=parse_size(os.getenv("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=os.getenv("MOONCAKE_PROTOCOL", "tcp"),
            device_name=os.getenv("MOONCAKE_DEVICE", ""),
            master_server_address=os.environ["MOONCAKE_MASTER"],
            enable_ssd_offload=parse_bool(os.getenv("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=os.getenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=os.getenv("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=parse_bool(os.getenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(os.getenv("MOONCAKE_CLIENT_HTTP_PORT", 9300)),
        )

    def setup_args(self) -> Dict[str, Any]:
        """The keyword arguments of ``MooncakeDistributedStore.setup``."""
        d = asdict(self)
        return {
            "local_hostname": d["local_hostname"],
            "metadata_server": d["metadata_server"],
            "global_segment_size": d["global_segment_size"],
            "local_buffer_size": d["local_buffer_size"],
            "protocol": d["protocol"],
            "rdma_devices": d["device_name"] or "",
            "master_server_addr": d["master_server_address"],
        }


# The reference module's names for the two parsers.
_parse_segment_size = parse_size
_parse_bool = parse_bool

__all__ = ["MooncakeConfig", "KNOWN_PROTOCOLS", "DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE", "parse_size", "parse_bool"]
