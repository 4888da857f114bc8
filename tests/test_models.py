import hashlib
import time
from pathlib import Path

import pytest

from envs import models
from envs.models import resolve_model


def _digest(path: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def test_tiny_model_is_deterministic_and_loads(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("RLLIB_TBA_CACHE", str(tmp_path / "a"))
    a = Path(resolve_model("tiny-test"))
    monkeypatch.setenv("RLLIB_TBA_CACHE", str(tmp_path / "b"))
    b = Path(resolve_model("tiny-test"))
    assert a != b and _digest(a) == _digest(b)
    tok = AutoTokenizer.from_pretrained(a)
    model = AutoModelForCausalLM.from_pretrained(a)
    ids = tok("What is 3 + 4? The answer is 7.", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "What is 3 + 4? The answer is 7."
    assert len(ids) < 20  # the BPE learned the task vocabulary
    assert model.config.vocab_size == len(tok) and tok.eos_token_id is not None


def test_other_names_pass_through_unchanged(tmp_path):
    assert resolve_model("gpt2") == "gpt2"
    assert resolve_model("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
    assert resolve_model(str(tmp_path)) == str(tmp_path)  # an existing local directory
    with pytest.raises(FileNotFoundError, match="model path '/models/my-llama' does not exist"):
        resolve_model("/models/my-llama")
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_model("")


def test_interrupted_build_leaves_no_half_model(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLIB_TBA_CACHE", str(tmp_path))

    def broken_build(out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt("interrupted")

    monkeypatch.setattr(models, "_build_tiny_test", broken_build)
    with pytest.raises(KeyboardInterrupt):
        resolve_model("tiny-test")
    leftovers = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []
    monkeypatch.undo()
    monkeypatch.setenv("RLLIB_TBA_CACHE", str(tmp_path))
    assert (Path(resolve_model("tiny-test")) / "config.json").is_file()


def test_smollm2_converted_once_then_reused_and_served_by_vllm(tmp_path, monkeypatch):
    """The GGUF -> HF conversion runs once; a second call reuses it; vLLM and transformers load it and it answers."""
    monkeypatch.setenv("RLLIB_TBA_CACHE", str(tmp_path))
    first = Path(resolve_model("smollm2-135m-instruct"))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    t = time.time()
    second = Path(resolve_model("smollm2-135m-instruct"))
    assert second == first and time.time() - t < 1.0
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left

    import torch
    from transformers import AutoModelForCausalLM

    from envs.llm_runtime import get_engine, sampling_params

    # float32: in bf16 the first greedy token is a coin flip ("The" leads "L" by 0.08 nats; AMX bf16 picks "L'Étoile")
    engine = get_engine(str(first), dtype="float32", max_model_len=256)
    tok = engine.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    out = engine.generate([prompt], sampling_params(max_tokens=24, temperature=0.0, logprobs=5),
                          use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text, out.text
    # transformers reads the same weights: its first-token log-probs equal vLLM's top 5
    model = AutoModelForCausalLM.from_pretrained(first, torch_dtype=torch.float32)
    with torch.no_grad():
        logp = model(tok(prompt, return_tensors="pt").input_ids).logits[0, -1].log_softmax(-1)
    for token, lp in out.logprobs[0].items():
        assert abs(logp[token].item() - lp.logprob) < 1e-3, (tok.decode([token]), logp[token].item(), lp.logprob)


def test_request_amx_where_the_cpu_has_it():
    """vLLM's bf16 CPU attention runs AMX instructions; a process must ask Linux for AMX first (a Serve replica that
    did not died with SIGILL). In a fresh process, request_amx() grants it exactly where /proc/cpuinfo lists amx_tile."""
    import subprocess
    import sys

    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    code = "from envs.llm_runtime import request_amx; print(request_amx(), request_amx())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str("amx_tile" in flags)] * 2
