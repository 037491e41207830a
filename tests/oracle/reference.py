# SPDX-License-Identifier: MIT
"""Independent reference forward pass for llama-family GGUF models.

A test oracle only (hyb never runs Python): it computes the logits of every
position of a token sequence in float64 from the dequantized weights, the way
the published model definitions (Hugging Face transformers' modeling_llama,
modeling_qwen2, modeling_qwen3, modeling_gemma3, modeling_phi3,
modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe and
modeling_rope_utils) define them, reading the hyperparameters from the GGUF
keys llama.cpp's converter writes:

    x = token_embd[tokens]                      (gemma3: times sqrt(n_embd))
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)     (qwen2: biases)
                q, k = rmsnorm per head * attn_q_norm, attn_k_norm   (qwen3, gemma3)
                rope(q), rope(k)  (positions 0..n-1)
                a = Wo . softmax(q k^T * scale + mask) v   (GQA; scale 1/sqrt(head_dim))
                x += a                          (gemma3: x += rmsnorm(a) * post_attention_norm)
                h = rmsnorm(x) * ffn_norm
                f = Wdown . act(Wgate h, Wup h)            (or the experts, below)
                x += f                          (gemma3: x += rmsnorm(f) * post_ffw_norm)
    logits = output . (rmsnorm(x) * output_norm)      (output tied to token_embd if absent)

Architectures ("general.architecture"): llama, qwen2 (biases on Q, K, V),
qwen3 (Q/K norms), gemma3 (scaled embeddings, Q/K norms, the two post norms,
GeGLU with GELU's tanh form; layer l is a sliding-window layer when
attention.sliding_window W > 0 and l % P < P - 1, P =
attention.sliding_window_pattern (6): it sees positions p-W+1..p and rotates
with rope.freq_base_swa (10000), unscaled, like HF's rotary_emb_local), phi3
(qkv_proj: Q, K, V in one attn_qkv tensor; gate_up_proj: gate then up in one
ffn_up; LongRoPE is refused), and the mixtures of experts: llama with
{arch}.expert_count (Mixtral), qwen2moe (qwen2's attention), qwen3moe
(qwen3's).  The
converter stores Gemma's RMS norm weights with the +1 already added, so every
norm here is x / rms(x) * w.  Others are refused.

RoPE is NORM (rotate adjacent pairs (x[2i], x[2i+1]), what llama.cpp uses for
arch "llama", whose converter permutes Wq/Wk for it; chosen by the key
"hyb.rope_neox" or a parameter) or NeoX (rotate (x[i], x[i + n_rot/2]), HF's
rotate_half: qwen2, qwen3, gemma3, phi3).  Its inverse frequencies are
base^(-2i/n_rot), then (modeling_rope_utils):
  - rope.scaling.type linear (or absent) with rope.scaling.factor F (or the
    older rope.scale_linear): divided by F; type none: unscaled;
  - yarn: _compute_yarn_parameters with beta_fast 32, beta_slow 1 and
    rope.scaling.original_context_length (default context_length): the
    ramp between the correction dims mixes 1/F interpolation with
    extrapolation, and cos and sin are scaled by 0.1 ln F + 1;
  - rope_freqs.weight (Llama 3.1: the converter's rendering of HF's llama3
    rope type) divides each inverse frequency; llama3_freq_factors()
    recomputes it from HF's formula;
  - rope.scaling.attn_factor multiplies cos and sin.
The FFN activation comes from "hyb.ffn_act" (silu, relu, relu2, dlrelu)
except for gemma3 (gelu, tanh form).

Mixture-of-experts layers (those with blk.L.ffn_gate_inp.weight) replace the
FFN by the sparse blocks of HF's MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock
and Qwen3MoeSparseMoeBlock; E = expert_count, K = expert_used_count:

    p = softmax(ffn_gate_inp . h)                     (over all E experts)
    S = the K experts of largest p                    (torch.topk)
    w_e = p_e for e in S, divided by sum_S p when norm_topk_prob: Mixtral
          (its softmax over the top-K logits is the same thing) and the
          released Qwen3-MoE configs (true); Qwen2-MoE's are false.  The key
          {arch}.expert_weights_norm overrides, where a file has it.
    f = sum_S w_e * down_e . act(gate_e h, up_e h)
    qwen2moe (any file with ffn_up_shexp): f += sigmoid(ffn_gate_inp_shexp . h)
          * down_shexp . act(gate_shexp h, up_shexp h)   (shared_expert_gate,
          a [n_embd] vector; ungated if the file has none)

The expert tensors are 3-D, GGUF ne [in, out, E]: numpy [E][out][in], so
expert e's matrix is w[e] like any 2-D weight.  Each expert's width is
{arch}.expert_feed_forward_length (Mixtral: feed_forward_length), the shared
expert's {arch}.expert_shared_feed_forward_length.  Routing is a discrete
choice: an engine computing in float32 can pick another expert where the K-th
and (K+1)-th router logits of a token are nearly equal; forward() records the
choices and those gaps (routes, route_gap) so that a mismatch can be told
from a bug.

dots1 (HF Dots1, dots.llm1): qwen3's attention with the routing below.
olmoe (HF Olmoe): RMS norms over the whole q and k projections (before the
split into heads), NeoX RoPE, softmax routing without renormalisation
(norm_topk_prob false), experts of feed_forward_length.
glm4moe (HF Glm4Moe, GLM-4.5): qwen2's biased attention with NeoX RoPE on
the first rope.dimension_count dims of a head (partial_rotary_factor), Q/K
norms where the file has them, post_attention_norm before the FFN
(post_attention_layernorm), leading_dense_block_count dense layers, then
V3's routing below (sigmoid unless expert_gating_func says 1) with
expert_shared_count ungated shared experts.
deepseek2 (HF modeling_deepseek, DeepSeek-V2/V3): multi-head latent
attention computed as HF writes it, K and V decompressed per head from the
normed latent c = rmsnorm(kv_a_mqa . h)[:kv_lora] (k_nope = c . attn_k_b[h],
v = attn_v_b[h] . c: the converter's split of kv_b_proj), q = attn_q . h or
attn_q_b . rmsnorm(attn_q_a . h), RoPE (adjacent pairs) on q's last
rope.dimension_count dims and on the shared k_pe, scores scaled by
key_length_mla^-0.5 times yarn_get_mscale(factor, mscale_all_dim)^2 (YaRN;
the cos/sin magnitude is then 1); routing by softmax or sigmoid
(expert_gating_func 2) scores, chosen by score + exp_probs_b (V3's
e_score_correction_bias) among the expert_group_used_count groups of best
top-2 sum, weighted by the unbiased score, renormalised when
expert_weights_norm, times expert_weights_scale; expert_shared_count
ungated shared experts; leading_dense_block_count dense layers first.

Each architectural feature can be left out on purpose (forward(omit=...),
FEATURES) so that the tests can prove the check fails without it.

`emulate=True` additionally rounds what llama.cpp's CPU backend rounds (each
matmul's input to its weight's vec_dot type: F16, BF16, Q8_0 or Q8_K; the KV
cache to F16; Q and the attention probabilities to F16 for the attention
products, as its non-flash-attention path does).  It is not a model of
the engine, only a way to measure how large the engine's legitimate error is,
so that check_logits.py's tolerances can be derived rather than guessed.

What llama.cpp (this tree's ggml-cpu) does in attention, for comparison:
by default (flash_attn "auto") the CPU backend enables flash attention and
keeps K and V in F16.  Its FA kernel then has three paths: (1) fewer than 64
query rows (decode, short prompts): Q rounded to F16, K.q dot products of
F16 values summed in F32, online softmax with expf in F32, and the V
accumulator itself kept in F16 (rounded after every key), divided by the
sum at the end; (2) 64 or more query rows: tiles of 64x64, Q kept in F32,
K/V widened to F32, F32 GEMMs and softmax, F32 accumulator; (3) decode with
n_kv >= 512 (n_kv is padded to a multiple of 256): the keys split into one
chunk per thread, path (1) per chunk, partials merged in F32 -- so results
depend on the thread count.  Without FA: K.q with q rounded to F16,
softmax in F32 (sums in double), probabilities rounded to F16 for V.p with
V stored transposed.  emulate=True follows the non-FA path: against
llama.cpp without FA it agrees to ~1e-6 std on quantized models unless some
activation falls on the other side of a rounding boundary (F32 sums in
another order, its approximate expf/silu); such flips cost up to a few
1e-2 std on random models, as much as separates llama.cpp's own prefill
from its decode.

Usable as a module (Model(path).forward(tokens)) or as a CLI:
    reference.py MODEL --tokens 1,2,3 [-o OUT.bin] [--greedy N] [--neox yes|no] [--act A]
                 [--omit FEATURE,...] [--emulate]
"""

