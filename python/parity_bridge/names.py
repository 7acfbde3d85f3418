"""The name maps: parity <-> the Hugging Face checkpoint of the DeepSeek-V4
release (the same rules as parity's src/model/hfmap.c; docs/gpu-rollout.md
"The HF mapping" cites the release files they are read from).

- Tensor names: the V4 checkpoint already uses the inference code's names,
  which are parity's, so parity -> HF is the identity.  HF -> parity applies
  the renames of the release's inference/convert.py (a ``model.`` prefix,
  ``self_attn``, ``mlp``, the V3-style component names, ``e_score_correction_bias``),
  skips ``mtp.N.*emb*`` / ``mtp.N.head.weight`` (shared with the main model) and
  flags quantization ``.scale`` tensors.
- Layout: no transposes (both [out, in]); nothing split or fused at
  model-parallel size 1.
- Dtypes: ``gate.tid2eid`` is int64 in the checkpoint, int32 in parity; the
  release keeps hc_*, attn_sink, *.ape and gate.bias in float32.
- config.json keys: HF_KEYS / ROPE_KEYS below (HF name, parity name).
"""
import re

COMPONENT_RENAMES = {
    "self_attn": "attn", "mlp": "ffn", "embed_tokens": "embed",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b",
    "kv_a_layernorm": "kv_norm", "gate_proj": "w1", "down_proj": "w2", "up_proj": "w3",
    "lm_head": "head", "e_score_correction_bias": "bias", "weight_scale_inv": "scale",
}

# config.json (HF name) <-> parity / ModelArgs name
HF_KEYS = [
    ("vocab_size", "vocab_size"), ("hidden_size", "dim"), ("num_hidden_layers", "n_layers"),
    ("num_hash_layers", "n_hash_layers"), ("num_nextn_predict_layers", "n_mtp_layers"),
    ("num_attention_heads", "n_heads"), ("head_dim", "head_dim"), ("qk_rope_head_dim", "rope_head_dim"),
    ("q_lora_rank", "q_lora_rank"), ("o_groups", "o_groups"), ("o_lora_rank", "o_lora_rank"),
    ("sliding_window", "window_size"), ("index_n_heads", "index_n_heads"),
    ("index_head_dim", "index_head_dim"), ("index_topk", "index_topk"),
    ("n_routed_experts", "n_routed_experts"), ("num_experts_per_tok", "n_activated_experts"),
    ("moe_intermediate_size", "moe_inter_dim"), ("n_shared_experts", "n_shared_experts"),
    ("hc_mult", "hc_mult"), ("hc_sinkhorn_iters", "hc_sinkhorn_iters"),
    ("routed_scaling_factor", "route_scale"), ("swiglu_limit", "swiglu_limit"), ("hc_eps", "hc_eps"),
    ("rms_norm_eps", "norm_eps"), ("rope_theta", "rope_theta"), ("compress_rope_theta", "compress_rope_theta"),
    ("compress_ratios", "compress_ratios"),
]
ROPE_KEYS = [("factor", "rope_factor"), ("original_max_position_embeddings", "original_seq_len"),
             ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")]

SKIP, PARAM, SCALE = "skip", "param", "scale"


def hf_name(parity_name):
    """The HF checkpoint name of a parity parameter (the same name)."""
    return parity_name


def parity_name(hf):
    """(parity name, kind) of a checkpoint tensor name; kind is PARAM, SKIP
    (mtp.N embed/head: shared, convert.py skips them) or SCALE (a quantization
    scale, which parity has none of)."""
    if hf.startswith("model."):
        hf = hf[len("model."):]
    name = ".".join(COMPONENT_RENAMES.get(c, c) for c in hf.split("."))
    if name.startswith("mtp.") and ("emb" in name or name.endswith("head.weight")):
        return name, SKIP
    if name.endswith(".scale"):
        return name, SCALE
    return name, PARAM


def release_store(name, ndim=2, integer=False):
    """How the V4 release stores a tensor: "BF16", "F32", "FP8" (+ .scale),
    "FP4" (routed experts, + .scale) or "I64" (tid2eid)."""
    if integer or name.endswith("tid2eid"):
        return "I64"
    if "hc_" in name or name.endswith("attn_sink") or name.endswith(".ape") or name.endswith("gate.bias"):
        return "F32"
    if re.search(r"(^|\.)experts\.\d+\.", name):
        return "FP4"
    fp8 = (".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight",
           ".attn.wo_b.weight", ".indexer.wq_b.weight", ".shared_experts.w1.weight",
           ".shared_experts.w2.weight", ".shared_experts.w3.weight", ".e_proj.weight", ".h_proj.weight")
    return "FP8" if name.endswith(fp8) else "BF16"


def hf_config(cfg, torch_dtype="float64"):
    """config.json (the release's keys) from a parity config dict (MODEL.md names).
    Training keys go under "parity", as parity's export writes them."""
    j = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
         "num_key_value_heads": 1, "hidden_act": "silu", "scoring_func": "sqrtsoftplus",
         "topk_method": "noaux_tc", "norm_topk_prob": True, "attention_bias": False,
         "attention_dropout": 0.0, "tie_word_embeddings": False}
    for h, p in HF_KEYS:
        j[h] = cfg[p]
    j["max_position_embeddings"] = cfg["original_seq_len"] * cfg["rope_factor"]
    j["rope_scaling"] = {"type": "yarn", **{h: cfg[p] for h, p in ROPE_KEYS}}
    j["torch_dtype"] = torch_dtype
    model_keys = {p for _, p in HF_KEYS} | {p for _, p in ROPE_KEYS} | {"n_mtp_layers"}
    j["parity"] = {"format": "parity-hf-export", "version": 1,
                   "train": {k: v for k, v in cfg.items() if k not in model_keys}}
    return j


