"""Generate the tiny random Llama model the tests and the local profile serve.

It proves the serving path, not quality: the weights are random, the output is noise.
Deterministic (fixed seed, fixed corpus) and made in seconds with no network.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

# ChatML, with Hermes-style tools as Qwen2.5 writes them: the tools in a system block, each
# call of an assistant message as <tool_call>{"name", "arguments"}</tool_call>, tool results as
# `tool` messages. vLLM's `hermes` tool-call parser reads calls in that form. Thinking is opt-in,
# as in templates that declare `enable_thinking` (vLLM sets it from `reasoning_effort`, a
# Responses `reasoning`): the reply then starts inside <think>, and what comes before </think>
# is reasoning for a type with vLLM's `deepseek_v3` reasoning parser.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ call['function']['arguments'] | tojson }}{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\n' }}{% endif %}"
    "{% endif %}"
)
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    "Translate this sentence into French, please.",
    "Ray Serve scales model replicas; vLLM generates tokens fast.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols !?.,;:-_()[]{}<>=+*/\\'\"",
] * 20
MARKER = "serviceai-tiny-model.json"
# Bumped when what `generate` writes changes, so that an older folder is made again.
VERSION = 3
# The model's own sampling defaults, which vLLM applies to a request that omits them. A small
# top_k is visible from outside: every sampled token is among the top_k most likely.
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.8, "top_k": 5}


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}
"""The test model: its prefill costs next to nothing."""
PREFILL_HEAVY = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
"""Some 3M parameters: on two cores a 1,400-token prefill takes a good part of a TTFT, as a
real model's does on a GPU (bench/prefix_affinity.py --model prefill-heavy)."""
EMBED_SMALL = {
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 32,
}
"""Some 26M parameters, the size of the small embedding models retrieval runs on (384 numbers
a vector, 12 layers, as bge-small's): a request's own time, not the path's, sets the rate
(bench/embeddings.py --model embed-small)."""

VARIANTS: dict[str, dict] = {
    "tiny": {},
    # The tiny model with a tokenizer that reads English and code as real ones do (some three
    # characters a token, trained on Python's own reference text) and 65,536 positions: Claude
    # Code's first request, its system prompt and tool set (~50 KB), is ~17,000 tokens here.
    # Its replies end (ends_replies): an agent such as Claude Code takes a reply cut at
    # max_tokens for a failure, and among 8,192 tokens a random model's end of turn is almost
    # never one of its five likeliest.
    "tiny-long": {
        "vocab_size": 8192,
        "corpus": "reference",
        "max_positions": 65536,
        "ends_replies": True,
    },
    # An embedding model (a type with `task: embed`): vLLM pools the last token's hidden state,
    # 64 numbers, which a request may shorten to 16 or 32 (`dimensions`), as a model trained
    # with Matryoshka representation learning declares.
    "tiny-embed": {"matryoshka": [16, 32, 64]},
}
"""The generated models a type's `model` may name, and how each differs from the tiny one."""


def _corpus(name: str) -> list[str]:
    if name == "reference":
        import pydoc_data.topics  # the interpreter's own help text: fixed for a Python version

        return CORPUS + list(pydoc_data.topics.topics.values())
    return CORPUS


END_OF_TURN_EVERY = 8
"""With `ends_replies`, every 8th ordinary token ends a turn as <|im_end|> does (the model's
generation_config lists them as end-of-sequence ids, which vLLM stops on as on its own): at the
model's top_k 5 and temperature 0.8 a reply ends after ~15 tokens on average, and 60 of 60
sampled (after a short prompt, after Claude Code's) within 60."""


def generate(
    out_dir: Path,
    vocab_size: int = 512,
    seed: int = 0,
    dims: dict | None = None,
    corpus: str = "tiny",
    max_positions: int = 2048,
    ends_replies: bool = False,
    matryoshka: list[int] | None = None,
) -> Path:
    """Write a tokenizer trained on `corpus` and a randomly initialised LlamaForCausalLM
    (`dims`, default TINY) with `max_positions` positions into out_dir; `ends_replies`: one
    whose replies end after some tens of tokens (END_OF_TURN_EVERY); `matryoshka`: the
    shortened embeddings its config declares (`matryoshka_dimensions`, as vLLM reads it)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = max_positions
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    settings: dict[str, Any] = {
        "vocab_size": len(fast),
        **(dims or TINY),
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": True,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
        "torch_dtype": "float32",
        **({"matryoshka_dimensions": matryoshka} if matryoshka else {}),
    }
    config = LlamaConfig(**settings)
    model = LlamaForCausalLM(config).float()
    ends = range(len(SPECIAL_TOKENS), len(fast), END_OF_TURN_EVERY) if ends_replies else ()
    model.generation_config = GenerationConfig(
        bos_token_id=fast.bos_token_id,
        eos_token_id=[fast.eos_token_id, *ends] if ends else fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        **GENERATION_DEFAULTS,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / MARKER).write_text(
        json.dumps(
            {
                "seed": seed,
                "vocab_size": vocab_size,
                "corpus": corpus,
                "max_positions": max_positions,
                "ends_replies": ends_replies,
                "matryoshka": matryoshka,
                "version": VERSION,
            }
        )
    )
    return out_dir


def ensure(out_dir: Path, variant: str = "tiny") -> Path:
    """Generate the model (one of VARIANTS) unless a complete one is already in out_dir.

    Several replicas may call this at once: each writes a private folder and renames it
    into place, so a reader never sees a half-written model.
    """
    if _is_current(out_dir, variant):
        return out_dir
    if (out_dir / MARKER).exists():
        shutil.rmtree(out_dir)  # an older version: make it again
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out_dir.parent))
    try:
        generate(staging, **VARIANTS[variant])
        try:
            staging.rename(out_dir)
        except OSError:
            if not _is_current(out_dir, variant):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _is_current(out_dir: Path, variant: str) -> bool:
    recipe = {
        "vocab_size": 512,
        "corpus": "tiny",
        "max_positions": 2048,
        "ends_replies": False,
        "matryoshka": None,
    }
    recipe.update(VARIANTS[variant])
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return all(marker.get(k) == v for k, v in {**recipe, "version": VERSION}.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?", default=Path("models/tiny"))
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="tiny")
    parser.add_argument("--force", action="store_true", help="regenerate even if present")
    args = parser.parse_args()
    if args.force:
        path = generate(args.out_dir, **VARIANTS[args.variant])
    else:
        path = ensure(args.out_dir, args.variant)
    print(path)


if __name__ == "__main__":
    main()