import argparse
import math
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("reference.py: the gguf package is missing (run tests/oracle/venv.sh)\n")
    raise

ACTS = ("silu", "relu", "relu2", "dlrelu", "gelu")
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen2moe", "qwen3moe", "deepseek2",
         "glm4moe", "dots1", "olmoe")
# llama is one when it has expert_count
MOE_ARCHS = ("qwen2moe", "qwen3moe", "deepseek2", "glm4moe", "dots1", "olmoe")
# what forward(omit=...) can leave out, to prove a check fails without it
FEATURES = (
    "qk_norm",       # qwen3, gemma3: the per-head RMS norms of Q and K
    "bias",          # qwen2: the Q, K, V biases (any bias tensor)
    "post_norms",    # gemma3: post_attention_norm and post_ffw_norm
    "embd_scale",    # gemma3: embeddings times sqrt(n_embd)
    "swa",           # gemma3: the window of the local layers (they see every position)
    "swa_rope",      # gemma3: local layers rotate like the global ones
    "yarn",          # YaRN computed as plain linear interpolation
    "rope_scaling",  # linear / yarn factor ignored
    "rope_freqs",    # rope_freqs.weight ignored
    "topk_norm",     # MoE with norm_topk_prob: the top-K weights not renormalised
    "topk",          # MoE: every expert weighted by its probability (no top-K choice)
    "shexp_gate",    # qwen2moe: the shared expert added without its sigmoid gate
    "shexp",         # qwen2moe: no shared expert
    "exp_bias",      # deepseek2 (V3): experts chosen without the selection bias
    "groups",        # deepseek2 (V3): experts chosen from every group
    "mla_rope",      # deepseek2: no RoPE on the shared rope part of q and k
)


class ModelError(Exception):
    """A model file this reference cannot evaluate (bad or unsupported)."""


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if not f.types:
        return default
    t = f.types[0]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    if t == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    v = f.parts[f.data[0]].tolist()[0]
    if t == gguf.GGUFValueType.BOOL:
        return bool(v)
    return v


# --- rounding of activations, as llama.cpp's CPU matmuls do (emulate=True) ---

def _round_f16(x):
    return x.astype(np.float16).astype(np.float64)


def _round_bf16(x):
    # round to nearest even on the top 16 bits of the float32 pattern
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def _round_q8(x, block, f16_scale):
    """Q8_0 (block 32, F16 scale) or Q8_K (block 256, F32 scale) round trip."""
    shp = x.shape
    xb = x.astype(np.float32).reshape(-1, block)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.round(xb * np.where(d > 0, np.float32(1.0) / d, 0)), 0)
    q = np.clip(q, -127, 127)
    if f16_scale:  # the integers are found with the F32 scale, stored with an F16 one
        d = d.astype(np.float16).astype(np.float32)
    return (q * d.astype(np.float64)).reshape(shp)


