"""llama.cpp's own programs, built from the sources vendored in the llama-cpp-python sdist that
specchat runs on (the same llama.cpp, so comparisons are fair), into the user cache dir. No
binaries are committed. Used by bench/compare, bench/servers and bench/lookup_gap; not part of the package."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import llama_cpp
import platformdirs


def build(tools: tuple[str, ...]) -> Path:
    """The build's bin directory, holding `tools` (built now if missing; minutes on 2 cores)."""
    version = llama_cpp.__version__
    root = Path(platformdirs.user_cache_dir("specchat")) / f"llama.cpp-{version}"
    bin_dir = root / "build" / "bin"
    if all((bin_dir / t).exists() for t in tools):
        return bin_dir
    if not (root / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={version}", "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(sdist) as tf:
                tf.extractall(tmp, filter="data")
            src = next(p for p in Path(tmp).glob("llama_cpp_python-*") if p.is_dir()) / "vendor" / "llama.cpp"
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-r", f"{src}/.", str(root)], check=True)
    server = "ON" if "llama-server" in tools else "OFF"
    subprocess.run(["cmake", "-S", str(root), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", f"-DLLAMA_BUILD_SERVER={server}"], check=True)
    subprocess.run(["cmake", "--build", str(root / "build"), "-j", "2", "--target", *tools], check=True)
    return bin_dir


def amx_flags() -> list[str]:
    """Where the CPU has AMX, llama.cpp's repacked weights crash on batches of two or more tokens (as in
    specchat's own model loading): turn repacking off, as specchat does."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            amx = any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        amx = False
    return ["--no-repack"] if amx else []


def example_args(threads: int, max_tokens: int) -> list[str]:
    """What every run of a llama.cpp example program (llama-lookup, llama-speculative-simple) gets here, as specchat
    runs: the threads, the tokens, greedy, specchat's 4096-token context, and no repacking where the CPU has AMX."""
    return ["-t", str(threads), "-n", str(max_tokens), "--temp", "0", "-c", "4096", *amx_flags()]


def tool_speed(cmd: list[str]) -> float:
    """The decode speed (tokens/s) a llama.cpp example program (llama-lookup, llama-speculative-simple) prints."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    match = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", text)
    if not match:
        raise RuntimeError(f"no speed in the output of {cmd[0]}:\n{text[-2000:]}")
    return float(match.group(1))
