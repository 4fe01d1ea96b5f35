import hashlib

from transformers import AutoConfig, AutoTokenizer

from deployments.tiny_model import MARKER, ensure, generate


def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_generation_is_deterministic(tmp_path):
    assert digest(generate(tmp_path / "a")) == digest(generate(tmp_path / "b"))


def test_model_matches_what_vllm_cpu_serves(tmp_path):
    folder = ensure(tmp_path / "tiny")
    assert (folder / MARKER).exists()
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (
        config.hidden_size // config.num_attention_heads == 32
    )  # a head size CPU attention supports
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


def test_ensure_keeps_an_existing_model(tmp_path):
    folder = ensure(tmp_path / "tiny")
    before = (folder / "model.safetensors").stat().st_mtime_ns
    ensure(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_the_long_variant_reads_text_as_real_tokenizers_do_and_ends_its_replies(tmp_path):
    from transformers import GenerationConfig

    folder = ensure(tmp_path / "tiny-long", "tiny-long")
    assert AutoConfig.from_pretrained(folder).max_position_embeddings == 65536
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "Use the Read tool to read a file before you edit it with the Edit tool. " * 10
    assert len(tokenizer.encode(text)) < len(text) / 3  # the tiny model's: ~1 per character
    ends = GenerationConfig.from_pretrained(folder).eos_token_id
    assert ends[0] == tokenizer.eos_token_id and 1000 < len(ends) < 1100  # 1 in 8
    # A folder of another variant is made again, not taken for this one.
    tiny = ensure(tmp_path / "tiny-long")
    assert AutoConfig.from_pretrained(tiny).max_position_embeddings == 2048