def _vec_dot_round(qtype):
    """The rounding llama.cpp applies to a matmul's activations for this weight type."""
    if qtype == QT.F32:
        return None
    if qtype == QT.F16:
        return _round_f16
    if qtype == QT.BF16:
        return _round_bf16
    if qtype in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1):
        return lambda x: _round_q8(x, 32, True)
    if qtype in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        return lambda x: _round_q8(x, 256, False)
    return None


class Model:
    """A llama-family GGUF file, ready for reference forward passes."""

    def __init__(self, path):
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # noqa: BLE001 - any parse failure is "bad file"
            raise ModelError(f"{path}: not a readable GGUF file ({e})") from e
        r = self.reader
        self.tensors = {t.name: t for t in r.tensors}
        self.arch = _field(r, "general.architecture")
        if self.arch is None:
            raise ModelError(f"{path}: no general.architecture")
        if self.arch not in ARCHS:
            raise ModelError(f"{path}: architecture '{self.arch}' is not supported by the "
                             f"reference (supported: {', '.join(ARCHS)})")
        a = self.arch

        def need(key):
            v = _field(r, f"{a}.{key}")
            if v is None:
                raise ModelError(f"{path}: missing {a}.{key}")
            return v

        def opt(key, default):
            return _field(r, f"{a}.{key}", default)

        self.n_embd = int(need("embedding_length"))
        self.n_layer = int(need("block_count"))
        # DeepSeek-V3 / GLM-4.5 multi-token-prediction layers: not part of the model's pass
        self.n_layer -= int(opt("nextn_predict_layers", 0))
        self.n_expert = int(opt("expert_count", 0))
        if a in MOE_ARCHS and self.n_expert <= 0:
            raise ModelError(f"{path}: {a} needs {a}.expert_count > 0")
        # a mixture of experts may have no dense FFN width
        self.n_ff = int(opt("feed_forward_length", 0) if self.n_expert else
                        need("feed_forward_length"))
        self.n_head = int(need("attention.head_count"))
        self.n_head_kv = int(opt("attention.head_count_kv", self.n_head))
        self.eps = float(opt("attention.layer_norm_rms_epsilon", 1e-5))
        self.head_dim = int(opt("attention.key_length", self.n_embd // self.n_head))
        if int(opt("attention.value_length", self.head_dim)) != self.head_dim and a != "deepseek2":
            raise ModelError(f"{path}: {a}.attention.value_length differs from key_length")
        self.n_rot = int(opt("rope.dimension_count", self.head_dim))
        self.freq_base = float(opt("rope.freq_base", 10000.0))
        self.n_ctx_train = int(opt("context_length", 0))
        if self.n_head % self.n_head_kv or self.n_rot > self.head_dim or self.n_rot % 2:
            raise ModelError(f"{path}: inconsistent heads ({self.n_head}/{self.n_head_kv}) "
                             f"or rope dims ({self.n_rot} of {self.head_dim})")

        # RoPE scaling (see the module comment)
        self.rope_scaling = opt("rope.scaling.type", "linear")
        if self.rope_scaling not in ("none", "linear", "yarn", "llama3"):
            raise ModelError(f"{path}: rope scaling '{self.rope_scaling}' is not supported by "
                             "the reference (none, linear, yarn, llama3)")
        factor = float(opt("rope.scaling.factor", 0.0) or 0.0)
        if not factor:
            factor = float(opt("rope.scale_linear", 0.0) or 0.0)
        self.rope_factor = 1.0 if self.rope_scaling == "none" or factor <= 0 else factor
        self.rope_attn_factor = float(opt("rope.scaling.attn_factor", 1.0))
        self.n_ctx_orig = int(opt("rope.scaling.original_context_length", self.n_ctx_train))
        if self.rope_scaling == "yarn" and self.n_ctx_orig <= 0:
            raise ModelError(f"{path}: yarn needs {a}.rope.scaling.original_context_length")
        ff = self.tensors.get("rope_freqs.weight")
        self.freq_factors = self.deq("rope_freqs.weight").reshape(-1) if ff is not None else None
        if self.freq_factors is not None and self.freq_factors.size < self.n_rot // 2:
            raise ModelError(f"{path}: rope_freqs.weight has {self.freq_factors.size} values, "
                             f"want {self.n_rot // 2}")
        if self.rope_scaling == "llama3" and self.freq_factors is None:
            raise ModelError(f"{path}: rope scaling llama3 without rope_freqs.weight")

        # the experts (HF: num_experts, num_experts_per_tok, moe_intermediate_size,
        # shared_expert_intermediate_size, norm_topk_prob)
        self.n_expert_used = int(opt("expert_used_count", 0))
        self.n_ff_exp = int(opt("expert_feed_forward_length", self.n_ff))
        self.n_ff_shexp = int(opt("expert_shared_feed_forward_length", 0))
        self.expert_norm = bool(opt("expert_weights_norm",
                                    a not in ("qwen2moe", "deepseek2", "glm4moe", "dots1",
                                              "olmoe")))
        # DeepSeek (HF modeling_deepseek MoEGate): scoring_func, routed_scaling_factor,
        # n_group / topk_group, e_score_correction_bias; first_k_dense_replace dense layers
        self.expert_sigmoid = int(opt("expert_gating_func", 2 if a == "glm4moe" else 1)) == 2
        self.n_dense_lead = int(opt("leading_dense_block_count", 0))
        if a in ("glm4moe", "dots1"):  # n_shared_experts of moe_intermediate_size each
            self.n_ff_shexp = int(opt("expert_shared_count", 0)) * self.n_ff_exp
        self.expert_scale = float(opt("expert_weights_scale", 0.0) or 0.0)
        self.n_group = int(opt("expert_group_count", 0))
        self.n_group_used = int(opt("expert_group_used_count", 0))
        if a == "deepseek2":
            # multi-head latent attention, as HF's DeepseekV2Attention (q_lora_rank,
            # kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
            self.kv_lora = int(need("attention.kv_lora_rank"))
            self.q_lora = int(opt("attention.q_lora_rank", 0))
            self.qk_dim = int(need("attention.key_length_mla"))
            self.v_dim = int(need("attention.value_length_mla"))
            self.qk_nope = self.qk_dim - self.n_rot
            self.n_ff_shexp = int(opt("expert_shared_count", 0)) * self.n_ff_exp
            self.n_dense_lead = int(opt("leading_dense_block_count", 0))
            # YaRN's mscale_all_dim (the converter writes 0.1 x it)
            self.yarn_log_mul = float(opt("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
            if self.qk_nope <= 0 or self.kv_lora <= 0:
                raise ModelError(f"{path}: bad latent attention dims")
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise ModelError(f"{path}: {a}.expert_used_count {self.n_expert_used} must be in "
                             f"1..{self.n_expert} (expert_count)")
        if self.n_expert and self.n_ff_exp <= 0:
            raise ModelError(f"{path}: {a}: no expert width (expert_feed_forward_length)")

        # the architecture's traits
        self.rope_neox = bool(_field(r, "hyb.rope_neox", False)) if a == "llama" else True
        self.ffn_act = _field(r, "hyb.ffn_act", "silu") if a == "llama" else "silu"
        self.qk_norm = a in ("qwen3", "gemma3", "qwen3moe", "dots1", "olmoe") or (
            a == "glm4moe" and "blk.0.attn_q_norm.weight" in self.tensors)  # use_qk_norm
        self.qkv_bias = a in ("qwen2", "qwen2moe", "glm4moe")  # required; others: when present
        # the FFN's input norm (HF's post_attention_layernorm), GLM's GGUF name for it
        self.ffn_norm = "post_attention_norm.weight" if a == "glm4moe" else "ffn_norm.weight"
        if a == "deepseek2":
            self.rope_neox = False  # HF's interleaved rotary = llama.cpp's adjacent pairs
        self.post_norms = a == "gemma3"
        self.embd_scale = math.sqrt(self.n_embd) if a == "gemma3" else 1.0
        self.n_swa, self.swa_pattern, self.freq_base_swa = 0, 0, self.freq_base
        self.q_scale = 1.0 / math.sqrt(self.head_dim)
        if a == "gemma3":
            self.ffn_act = "gelu"
            # HF: query_pre_attn_scalar ** -0.5, which is head_dim but for the 27B
            # (62 layers), whose scalar is hidden_size / num_attention_heads
            if self.n_layer == 62:
                self.q_scale = 1.0 / math.sqrt(self.n_embd // self.n_head)
            self.n_swa = int(opt("attention.sliding_window", 0))
            self.swa_pattern = opt("attention.sliding_window_pattern", 6)
            if not isinstance(self.swa_pattern, int):
                raise ModelError(f"{path}: {a}.attention.sliding_window_pattern: only a number "
                                 "is supported by the reference")
            self.freq_base_swa = float(opt("rope.freq_base_swa", 10000.0))
            if opt("final_logit_softcapping", None) is not None:
                raise ModelError(f"{path}: final logit soft-capping is not supported by the "
                                 "reference")
        if self.ffn_act not in ACTS:
            raise ModelError(f"{path}: hyb.ffn_act '{self.ffn_act}' is not one of {ACTS}")

        emb = self._tensor("token_embd.weight")
        self.n_vocab = int(emb.shape[-1])  # GGUF ne1: rows of the [vocab][embd] matrix
        self.output_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        for il in range(self.n_layer):
            p = f"blk.{il}."
            need_t = []
            if self.qkv_bias:
                need_t += [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"]
            if self.qk_norm:
                need_t += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
            if self.post_norms:
                need_t += [p + "post_attention_norm.weight", p + "post_ffw_norm.weight"]
            if a == "deepseek2":
                need_t += [p + "attn_kv_a_mqa.weight", p + "attn_kv_a_norm.weight",
                           p + "attn_k_b.weight", p + "attn_v_b.weight",
                           p + "attn_output.weight"]
                need_t += ([p + "attn_q_a.weight", p + "attn_q_a_norm.weight",
                            p + "attn_q_b.weight"] if self.q_lora else [p + "attn_q.weight"])
            if self.is_moe(il):
                if not self.n_expert:
                    raise ModelError(f"{path}: {p}ffn_gate_inp.weight without "
                                     f"{a}.expert_count")
                need_t += [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight",
                           p + "ffn_down_exps.weight"]
                if a == "qwen2moe":
                    need_t += [p + "ffn_up_shexp.weight", p + "ffn_gate_inp_shexp.weight"]
            elif self.n_expert and a in MOE_ARCHS and not (
                    a in ("deepseek2", "glm4moe", "dots1") and il < self.n_dense_lead):
                raise ModelError(f"{path}: missing tensor {p}ffn_gate_inp.weight")
            for t in need_t:
                self._tensor(t)
            if self.is_moe(il):
                self._check_experts(p)

    def features(self):
        """The FEATURES of this model that forward(omit=...) can leave out."""
        f = []
        if self.qk_norm:
            f.append("qk_norm")
        if any(n.endswith(".bias") for n in self.tensors):
            f.append("bias")
        if self.post_norms:
            f.append("post_norms")
        if self.embd_scale != 1.0:
            f.append("embd_scale")
        if self.n_swa > 0 and any(self.is_swa(il) for il in range(self.n_layer)):
            f += ["swa", "swa_rope"]
        if self.rope_scaling == "yarn" and self.rope_factor != 1.0:
            f.append("yarn")
        if self.rope_scaling in ("linear", "yarn") and self.rope_factor != 1.0:
            f.append("rope_scaling")
        if self.freq_factors is not None:
            f.append("rope_freqs")
        moe = [il for il in range(self.n_layer) if self.is_moe(il)]
        if moe and self.expert_norm and self.n_expert_used > 1:
            f.append("topk_norm")
        if moe and self.n_expert_used < self.n_expert:
            f.append("topk")
        if any(f"blk.{il}.ffn_gate_inp_shexp.weight" in self.tensors for il in moe):
            f.append("shexp_gate")
        if any(f"blk.{il}.ffn_up_shexp.weight" in self.tensors for il in moe):
            f.append("shexp")
        if any(f"blk.{il}.exp_probs_b.bias" in self.tensors for il in moe):
            f.append("exp_bias")
        if moe and self.n_group > 1:
            f.append("groups")
        if self.arch == "deepseek2":
            f.append("mla_rope")
        return f

    def is_moe(self, il):
        """Whether layer il's FFN is a mixture of experts (it has a router)."""
        return f"blk.{il}.ffn_gate_inp.weight" in self.tensors

    def _check_experts(self, p):
        """The router's and experts' GGUF shapes (ne order) against the keys."""
        E, X, F = self.n_embd, self.n_expert, self.n_ff_exp
        want = {"ffn_gate_inp.weight": (E, X), "ffn_gate_exps.weight": (E, F, X),
                "ffn_up_exps.weight": (E, F, X), "ffn_down_exps.weight": (F, E, X)}
        up = self.tensors.get(p + "ffn_up_shexp.weight")
        if up is not None:
            S = self.n_ff_shexp or int(up.shape[1])
            want.update({"ffn_gate_shexp.weight": (E, S), "ffn_up_shexp.weight": (E, S),
                         "ffn_down_shexp.weight": (S, E)})
        if p + "ffn_gate_inp_shexp.weight" in self.tensors:
            want["ffn_gate_inp_shexp.weight"] = (E,)
        for name, ne in want.items():
            got = tuple(int(d) for d in self._tensor(p + name).shape.tolist())
            while len(got) > len(ne) and got[-1] == 1:  # trailing 1s are the same shape
                got = got[:-1]
            if got != ne:
                raise ModelError(f"{p}{name}: shape {list(got)}, want {list(ne)}")

    def is_swa(self, il):
        """Whether layer il is a sliding-window (local) layer (HF Gemma3's layer_types)."""
        if self.n_swa <= 0:
            return False
        return self.swa_pattern == 0 or il % self.swa_pattern < self.swa_pattern - 1

    # --- weights ---

    def _tensor(self, name):
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"missing tensor {name}")
        return t

    def qtype(self, name):
        return self._tensor(name).tensor_type

    def deq(self, name, rows=None):
        """Dequantized tensor as float64, numpy shape (GGUF dims reversed); rows selects rows."""
        t = self._tensor(name)
        data = t.data
        shape = [int(d) for d in reversed(t.shape.tolist())]
        if rows is not None:
            data = data.reshape(shape[0], -1)[rows]
            shape = [len(rows)] + shape[1:]
        try:
            w = gguf.quants.dequantize(np.ascontiguousarray(data), t.tensor_type)
        except NotImplementedError as e:
            raise ModelError(f"{name}: type {t.tensor_type.name} is not supported") from e
        return np.asarray(w, dtype=np.float64).reshape(shape)

    # --- building blocks ---

    def _matmul(self, x, name, emulate, w=None):
        """x [n, in] times weight [out, in]^T, with llama.cpp's input rounding if emulating.

        w: the (dequantized) matrix when it is a slice of tensor name (one expert)."""
        if w is None:
            w = self.deq(name)
        if w.ndim != 2 or w.shape[1] != x.shape[1]:
            raise ModelError(f"{name}: shape {w.shape} does not fit input width {x.shape[1]}")
        if emulate:
            rnd = _vec_dot_round(self.qtype(name))
            if rnd is not None:
                x = rnd(x)
        return x @ w.T

    def _moe(self, h, p, act, emulate, omit):
        """The sparse MoE block of layer prefix p on h [n, n_embd] (see the module comment)."""
        K, X = self.n_expert_used, self.n_expert
        logits = self._matmul(h, p + "ffn_gate_inp.weight", emulate)  # [n, E]
        if self.expert_sigmoid:  # DeepSeek-V3's scoring_func "sigmoid"
            pr = 1.0 / (1.0 + np.exp(-logits))
        else:
            pr = np.exp(logits - logits.max(axis=1, keepdims=True))
            pr /= pr.sum(axis=1, keepdims=True)
        choose = pr  # V3: chosen by score + e_score_correction_bias, weighted by score
        bname = p + "exp_probs_b.bias"
        if bname in self.tensors and "exp_bias" not in omit:
            choose = pr + self.deq(bname).reshape(1, -1)
        if self.n_group > 1 and "groups" not in omit:
            # V3's noaux_tc: a group scores the sum of its two best; the topk_group best
            n = choose.shape[0]
            grp = choose.reshape(n, self.n_group, -1)
            gscore = np.sort(grp, axis=2)[:, :, -2:].sum(axis=2)  # [n, n_group]
            keep = np.argsort(-gscore, axis=1, kind="stable")[:, : self.n_group_used]
            mask = np.zeros_like(gscore, dtype=bool)
            np.put_along_axis(mask, keep, True, axis=1)
            choose = np.where(np.repeat(mask, grp.shape[2], axis=1), choose, -np.inf)
        # stable descending sort: on an exact tie the lower index first, like torch.topk
        order = np.argsort(-choose, axis=1, kind="stable")
        if K < X:  # how close each token came to another choice
            # (in what chose: the logits, or V3's biased scores)
            srt = np.take_along_axis(logits if choose is pr and not self.expert_sigmoid
                                     else choose, order, axis=1)
            self.route_gap = np.minimum(self.route_gap, srt[:, K - 1] - srt[:, K])
        self.routes.append(np.sort(order[:, :K], axis=1))
        chosen = order if "topk" in omit else order[:, :K]
        w = np.take_along_axis(pr, chosen, axis=1)
        if self.expert_norm and "topk_norm" not in omit:
            w = w / w.sum(axis=1, keepdims=True)
        if self.expert_scale not in (0.0, 1.0):  # routed_scaling_factor
            w = w * self.expert_scale
        gate = self.deq(p + "ffn_gate_exps.weight")  # [E][n_ff_exp][n_embd]
        up = self.deq(p + "ffn_up_exps.weight")
        down = self.deq(p + "ffn_down_exps.weight")  # [E][n_embd][n_ff_exp]
        f = np.zeros_like(h)
        for e in np.unique(chosen):
            rows, slot = np.nonzero(chosen == e)  # the tokens that chose e, and where
            he = h[rows]
            g = self._matmul(he, p + "ffn_gate_exps.weight", emulate, gate[e])
            u = self._matmul(he, p + "ffn_up_exps.weight", emulate, up[e])
            y = self._matmul(self._ffn_act(g, u, act), p + "ffn_down_exps.weight", emulate,
                             down[e])
            f[rows] += w[rows, slot][:, None] * y
        if p + "ffn_up_shexp.weight" in self.tensors and "shexp" not in omit:
            g = self._matmul(h, p + "ffn_gate_shexp.weight", emulate)
            u = self._matmul(h, p + "ffn_up_shexp.weight", emulate)
            y = self._matmul(self._ffn_act(g, u, act), p + "ffn_down_shexp.weight", emulate)
            gname = p + "ffn_gate_inp_shexp.weight"
            if gname in self.tensors and "shexp_gate" not in omit:
                s = self._matmul(h, gname, emulate, self.deq(gname).reshape(1, -1))
                y = y / (1.0 + np.exp(-s))  # HF: sigmoid(shared_expert_gate(h)) * y
            f += y
        return f

    def _mla(self, h, p, pos, causal, emulate, omit):
        """DeepseekV2Attention as HF writes it, without the absorption trick: K and V
        are decompressed per head from the normed latent (k_b, v_b: the converter's
        split of kv_b_proj, GGUF [nope, R, H] and [R, v, H]: numpy [H][R][nope] and
        [H][v][R])."""
        n, H, P, N, R = h.shape[0], self.n_head, self.n_rot, self.qk_nope, self.kv_lora
        if self.q_lora:
            qa = self._rmsnorm(self._matmul(h, p + "attn_q_a.weight", emulate),
                               p + "attn_q_a_norm.weight")
            q = self._matmul(qa, p + "attn_q_b.weight", emulate)
        else:
            q = self._matmul(h, p + "attn_q.weight", emulate)
        q = q.reshape(n, H, N + P)
        q_nope, q_pe = q[..., :N], q[..., N:]
        ckv = self._matmul(h, p + "attn_kv_a_mqa.weight", emulate)  # [n, R + P]
        c = self._rmsnorm(ckv[:, :R], p + "attn_kv_a_norm.weight")
        k_pe = ckv[:, None, R:]  # [n, 1, P], one for all heads
        if "mla_rope" not in omit:
            q_pe = self._rope(q_pe, pos, False, False, omit)
            k_pe = self._rope(k_pe, pos, False, False, omit)
        if emulate and emulate != "act":  # the cache row [c | k_pe] is F16
            c, k_pe = _round_f16(c), _round_f16(k_pe)
        kb = self.deq(p + "attn_k_b.weight")  # [H][R][N]
        vb = self.deq(p + "attn_v_b.weight")  # [H][v][R]
        k_nope = np.einsum("tr,hrn->thn", c, kb)  # [n, H, N]
        v = np.einsum("tr,hvr->thv", c, vb)  # [n, H, v]
        qq = np.concatenate([q_nope, q_pe], axis=-1)
        kk = np.concatenate([k_nope, np.repeat(k_pe, H, axis=1)], axis=-1)
        # softmax_scale: qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2
        scale = 1.0 / math.sqrt(self.qk_dim)
        if self.rope_scaling == "yarn" and self.rope_factor > 1 and self.yarn_log_mul:
            m = 0.1 * self.yarn_log_mul * math.log(self.rope_factor) + 1.0
            scale *= m * m
        sc = np.einsum("qhd,khd->hqk", qq, kk) * scale + causal[None]
        sc -= sc.max(axis=-1, keepdims=True)
        pr = np.exp(sc)
        pr /= pr.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khv->qhv", pr, v).reshape(n, H * self.v_dim)
        return self._matmul(o, p + "attn_output.weight", emulate)

    def _bias(self, y, name, omit):
        if "bias" in omit or name not in self.tensors:
            return y
        b = self.deq(name).reshape(-1)
        if b.shape[0] != y.shape[-1]:
            raise ModelError(f"{name}: {b.shape[0]} values for width {y.shape[-1]}")
        return y + b

    def _rmsnorm(self, x, name):
        """x / rms(x) * w over the last axis (w: one value per element of that axis)."""
        w = self.deq(name).reshape(-1)
        if w.shape[0] != x.shape[-1]:
            raise ModelError(f"{name}: {w.shape[0]} values for width {x.shape[-1]}")
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def inv_freq(self, local=False, omit=()):
        """Per rotary pair: (inverse frequency, cos/sin magnitude), HF modeling_rope_utils."""
        d = self.n_rot
        base = self.freq_base_swa if local and "swa_rope" not in omit else self.freq_base
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if local and "swa_rope" not in omit:
            return inv, 1.0  # Gemma 3's rotary_emb_local: the default rope type
        if self.freq_factors is not None and "rope_freqs" not in omit:
            inv = inv / self.freq_factors[: d // 2]
        f = 1.0 if "rope_scaling" in omit else self.rope_factor
        mag = self.rope_attn_factor
        if self.rope_scaling == "yarn" and "yarn" not in omit and "rope_scaling" not in omit:
            r = _yarn(inv, d, base, f, self.n_ctx_orig, beta_fast=32.0, beta_slow=1.0)
            # DeepSeek's yarn: cos/sin times mscale(f, mscale) / mscale(f, mscale_all_dim),
            # 1 as its configs set both alike (the score scale takes the factor instead)
            deepseek = self.arch == "deepseek2" and getattr(self, "yarn_log_mul", 0.0)
            inv, mag = r[0], mag * (1.0 if deepseek else r[1])
        else:
            inv = inv / f
        return inv, mag

    def _rope(self, x, pos, neox, local=False, omit=()):
        """Rotary embedding of x [n, heads, head_dim] at positions pos [n]."""
        n_rot = self.n_rot
        inv, mag = self.inv_freq(local, omit)
        theta = pos[:, None].astype(np.float64) * inv[None, :]  # [n, n_rot/2]
        c = (np.cos(theta) * mag)[:, None, :]
        s = (np.sin(theta) * mag)[:, None, :]
        out = x.copy()
        if neox:
            a = x[..., : n_rot // 2]
            b = x[..., n_rot // 2 : n_rot]
            out[..., : n_rot // 2] = a * c - b * s
            out[..., n_rot // 2 : n_rot] = a * s + b * c
        else:
            a = x[..., 0:n_rot:2]
            b = x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = a * c - b * s
            out[..., 1:n_rot:2] = a * s + b * c
        return out

    def _ffn_act(self, g, u, act):
        if act == "silu":
            return g / (1.0 + np.exp(-g)) * u
        if act == "gelu":  # gelu_pytorch_tanh
            c = math.sqrt(2.0 / math.pi)
            return 0.5 * g * (1.0 + np.tanh(c * (g + 0.044715 * g**3))) * u
        if act == "relu":
            return np.maximum(g, 0.0) * u
        if act == "relu2":
            return np.maximum(g, 0.0) ** 2 * u
        if act == "dlrelu":
            return np.maximum(g, 0.0) * np.maximum(u, 0.0)
        raise ModelError(f"unknown activation {act}")

    # --- the forward pass ---

    def forward(self, tokens, rope_neox=None, act=None, emulate=False, omit=()):
        """Logits [len(tokens), n_vocab] (float64) for every position, causal attention.

        rope_neox / act override the file's RoPE type / FFN activation (None: the file's).
        emulate: False (exact), True (llama.cpp's roundings), "act" (matmul inputs only).
        omit: FEATURES to leave out (deliberately wrong references for the tests).
        Sets, for mixtures of experts, self.routes: per MoE layer the K experts each
        position chose [n, K] (ascending), and self.route_gap [n]: per position the
        smallest gap between its K-th and (K+1)-th router logits (inf: none).
        """
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ModelError("need at least one token")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ModelError(f"token id out of range 0..{self.n_vocab - 1}")
        omit = set(omit)
        if omit - set(FEATURES):
            raise ModelError(f"unknown feature(s) {sorted(omit - set(FEATURES))} "
                             f"(known: {', '.join(FEATURES)})")
        neox = self.rope_neox if rope_neox is None else bool(rope_neox)
        self.routes, self.route_gap = [], np.full(len(toks), math.inf)
        act = self.ffn_act if act is None else act
        n, hd, nh, nkv = len(toks), self.head_dim, self.n_head, self.n_head_kv
        pos = np.arange(n)
        # the embedding rows are exact (get_rows dequantizes, no rounding)
        x = self.deq("token_embd.weight", rows=toks)
        if "embd_scale" not in omit:
            x = x * self.embd_scale
        causal = np.triu(np.full((n, n), -np.inf), k=1)
        # key j is outside query i's window when j <= i - W (HF: kv_idx > q_idx - W is kept)
        window = causal.copy()
        if self.n_swa > 0:
            window[np.tril(np.ones((n, n), dtype=bool), k=-self.n_swa)] = -np.inf
        for il in range(self.n_layer):
            p = f"blk.{il}."
            local = self.is_swa(il)
            h = self._rmsnorm(x, p + "attn_norm.weight")
            if self.arch == "deepseek2":
                x = x + self._mla(h, p, pos, causal, emulate, omit)
                h = self._rmsnorm(x, p + "ffn_norm.weight")
                if self.is_moe(il):
                    f = self._moe(h, p, act, emulate, omit)
                else:
                    g = self._matmul(h, p + "ffn_gate.weight", emulate)
                    u = self._matmul(h, p + "ffn_up.weight", emulate)
                    f = self._matmul(self._ffn_act(g, u, act), p + "ffn_down.weight", emulate)
                x = x + f
                continue
            if p + "attn_qkv.weight" in self.tensors:  # Phi-3's qkv_proj: q, k, v in order
                qkv = self._matmul(h, p + "attn_qkv.weight", emulate)
                q, k, v = np.split(qkv, [nh * hd, (nh + nkv) * hd], axis=1)
            else:
                q = self._matmul(h, p + "attn_q.weight", emulate)
                k = self._matmul(h, p + "attn_k.weight", emulate)
                v = self._matmul(h, p + "attn_v.weight", emulate)
            q = self._bias(q, p + "attn_q.bias", omit)
            k = self._bias(k, p + "attn_k.bias", omit)
            v = self._bias(v, p + "attn_v.bias", omit)
            if self.arch == "olmoe" and "qk_norm" not in omit:  # OlmoeAttention: whole rows
                q = self._rmsnorm(q, p + "attn_q_norm.weight")
                k = self._rmsnorm(k, p + "attn_k_norm.weight")
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if self.qk_norm and "qk_norm" not in omit and self.arch != "olmoe":
                q = self._rmsnorm(q, p + "attn_q_norm.weight")
                k = self._rmsnorm(k, p + "attn_k_norm.weight")
            q = self._rope(q, pos, neox, local, omit)
            k = self._rope(k, pos, neox, local, omit)
            # gemma3 and phi3 scale q before attention, which then scales by 1
            # (matters only for emulate's rounding of q)
            pre = self.arch in ("gemma3", "phi3")
            if pre:
                q = q * self.q_scale
            if emulate and emulate != "act":  # F16 KV cache; FA converts Q to F16 for the dots
                k, v, q = _round_f16(k), _round_f16(v), _round_f16(q)
            # GQA: consecutive query heads share one KV head
            kk = np.repeat(k, nh // nkv, axis=1)
            vv = np.repeat(v, nh // nkv, axis=1)
            mask = window if local and "swa" not in omit else causal
            s = np.einsum("qhd,khd->hqk", q, kk) * (1.0 if pre else self.q_scale) + mask[None]
            s -= s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            if emulate and emulate != "act":  # without FA, V·p takes p as F16
                pr = _round_f16(pr)
            o = np.einsum("hqk,khd->qhd", pr, vv).reshape(n, nh * hd)
            o = self._bias(self._matmul(o, p + "attn_output.weight", emulate),
                           p + "attn_output.bias", omit)
            if self.post_norms and "post_norms" not in omit:
                o = self._rmsnorm(o, p + "post_attention_norm.weight")
            x = x + o
            h = self._rmsnorm(x, p + self.ffn_norm)
            if self.is_moe(il):
                f = self._moe(h, p, act, emulate, omit)
            else:
                if self.arch == "phi3":  # gate_up_proj: gate, then up (HF's chunk(2))
                    g, u = np.split(self._matmul(h, p + "ffn_up.weight", emulate), 2, axis=1)
                else:
                    g = self._matmul(h, p + "ffn_gate.weight", emulate)
                    u = self._matmul(h, p + "ffn_up.weight", emulate)
                f = self._matmul(self._ffn_act(g, u, act), p + "ffn_down.weight", emulate)
            if self.post_norms and "post_norms" not in omit:
                f = self._rmsnorm(f, p + "post_ffw_norm.weight")
            x = x + f
        h = self._rmsnorm(x, "output_norm.weight")
        return self._matmul(h, self.output_name, emulate)

    def greedy(self, tokens, n_new, **kw):
        """Greedy continuation (argmax, first index on ties), recomputed from scratch."""
        seq = list(tokens)
        out = []
        for _ in range(n_new):
            t = int(np.argmax(self.forward(seq, **kw)[-1]))
            out.append(t)
            seq.append(t)
        return out


def _yarn(inv_freq, dim, base, factor, orig_ctx, beta_fast, beta_slow):
    """HF's _compute_yarn_parameters: (inverse frequencies, attention factor).

    inv_freq: the unscaled inverse frequencies (after any frequency factors)."""

    def correction_dim(n_rotations):
        return dim * math.log(orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # HF's linear_ramp_factor: no singularity
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp  # 1: keep the original frequency (the fast dims)
    inv = inv_freq / factor * (1.0 - extrapolation) + inv_freq * extrapolation
    mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv, mscale


def llama3_freq_factors(n_rot, base, factor, orig_ctx, low_freq_factor=1.0, high_freq_factor=4.0):
    """Per rotary pair, what HF's llama3 rope type divides the inverse frequency by
    (_compute_llama3_parameters); llama.cpp's converter stores it as rope_freqs.weight."""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    low_wavelen = orig_ctx / low_freq_factor
    high_wavelen = orig_ctx / high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    scaled = np.where(medium, smoothed, scaled)
    return inv / scaled


def parse_tokens(s):
    try:
        toks = [int(t) for t in s.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise ModelError(f"bad token list '{s}' (want comma-separated integers)") from None
    if not toks:
        raise ModelError("empty token list")
    return toks


def parse_features(s):
    feats = [f for f in s.replace(" ", "").split(",") if f]
    bad = [f for f in feats if f not in FEATURES]
    if bad:
        raise ModelError(f"unknown feature(s) {','.join(bad)} (known: {', '.join(FEATURES)})")
    return feats


def main(argv=None):
    ap = argparse.ArgumentParser(description="reference llama forward pass (test oracle)")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("-o", "--out", help="write float32 logits [n_tokens][n_vocab] here")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy tokens")
    ap.add_argument("--neox", choices=("file", "yes", "no"), default="file")
    ap.add_argument("--act", choices=ACTS)
    ap.add_argument("--omit", default="", help="comma-separated FEATURES to leave out: "
                    + ", ".join(FEATURES))
    ap.add_argument("--emulate", action="store_true", help="round like llama.cpp's CPU backend")
    a = ap.parse_args(argv)
    try:
        m = Model(a.model)
        toks = parse_tokens(a.tokens)
        neox = None if a.neox == "file" else a.neox == "yes"
        omit = parse_features(a.omit)
        logits = m.forward(toks, rope_neox=neox, act=a.act, emulate=a.emulate, omit=omit)
        if a.out:
            logits.astype("<f4").tofile(a.out)
        print("top1:", ",".join(str(int(i)) for i in logits.argmax(axis=1)))
        if a.greedy:
            g = m.greedy(toks, a.greedy, rope_neox=neox, act=a.act, emulate=a.emulate,
                         omit=omit)
            print("greedy:", ",".join(map(str, g)))
    except ModelError as e:
        sys.stderr.write(f"reference.py: {e}\n")
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        sys.stderr.write(f"reference.py: {a.model}: {type(e).__name__}: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