def parity_config(j):
    """Parity config dict (MODEL.md names) from a config.json with the release's keys."""
    q = j.get("quantization_config")
    if q is not None and not (isinstance(q, dict) and q.get("quant_method") == "fp8"
                              and q.get("fmt", "e4m3") == "e4m3" and q.get("scale_fmt", "ue8m0") == "ue8m0"
                              and list(q.get("weight_block_size", [])) == [128, 128]):
        raise ValueError("config.json has a quantization_config that is not the release's "
                         "(fp8, e4m3, ue8m0, weight_block_size [128, 128])")
    if j.get("num_key_value_heads", 1) != 1:
        raise ValueError("num_key_value_heads must be 1")
    if j.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise ValueError(f"scoring_func must be sqrtsoftplus, got {j['scoring_func']!r}")
    missing = [h for h, _ in HF_KEYS if h not in j]
    if missing:
        raise ValueError(f"config.json lacks {missing}")
    cfg = {p: j[h] for h, p in HF_KEYS}
    rope = j.get("rope_scaling") or {}
    if rope.get("type") != "yarn":
        raise ValueError("config.json needs rope_scaling of type yarn")
    cfg.update({p: rope[h] for h, p in ROPE_KEYS})
    par = j.get("parity") or {}
    for section in ("train", "batch"):
        cfg.update(par.get(section) or {})
    return cfg


def opt_kind(name, ndim, integer=False):
    """MODEL.md 7: "muon" for every 2-D weight but embed.weight, head.weight and
    *.ape; "none" for gate.bias (balance update) and tid2eid; else "adamw"."""
    if integer or name.endswith("gate.bias") or name.endswith("tid2eid"):
        return "none"
    if ndim == 2 and name not in ("embed.weight", "head.weight") and not name.endswith(".ape"):
        return "muon"
    return "adamw"


def weight_decay(name, kind):
    """wd applies to Muon tensors and to embed/head (the AdamW ones with wd' = wd)."""
    return kind == "muon" or name in ("embed.weight", "head.weight")
