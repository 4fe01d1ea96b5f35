"""On the GPU machine (setup.sh): the project's tiny model, and a ~1B random-weight Llama with
the tiny model's tokenizer, generated on the GPU in seconds; with `8b`, a Llama 3 8B's shape
instead (32 layers, hidden 4096: 6.98 B parameters with this vocabulary, 14 GB in bf16, ~35 s
on the H100), whose prefill is a real share of a TTFT on an H100 (cluster_bench.sh's MODEL=m8b).

    python3 make_models.py TINY_DIR BIG_DIR [1b|8b]
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from deployments.tiny_model import ensure

SHAPES = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32},
}


def main(tiny: Path, big: Path, shape: str = "1b") -> None:
    ensure(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **SHAPES[shape],
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    if shape != "1b":  # made in bf16 at once (8b: 30 GB in float32); 1b as it always was
        torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(big)
    tokenizer.save_pretrained(big)
    print("params", sum(p.numel() for p in model.parameters()) / 1e9, "B")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])
