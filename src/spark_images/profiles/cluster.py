"""The `cluster` section of a profile or recipe, and its Spark defaults (one place).

Defaults are those of two DGX Sparks linked by one QSFP cable in the outer
ConnectX-7 port (public Spark networking notes, 2026): `ibdev2netdev` shows
`rocep1s0f1 ==> enp1s0f1np1` and its twin `roceP2p1s0f1 ==> enP2p1s0f1np1`;
the IP sits on `enp1s0f1np1`, and NCCL uses both RoCE twins for the full
200 Gb/s. Confirm the names on each node with `ibdev2netdev`: they must be
the same on every node. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from spark_images.core.errors import Problem

# field -> (default, meaning); the README's "Multi-Spark" table says the same
DEFAULTS: dict[str, tuple[Any, str]] = {
    "name": ("spark", "cluster name: container names spark-images-NAME-head / -worker-N"),
    "socket_ifname": ("enp1s0f1np1", "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: the CX7 netdev with the IP"),
    "ib_hca": ("rocep1s0f1,roceP2p1s0f1", "NCCL_IB_HCA: both RoCE twins of the cabled port"),
    "ray_port": (6379, "the Ray head's GCS port (`ray start --head --port`)"),
    "serve_port": (8000, "vLLM's HTTP port on the head"),
    "head_address": (None, "address the worker joins; default: the head node's IP or host"),
    "network": ("host", "docker --network: host on Sparks (Ray and NCCL need the CX7 addresses)"),
    "gpus": ("all", "docker --gpus; null: no GPU request"),
    "gpus_per_node": (1, "`ray start --num-gpus`: one GB10 per Spark"),
    "shm_size": ("16g", "docker --shm-size (NCCL and Ray's object store use /dev/shm)"),
    "devices": (["/dev/infiniband"], "docker --device: the RoCE devices NCCL_IB_HCA names"),
    "hf_cache": ("~/.cache/huggingface", "host folder mounted at /root/.cache/huggingface"),
    "env": ({}, "more environment for every node (e.g. NCCL_DEBUG: INFO)"),
    "driver_major": (None, "required NVIDIA driver major on every node; null: all nodes equal"),
    "join_timeout_s": (300, "deadline for `ray status` to show every node and GPU"),
    "serve_timeout_s": (1800, "deadline for vLLM's /health on the head (weights, compile)"),
    "pull_timeout_s": (1800, "deadline of one image pull on one node"),
}

_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")  # Linux IFNAMSIZ - 1
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ClusterSettings:
    name: str
    socket_ifname: str
    ib_hca: str
    ray_port: int
    serve_port: int
    head_address: str | None
    network: str
    gpus: str | None
    gpus_per_node: int
    shm_size: str
    devices: tuple[str, ...]
    hf_cache: str
    env: tuple[tuple[str, str], ...]
    driver_major: int | None
    join_timeout_s: int
    serve_timeout_s: int
    pull_timeout_s: int

    def link_env(self) -> dict[str, str]:
        """The variables that pin NCCL, Gloo and UCX to the CX7 link (the same on every node);
        their absence is the reported two-node failure."""
        return {"NCCL_SOCKET_IFNAME": self.socket_ifname, "GLOO_SOCKET_IFNAME": self.socket_ifname,
                "NCCL_IB_HCA": self.ib_hca, "UCX_NET_DEVICES": self.socket_ifname}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["devices"] = list(self.devices)
        doc["env"] = dict(self.env)
        return doc


def spark_defaults() -> ClusterSettings:
    values = {key: default for key, (default, _meaning) in DEFAULTS.items()}
    values["devices"] = tuple(values["devices"])
    values["env"] = ()
    return ClusterSettings(**values)


def _port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\n" not in value


def _ifnames(value: Any) -> bool:
    return isinstance(value, str) and all(_IFNAME.fullmatch(p) for p in value.split(","))


_HCA = re.compile(r"\^?=?[A-Za-z0-9_.-]{1,64}(?::[0-9]{1,3})?")  # NCCL_IB_HCA: [^][=]dev[:port]
_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GPUS = re.compile(r"all|[0-9]{1,3}|device=[0-9,]{1,64}")
_DEVICE = re.compile(r"/dev/[A-Za-z0-9_./-]{1,200}")


def _hcas(value: Any) -> bool:
    return isinstance(value, str) and all(_HCA.fullmatch(p) for p in value.split(","))


def _path(value: Any) -> bool:
    return _text(value) and value.isprintable() and len(value) <= 4096


def _env_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and _ENV_KEY.fullmatch(k) and isinstance(x, str | int) and not isinstance(x, bool)
        for k, x in value.items()
    )


_CHECKS: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str) and _NAME.fullmatch(v) is not None, "lower-case letters, digits, . _ - (1-40)"),
    "socket_ifname": (_ifnames, "an interface name (or a comma list), as `ip link` shows it"),
    "ib_hca": (_hcas, "a comma list of RDMA devices, as `ibdev2netdev` shows them"),
    "ray_port": (_port, "a port 1-65535"),
    "serve_port": (_port, "a port 1-65535"),
    "head_address": (lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.:-]{1,253}", v) is not None), "a host name or IP, or null"),
    "network": (lambda v: isinstance(v, str) and _DOCKER_NAME.fullmatch(v) is not None, "host, or a docker network name"),
    "gpus": (lambda v: v is None or (isinstance(v, str) and _GPUS.fullmatch(v) is not None), "all, a count, device=0,1, or null"),
    "gpus_per_node": (_positive, "an integer >= 1"),
    "shm_size": (lambda v: isinstance(v, str) and re.fullmatch(r"[0-9]+[bkmg]?", v) is not None, "like 16g"),
    "devices": (lambda v: isinstance(v, list) and all(isinstance(d, str) and _DEVICE.fullmatch(d) for d in v), "a list of /dev paths"),
    "hf_cache": (_path, "a host folder"),
    "env": (_env_map, "a mapping NAME: value"),
    "driver_major": (lambda v: v is None or _positive(v), "an integer like 580, or null"),
    "join_timeout_s": (_positive, "seconds >= 1"),
    "serve_timeout_s": (_positive, "seconds >= 1"),
    "pull_timeout_s": (_positive, "seconds >= 1"),
}


def parse_settings(section: Any, file: str, where: str = "cluster") -> tuple[ClusterSettings, list[Problem]]:
    """The section over the Spark defaults; every bad or unknown key is one problem line."""
    base = spark_defaults()
    if section is None:
        return base, []
    if not isinstance(section, Mapping):
        return base, [Problem(file=file, field=where, message="must be a mapping", fix="see README \"Multi-Spark\"")]
    problems: list[Problem] = []
    changes: dict[str, Any] = {}
    for key in sorted(section, key=str):
        value = section[key]
        if key not in _CHECKS:
            problems.append(Problem(file=file, field=f"{where}.{key}", message="unknown key",
                                    fix=f"use one of {', '.join(sorted(DEFAULTS))}"))  # fmt: skip
            continue
        check, wanted = _CHECKS[key]
        if not check(value):
            problems.append(Problem(file=file, field=f"{where}.{key}", message=f"bad value {str(value)[:60]!r}", fix=wanted))
            continue
        if key == "devices":
            value = tuple(value)
        elif key == "env":
            value = tuple(sorted((k, str(v)) for k, v in value.items()))
        changes[key] = value
    return replace(base, **changes), problems
