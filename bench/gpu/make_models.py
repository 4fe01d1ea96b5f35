"""On the GPU machine (setup.sh): the project's tiny model, and a ~1B random-weight Llama with
the tiny model's tokenizer, generated on the GPU in seconds.

    python3 make_models.py TINY_DIR BIG_DIR
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from deployments.tiny_model import ensure


def main(tiny: Path, big: Path) -> None:
    ensure(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(big)
    tokenizer.save_pretrained(big)
    print("params", sum(p.numel() for p in model.parameters()) / 1e9, "B")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
