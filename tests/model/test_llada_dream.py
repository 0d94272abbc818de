"""LLaDA and Dream (fully bidirectional DLLMs) against transformers' LlamaForCausalLM / Qwen2ForCausalLM, their
checkpoint formats, logit conventions and stop ids, and the cached-window forwards Fast-dLLM v1's caches use.

Checkpoints are test-made random weights in the real on-disk formats (the published configs scaled down: LLaDA with
``n_kv_heads = n_heads`` as published and a GQA variant; Dream 6/2 heads as its 28/4), written as sharded
safetensors. The reference runs the whole sequence with an explicit all-zeros float 4D mask (bidirectional; eager
attention ignores boolean 4D masks and an omitted mask may run causally). LLaDA's tensors are renamed onto Llama's
by a map written here, independently of the loader. Tolerance: fp64 logits within 1e-10 (max abs difference), fp32
within 1e-4.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specfold.config import ConfigError
from specfold.model.cache import BatchCache
from specfold.model.families import FAMILIES, config_from_dict
from specfold.model.loading import load_model
from specfold.model.random_checkpoint import random_model, write_random_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {torch.float32: 1e-4, torch.float64: 1e-10}

# LLaDA's names -> Llama's (per layer, then the rest), for the reference only.
LLADA_TO_LLAMA = {
    "attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj",
}

# The published config.json fields that matter here (GSAI-ML/LLaDA-8B-Instruct, Dream-org/Dream-v0-Instruct-7B).
LLADA_8B = {
    "model_type": "llada", "architectures": ["LLaDAModelLM"], "activation_type": "silu", "alibi": False,
    "attention_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_size": 126464, "eos_token_id": 126081, "include_bias": False, "include_qkv_bias": False,
    "input_emb_norm": False, "layer_norm_type": "rms", "mask_token_id": 126336, "max_sequence_length": 4096,
    "mlp_hidden_size": 12288, "mlp_ratio": 4, "n_heads": 32, "n_kv_heads": 32, "n_layers": 32, "pad_token_id": 126081,
    "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "vocab_size": 126464, "weight_tying": False,
}
DREAM_7B = {
    "model_type": "Dream", "architectures": ["DreamModel"], "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "mask_token_id": 151666,
    "max_position_embeddings": 131072, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "pad_token_id": 151643, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064,
}

SHAPE = dict(vocab_size=301, hidden_size=96, num_heads=6, intermediate_size=160, num_layers=2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """name -> (path, family): LLaDA 6/6 heads (3 shards), LLaDA GQA 6/2, Dream 6/2 (2 shards)."""
    root = tmp_path_factory.mktemp("bidir")
    cases = {"llada": ("llada", 11, 3, 6), "llada_gqa": ("llada", 12, 2, 2), "dream": ("dream", 13, 2, 2)}
    return {
        name: (write_random_checkpoint(root / name, fam, seed=seed, shards=shards, num_kv_heads=kv, **SHAPE), fam)
        for name, (fam, seed, shards, kv) in cases.items()
    }


def _read_sharded(ckpt):
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for shard in sorted(set(index.values())):
        tensors.update(load_file(str(ckpt / shard)))
    assert set(tensors) == set(index)
    return tensors


def _rms_norm_keep_dtype(self, hidden_states):
    work = hidden_states if hidden_states.dtype == torch.float64 else hidden_states.float()
    var = work.pow(2).mean(-1, keepdim=True)
    return self.weight * (work * torch.rsqrt(var + self.variance_epsilon)).to(hidden_states.dtype)


def reference_model(ckpt, family, dtype, monkeypatch):
    """transformers' Llama (LLaDA, keys renamed) or Qwen2 (Dream) with the checkpoint's weights."""
    import transformers
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.qwen2.modeling_qwen2 as q2

    # transformers upcasts RMSNorm to fp32 even for fp64 weights; keep fp64 (the same formula)
    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", _rms_norm_keep_dtype)
    monkeypatch.setattr(q2.Qwen2RMSNorm, "forward", _rms_norm_keep_dtype)
    cfg = json.loads((ckpt / "config.json").read_text())
    tensors = _read_sharded(ckpt)
    if family == "llada":
        hf_cfg = transformers.LlamaConfig(
            vocab_size=cfg["embedding_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["mlp_hidden_size"],
            num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
            num_key_value_heads=cfg["n_kv_heads"],
            max_position_embeddings=cfg["max_sequence_length"], rms_norm_eps=cfg["rms_norm_eps"],
            tie_word_embeddings=cfg["weight_tying"], attention_bias=False, mlp_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        )
        model = transformers.LlamaForCausalLM(hf_cfg)
        renamed = {}
        for key, value in tensors.items():
            # model.transformer.blocks.N.name.weight | model.transformer.{wte,ln_f,ff_out}.weight
            parts = key.split(".")
            if parts[2] == "blocks":
                renamed[f"model.layers.{parts[3]}.{LLADA_TO_LLAMA[parts[4]]}.{parts[5]}"] = value
            else:
                renamed[{"wte": "model.embed_tokens", "ln_f": "model.norm", "ff_out": "lm_head"}[parts[2]]
                        + "." + parts[3]] = value
        tensors = renamed
    else:
        hf_cfg = transformers.Qwen2Config(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"], max_position_embeddings=cfg["max_position_embeddings"],
            rms_norm_eps=cfg["rms_norm_eps"], tie_word_embeddings=cfg["tie_word_embeddings"],
            rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        )
        model = transformers.Qwen2ForCausalLM(hf_cfg)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    hf_cfg._attn_implementation = "sdpa" if dtype == torch.float64 else "eager"
    return model.to(dtype).eval()


def run_reference(model, ids, dtype):
    """Whole sequence, every row sees every row: an explicit all-zeros float mask [1, 1, L, L]."""
    n = ids.numel()
    with torch.no_grad():
        out = model(input_ids=ids[None], attention_mask=torch.zeros(1, 1, n, n, dtype=dtype),
                    position_ids=torch.arange(n)[None])
    return out.logits[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["llada", "llada_gqa", "dream"])
def test_logits_equal_transformers_bidirectional(name, dtype, ckpts, monkeypatch):
    ckpt, family = ckpts[name]
    ours = load_model(ckpt, dtype={torch.float32: "fp32", torch.float64: "fp64"}[dtype]).net
    ref = reference_model(ckpt, family, dtype, monkeypatch)
    ids = torch.randint(0, 299, (45,))
    want = run_reference(ref, ids, dtype)
    with torch.no_grad():
        got = ours(ids[None], None, mask="bidirectional")[0]
    assert (got - want).abs().max().item() <= TOL[dtype]
    # the oracle is bidirectional too: its first row moves when the last token does
    late = ids.clone()
    late[-1] = (late[-1] + 1) % 299
    assert (run_reference(ref, late, dtype)[0] - want[0]).abs().max().item() > 1e-6


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_a_late_token_changes_the_first_position(name, ckpts):
    net = load_model(ckpts[name][0], dtype="fp64").net
    ids = torch.randint(0, 299, (40,))
    late = ids.clone()
    late[-1] = (late[-1] + 7) % 299
    with torch.no_grad():
        a, b = net(ids[None], None)[0], net(late[None], None)[0]
    assert (a[0] - b[0]).abs().max().item() > 1e-6
    assert torch.equal(net.sequence_logits(a[None])[0, 0], a[0])  # position 0 (both conventions): row 0


def test_logit_conventions(ckpts):
    llada = load_model(ckpts["llada"][0], dtype="fp64")
    dream = load_model(ckpts["dream"][0], dtype="fp64")
    assert (llada.config.shifted_logits, dream.config.shifted_logits) == (False, True)
    raw = torch.randn(2, 9, 301, dtype=torch.float64)
    assert torch.equal(llada.net.sequence_logits(raw), raw)  # LLaDA: position i is row i
    shifted = dream.net.sequence_logits(raw)  # Dream: position i from row i-1, position 0 from row 0
    assert torch.equal(shifted[:, 1:], raw[:, :-1]) and torch.equal(shifted[:, 0], raw[:, 0])


def test_published_configs_map(ckpts):
    llada = config_from_dict(LLADA_8B)
    assert (llada.family, llada.hidden_size, llada.num_layers, llada.num_heads, llada.num_kv_heads, llada.head_dim,
            llada.intermediate_size, llada.vocab_size, llada.max_position_embeddings) == (
        "llada", 4096, 32, 32, 32, 128, 12288, 126464, 4096)
    assert (llada.rope.theta, llada.rms_norm_eps, llada.mask_token_id, llada.eos_token_id) == (
        500000.0, 1e-5, 126336, 126081)
    assert not (llada.qkv_bias or llada.tie_word_embeddings or llada.shifted_logits or llada.qk_norm)
    dream = config_from_dict(DREAM_7B)
    assert (dream.family, dream.hidden_size, dream.num_layers, dream.num_heads, dream.num_kv_heads, dream.head_dim,
            dream.intermediate_size, dream.vocab_size) == ("dream", 3584, 28, 28, 4, 128, 18944, 152064)
    assert (dream.rope.theta, dream.rms_norm_eps, dream.mask_token_id, dream.eos_token_id) == (
        1e6, 1e-6, 151666, 151643)
    assert dream.qkv_bias and dream.shifted_logits and not dream.tie_word_embeddings
    assert FAMILIES["llada"].bidirectional and FAMILIES["dream"].bidirectional
    assert not any(FAMILIES[f].bidirectional for f in ("fast_dllm_v2", "nld", "sdar"))
    assert not FAMILIES["dream"].boundary_drafts  # no block-cache protocol to draft across
    with pytest.raises(ConfigError, match="block_type"):
        config_from_dict({**LLADA_8B, "block_type": "sequential"})
    with pytest.raises(ConfigError, match="no block-cache protocol"):
        FAMILIES["llada"].start(None, None, None, 32, 0, None)


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_sharded_checkpoint_by_path_has_the_real_names(name, ckpts):
    ckpt, family = ckpts[name]
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    assert not (ckpt / "model.safetensors").exists() and len(set(index.values())) >= 2
    if family == "llada":
        want = {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"}
        want |= {f"model.transformer.blocks.{i}.{n}.weight" for i in range(2) for n in LLADA_TO_LLAMA}
    else:
        per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"]
        per_layer += [f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
        per_layer += [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        want |= {f"model.layers.{i}.{n}" for i in range(2) for n in per_layer}
    assert set(index) == want
    model = load_model(str(ckpt), dtype="fp32")  # by path (a str), sharded
    seed = {"llada": 11, "dream": 13}[name]
    written = random_model(config_from_dict(json.loads((ckpt / "config.json").read_text())), seed=seed)
    for (k, p), (k2, q) in zip(model.net.state_dict().items(), written.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(p, q), k


def _with_tokenizer(ckpt, dst, specials):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    shutil.copytree(ckpt, dst)
    vocab = {"[UNK]": 0, "a": 1, **specials}
    Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(dst / "tokenizer.json"))
    return dst


@pytest.mark.parametrize("name,token", [("llada", "<|eot_id|>"), ("dream", "<|im_end|>")])
def test_stop_ids_are_eos_and_the_end_of_turn_token(name, token, ckpts, tmp_path):
    ckpt = _with_tokenizer(ckpts[name][0], tmp_path / name, {token: 297, "<|endoftext|>": 299})
    model = load_model(ckpt, dtype="fp32")
    assert (model.mask_id, model.stop_id, model.stop_ids) == (300, 299, (299, 297))
    assert load_model(ckpt, dtype="fp32", eos_id=5).stop_ids == (5,)  # an explicit stop id is the only one
    assert load_model(ckpts[name][0], dtype="fp32").stop_ids == (299,)  # no tokenizer: the config's EOS


def test_dream_tokenizer_files_without_tokenizer_json(ckpts, tmp_path):
    """Dream ships its tokenizer as remote code (DreamTokenizer: Qwen2's byte-level BPE) over vocab.json + merges.txt
    with no tokenizer.json; the stock Qwen2 class reads the same files, special tokens from tokenizer_config.json."""
    dst = shutil.copytree(ckpts["dream"][0], tmp_path / "dream")
    (dst / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "c": 2, "ab": 3}))
    (dst / "merges.txt").write_text("#version: 0.2\na b\n")
    added = {i: {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True} for i, t in ((4, "<|endoftext|>"), (5, "<|im_end|>"), (6, "<|mask|>"))}
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(i): v for i, v in added.items()}, "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
    }))
    model = load_model(dst, dtype="fp32")
    assert type(model.tokenizer).__name__ == "Qwen2Tokenizer"
    assert model.tokenizer.encode("ab<|im_end|>c") == [3, 5, 2]  # added tokens follow vocab.json, as Dream's do
    assert model.stop_ids == (299, 5)  # the config's EOS, then <|im_end|>


@pytest.mark.parametrize("name", ["llada_gqa", "dream"])
def test_cached_windows_equal_the_full_forward(name, ckpts):
    """Fast-dLLM v1's caches: a full forward stores the prefix (and suffix) K/V; a window over them at its own
    positions reproduces the full forward's rows (fp64, 1e-10)."""
    net = load_model(ckpts[name][0], dtype="fp64").net
    ids = torch.randint(0, 299, (41,))
    s, e, n = 13, 21, ids.numel()
    with torch.no_grad():
        full = net(ids[None], None)[0]  # [L, V]
        prefix = net.new_cache(n)
        got = net(ids[None], prefix, write_cache=True, cache_rows=s)[0]
        assert torch.equal(got, full) and prefix.length == s
        win = net(ids[None, s:], prefix)[0]  # the block and the suffix over the prefix cache
        assert (win - full[s:]).abs().max().item() <= 1e-10

        dual = net.new_cache(n)
        rows = torch.cat([torch.arange(s), torch.arange(e, n)])
        net(ids[None], dual, write_cache=True, cache_rows=rows)
        assert dual.length == rows.numel()
        block = net(ids[None, s:e], dual, start=s)[0]  # only the block, over prefix + suffix
        assert (block - full[s:e]).abs().max().item() <= 1e-10

        # the same window for a batch slot: forward_ragged at an explicit start, over a slot holding prefix + suffix
        c = net.cfg
        batch = BatchCache(c.num_layers, 2, c.num_kv_heads, c.head_dim, n, net.dtype, net.device)
        net(ids[None], batch.slot(1), write_cache=True, cache_rows=rows)
        ragged = net.forward_ragged(ids[None, s:e], batch, torch.tensor([1]), torch.tensor([rows.numel()]),
                                    starts=torch.tensor([s]))[0]
        assert (ragged - full[s:e]).abs().max().item() <= 1e-10
        # without a start the block would sit at the cache's end: a different (wrong) result; the cache's own
        # window start is the default
        assert (net(ids[None, s:e], dual)[0] - full[s:e]).abs().max().item() > 1e-6
        dual.window_start = s
        assert torch.equal(net(ids[None, s:e], dual)[0], block)


def test_init_random_cli_writes_both_families(tmp_path, capsys):
    from specfold.cli import main

    for family in ("llada", "dream"):
        assert main(["init-random", str(tmp_path / family), "--family", family, "--layers", "1"]) == 0
        model = load_model(tmp_path / family, dtype="fp32")
        assert model.config.family == family and FAMILIES[family].bidirectional
    assert "RANDOM-WEIGHT llada" in capsys.readouterr().out
