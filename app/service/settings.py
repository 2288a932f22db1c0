"""User settings: one validated object, stored as TOML in the platformdirs config dir.

An invalid value never stops the app: it is reported in one line and the default is used.
A change rewrites only the keys that changed (through tomlkit), so the user's comments, order
and other keys in the file survive every save.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import platformdirs
import tomlkit
from tomlkit.exceptions import TOMLKitError

from specchat.decoding.guessers import GUESSERS
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.store.files import atomic_write
from specchat.store.tomlpos import locate

# The one setting never written to the settings file: a server's API key comes from the command line
# or from this variable, for `specchat serve` and `specchat --server` alike.
API_KEY_ENV = "SPECCHAT_API_KEY"
# Tables of the same file that other modules read: `[mcp]` is specchat.mcptools.config's.
SECTIONS = ("mcp",)


def resolve_api_key(given: str | None) -> str | None:
    """The API key: the one given on the command line, else the environment's, else none."""
    return given or os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class Settings:
    system_prompt: str = "You are a helpful assistant."
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 512
    guesser: str = "auto"
    draft_length: int = 0  # 0: the guesser's default
    pair: str = ""  # "": the catalog's default pair
    offline: bool = False  # never fetch models (as HF_HUB_OFFLINE=1 does)
    context: int = 4096  # tokens the models' context holds (more costs memory: the KV cache grows with it)
    threads: int = 0  # CPU threads for llama.cpp; 0: every core other programs leave free
    gpu_layers: int = -1  # target layers on the GPU (Metal, CUDA builds); -1: all
    draft_gpu_layers: int = -1
    theme: str = ""  # "": Textual's default; set by the command palette's "Change theme"
    # An OpenAI-compatible server to chat with instead of this machine's models ("": this machine).
    # Its API key is never stored here: --api-key or SPECCHAT_API_KEY gives it.
    server: str = ""
    seed: int = -1  # the random draws of every answer; -1: new ones each time
    # A reasoning model's thinking: "on", "off" (for templates with a switch, e.g. Qwen3's enable_thinking)
    # or "default", as the model does unasked.
    thinking: str = "default"
    # The most rounds of tool calls one answer may make before it must answer in words (0: calls are never run).
    tool_rounds: int = 4

    def __post_init__(self) -> None:
        SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p)  # raises on bad values
        if not all(math.isfinite(v) for v in (self.temperature, self.top_p, self.min_p)):
            raise SpecchatError("temperature, top_p and min_p must be finite numbers")
        if self.max_tokens < 1:
            raise SpecchatError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.guesser not in GUESSERS:
            raise SpecchatError(f"guesser must be one of {', '.join(GUESSERS)}, got {self.guesser!r}")
        if not 0 <= self.draft_length <= 32:
            raise SpecchatError(f"draft_length must be 0 to 32, got {self.draft_length}")
        if not 256 <= self.context <= 1 << 20:
            raise SpecchatError(f"context must be 256 to {1 << 20} tokens, got {self.context}")
        if not 0 <= self.threads <= 1024:
            raise SpecchatError(f"threads must be 0 (every core) to 1024, got {self.threads}")
        if self.thinking not in ("default", "on", "off"):
            raise SpecchatError(f"thinking must be default, on or off, got {self.thinking!r}")
        if self.server and not self.server.startswith(("http://", "https://")):
            raise SpecchatError(f"server must be empty or an http:// or https:// URL, got {self.server!r}")
        if not -1 <= self.seed < 2**63:
            raise SpecchatError(f"seed must be -1 (a new one each time) or 0 to {2**63 - 1}, got {self.seed}")
        if not 0 <= self.tool_rounds <= 32:
            raise SpecchatError(f"tool_rounds must be 0 to 32, got {self.tool_rounds}")
        for key in ("gpu_layers", "draft_gpu_layers"):
            if not -1 <= getattr(self, key) <= 10_000:
                raise SpecchatError(f"{key} must be -1 (all) to 10000, got {getattr(self, key)}")


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir("specchat")) / "config.toml"


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """The settings, and one line for each problem found (whose value fell back to the default).

    Never raises: a broken config file must not stop the app. Each problem names the file,
    the line (when it can be found) and the key."""
    path = path or default_config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings(), []
    except (OSError, UnicodeDecodeError) as e:
        return Settings(), [f"{path}: unreadable ({e}); using default settings"]
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:  # tomllib recurses into nested arrays
        return Settings(), [f"{path}: unreadable ({e}); using default settings"]
    problems, settings = [], Settings()
    types = {f.name: type(getattr(settings, f.name)) for f in fields(Settings)}

    def at(key: str) -> str:  # only for problems: finding the line means scanning the file
        return locate(path, text, (key,))

    for key, value in data.items():
        if key in SECTIONS:
            continue
        if key not in types:
            problems.append(f"{at(key)}: unknown setting {key!r} ignored")
            continue
        want, default = types[key], getattr(settings, key)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # bool is an int subclass: `top_k = true` must not read as 1 (but `offline = true` is a bool).
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            problems.append(f"{at(key)}: {key} must be a {want.__name__}, got {value!r}; using {default!r}")
            continue
        try:
            settings = replace(settings, **{key: value})
        except SpecchatError as e:
            # The validators word some keys as the command line does (top-k for top_k): name the key.
            problems.append(f"{at(key)}: {key} = {value!r} is invalid ({e}); using {default!r}")
    return settings, problems


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write the settings that changed into the file, leaving everything else in it as it was.

    A key the file lacks is added only when its value differs from the default. A file that is not
    valid TOML is kept beside the new one as `config.toml.invalid`, never silently overwritten."""
    path = path or default_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomlkit.parse(text)
    except FileNotFoundError:
        doc = tomlkit.document()
    except (OSError, UnicodeDecodeError, TOMLKitError, RecursionError):
        path.replace(path.with_name(path.name + ".invalid"))
        doc = tomlkit.document()
    current, defaults = doc.unwrap(), asdict(Settings())
    for key, value in asdict(settings).items():
        # Compare types too: `temperature = 1` must become 1.0, and `top_k = true` is not 1.
        same = key in current and current[key] == value and type(current[key]) is type(value)
        if not same and (key in current or value != defaults[key]):
            doc[key] = value
    atomic_write(path, tomlkit.dumps(doc))
