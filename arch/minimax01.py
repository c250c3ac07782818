"""MiniMax-Text-01 (minimax-01): lightning attention layers and softmax attention layers in one decoder, every FFN
a softmax-routed mixture of experts.

Seven layers of every eight (``full_attention_interval``, or the flags of ``attention.recurrent_layers``) mix tokens
by lightning attention: q, k and v from one projection through SiLU; per head a d x d state kv that decays by
exp(-slope) per token, the head's slope ALiBi's geometric series scaled down layer by layer (1 - il / (n_layer - 1)
+ 1e-5). Within a ubatch each sequence's tokens are taken as one block: the output is q decayed by its distance into
the block times the old state, plus the block's own causal scores (k^T q) decayed by the tokens' distance, times v;
the new state is the old one decayed by the block's length plus k decayed by its distance to the block's end, times
v. The read-out is RMS-normalised (``attn_norm_2``) and gated by sigmoid(attn_gate), then W_o. The other layers are
grouped-query attention with NeoX RoPE over ``rope.dimension_count`` of each head. Each residual adds the
normalised input times ``residual_scale`` (not the input itself), for the attention and the FFN alike.

The decays are inputs the context fills per ubatch from the positions (:data:`RULES`, llama.cpp's
llm_graph_input_la): the slopes, each token's q and k decay exponents and the block's pairwise ones.
The memory is the hybrid kind: a KV cache for the attention layers, for the lightning layers a state of d x d per
head and sequence and a rolling part of no width, which llama.cpp's graph still reads.
References: MiniMax 2025, "MiniMax-01: Scaling Foundation Models with Lightning Attention"; Qin et al. 2024,
"Lightning Attention-2"; llama.cpp src/models/minimax-01.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.batch import UBatch
from graphir.errors import MetadataError
from graphir.graph.floats import f32, inv_sqrt, log2f, powf
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model import hf_config, presets, ubatch_inputs
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"  # llama.cpp's key; gguf-py has no constant for it yet


# ---- the decays, filled per ubatch -----------------------------------------------------------------------------

def slopes(n_head: int) -> np.ndarray:
    """Each head's decay rate: ALiBi's geometric series, start = ratio = 2^-(2^-(log2(n_head) - 3)), in glibc's
    float32 functions as llama.cpp computes them."""
    start = powf(2.0, -powf(2.0, -f32(log2f(n_head) - 3.0)))
    return np.array([f32(start * powf(start, h)) for h in range(n_head)], np.float32)


def _blocks(ub: UBatch) -> tuple[int, int, np.ndarray]:
    """The ubatch as equal blocks, one per sequence: (n_seqs, n_seq_tokens, each token's position relative to its
    block's lowest [n_seqs, n_seq_tokens]). A block's data goes where llama.cpp puts it: at its first sequence's
    rank among the ubatch's sequences (llama.cpp's seq_idx)."""
    first = [ids[0] for ids in ub.seq_ids]
    n_seqs = len(dict.fromkeys(tuple(ids) for ids in ub.seq_ids))
    n_st = len(ub) // n_seqs
    rank = {s: i for i, s in enumerate(sorted({s for ids in ub.seq_ids for s in ids}))}
    p0 = {}
    for s, p in zip(first, ub.pos.tolist()):
        p0[s] = min(p0.get(s, p), p)
    rel = np.zeros((n_seqs, n_st), np.int64)
    for t, (s, p) in enumerate(zip(first, ub.pos.tolist())):
        rel[rank[s], t % n_st] = p - p0[s]
    return n_seqs, n_st, rel


def _slopes(facts: Mapping[str, Any], ub: UBatch) -> np.ndarray:
    return slopes(int(facts["n_head"]))


def _token_decay(until_end: bool) -> ubatch_inputs.Rule:
    """q's exponent -slope * (rel + 1), or k's -slope * (n_seq_tokens - rel - 1): [n_seqs, n_seq_tokens, n_head, 1]."""
    def rule(facts: Mapping[str, Any], ub: UBatch) -> np.ndarray:
        n_seqs, n_st, rel = _blocks(ub)
        steps = (n_st - rel - 1) if until_end else rel + 1
        out = -slopes(int(facts["n_head"]))[None, None, :] * steps[:, :, None].astype(np.float32)
        return out.astype(np.float32).reshape(n_seqs, n_st, -1, 1)
    return rule


def _diag_decay(facts: Mapping[str, Any], ub: UBatch) -> np.ndarray:
    """Query j's exponent over key i in its block, -slope * (rel_j - rel_i), -inf for a later key:
    [n_seqs, n_head, n_seq_tokens (queries), n_seq_tokens (keys)]."""
    n_seqs, n_st, rel = _blocks(ub)
    dist = rel[:, :, None] - rel[:, None, :]  # [seq, j, i]
    neg = -slopes(int(facts["n_head"]))
    with np.errstate(invalid="ignore"):
        out = neg[None, :, None, None] * dist[:, None, :, :].astype(np.float32)
    return np.where(dist[:, None] >= 0, out, -np.inf).astype(np.float32)


RULES = {"slopes": _slopes, "q_decay_exp": _token_decay(False), "k_decay_exp": _token_decay(True),
         "diag_decay_exp": _diag_decay}
for _role, _rule in RULES.items():
    ubatch_inputs.register(_role, _rule)


class MiniMax01(Architecture):
    name = "minimax-01"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS,)
    keys = MOE_KEYS + (
        Key("residual_scale", L.RESIDUAL_SCALE, float, required=True),
        Key("recurrent_layers", RECURRENT_LAYERS, tuple, (), minimum=0, maximum=1),  # (): by the interval
        Key("full_attention_interval", L.FULL_ATTENTION_INTERVAL, int, 8, minimum=1),
    )

    def __init__(self, hp: HParams):
        check_experts(hp, self.name)
        if not hp.n_expert:
            raise MetadataError(f"a '{self.name}' model needs experts ('{L.EXPERT_COUNT.format(arch=self.name)}' > 0)")
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise MetadataError(f"heads of {hp.n_embd_head_k} keys ('{A.KEY_LENGTH.format(arch=self.name)}') and "
                                f"{hp.n_embd_head_v} values ('{A.VALUE_LENGTH.format(arch=self.name)}') must be equal")
        if hp.n_layer < 2:  # the slopes' layer scale divides by n_layer - 1
            raise MetadataError(f"'{L.BLOCK_COUNT.format(arch=self.name)}' = {hp.n_layer}: lightning attention "
                                f"scales its decays over at least 2 layers")
        super().__init__(hp)

    def recurrent(self, il: int) -> bool:
        """Whether layer il is a lightning attention layer: as the file's flags say, else all but every
        ``full_attention_interval``-th."""
        hp = self.hp
        if hp.recurrent_layers:
            return bool(hp.recurrent_layers[il])
        return (il + 1) % hp.full_attention_interval != 0

    @property
    def n_head(self) -> int:
        return self.hp.head_count(0)

    def layers(self) -> LayerNeeds:
        """Lightning: a d x d state per head (its rolling part has no width); attention: a KV cache."""
        hp, d = self.hp, self.hp.n_embd_head_k
        return tuple(Recurrent(0, d * d * self.n_head) if self.recurrent(il)
                     else Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) for il in range(hp.n_layer))

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, F, Hd = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff, self.n_head * hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            mixer = ([spec(T.ATTN_NORM_2, (Hd,), il, kind="vector"), spec(T.ATTN_QKV, (E, 3 * Hd), il),
                      spec(T.ATTN_GATE, (E, Hd), il)] if self.recurrent(il) else fused_or_split_qkv_tensors(hp, il))
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer, spec(T.ATTN_OUT, (Hd, E), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE_INP, (E, X), il),
                     spec(T.FFN_GATE_EXP, (E, F, X), il, optional=True), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                     spec(T.FFN_UP_EXP, (E, F, X), il)]
            specs += layer + layer_scales(layer, il, X)  # read: the attention layers' Q, K, V and output scales
        return specs

    # ---- graph -------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        q, k, v = b.build_qkv(h, il)
        q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(self.hp.n_embd_head_k))

    def lightning(self, b: GraphBuilder, h: Node, decays: dict[str, Node], il: int) -> Node:
        """Lightning attention of each sequence's block ([E, n_tokens] in and out)."""
        hp = self.hp
        E, d, H, Ts, S = hp.n_embd, hp.n_embd_head_k, self.n_head, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        b.build_rs("r")  # of no width: read as llama.cpp's graph reads it
        layer_scale = f32(1.0 - 1.0 * il / (hp.n_layer - 1) + 1e-5)
        rate = b.op("scale", decays["slopes"], s=layer_scale, name="slope_rate")
        x = b.reshape(h, (E, Ts, 1, S), name="attn_norm.seqs")
        qkv = b.op("silu", b.mm(b.w(T.ATTN_QKV, il), x, name="QKVcur"), name="QKVcur_silu")
        qkv = b.reshape(qkv, (3 * d, H, Ts, S), name="QKVcur.heads")
        q, k, v = (b.op("view", qkv, shape=(d, H, Ts, S), strides=(1, 3 * d, 3 * d * H, 3 * d * H * Ts),
                        offset=i * d, name=tag) for i, tag in enumerate(("Qcur", "Kcur", "Vcur")))
        kv_old = b.reshape(b.build_rs("s"), (d, d, H, S), name="kv_old")
        q_decay, k_decay, diag_decay = (
            b.op("exp", b.op("scale", decays[f"{tag}_exp"], s=layer_scale, name=f"{tag}_exp.scaled"), name=tag)
            for tag in ("q_decay", "k_decay", "diag_decay"))

        q_s = b.op("permute", b.op("mul", q, q_decay, name="q_s"), axes=(0, 2, 1, 3), name="q_s_trans")
        none_diag = b.op("mul_mat", kv_old, q_s, name="qkv_none_diag")
        qk = b.op("mul_mat", b.op("permute", k, axes=(0, 2, 1, 3), name="k_trans"),
                  b.op("permute", q, axes=(0, 2, 1, 3), name="q_trans"), name="qk")
        qk = b.op("mul", qk, diag_decay, name="qk_s")
        v_t = b.op("cont", b.op("permute", v, axes=(1, 2, 0, 3), name="v_perm"), name="v_trans")
        out = b.op("add", none_diag, b.op("mul_mat", v_t, qk, name="qkv_diag"), name="qkv")

        block = b.op("exp", b.op("scale", rate, s=-1 * Ts, name="slopes_neg"), name="block_decay")
        kv_old = b.op("mul", kv_old, b.reshape(block, (1, 1, H), name="block_decay_3d"), name="kv_old_s")
        k_d = b.op("mul", k, k_decay, name="k_after_decay")
        k_d = b.op("cont", b.op("permute", k_d, axes=(1, 2, 0, 3), name="k_after_decay_perm"),
                   name="k_after_decay_trans")
        kv_new = b.op("add", kv_old, b.op("mul_mat", k_d, v_t, name="kv_cur"), name="kv_new")
        b.store_rs("s", b.reshape(kv_new, (d * d * H, S), name="kv_new.rows"))

        out = b.op("cont", b.op("permute", out, axes=(0, 2, 1, 3), name="qkv_perm"), name="qkv_permuted")
        out = b.norm(b.reshape(out, (d * H, Ts, 1, S), name="qkv.rows"), T.ATTN_NORM_2, il, name="qkv_norm")
        g = b.op("sigmoid", b.mm(b.w(T.ATTN_GATE, il), x, name="g"), name="g_sigm")
        out = b.mm(b.w(T.ATTN_OUT, il), b.op("mul", g, out, name="attn_gated"), name="attn_out.seqs")
        return b.reshape(out, (E, b.n_tokens), name="attn_out")

    def residual(self, b: GraphBuilder, x: Node, tag: str) -> Node:
        return b.op("scale", x, s=f32(self.hp.residual_scale), name=f"residual_scaled_{tag}")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        H = self.n_head
        decays = {"slopes": b.input("slopes", "f32", (H,), n_head=H),
                  "q_decay_exp": b.input("q_decay_exp", "f32", (1, H, Ts, S), n_head=H),
                  "k_decay_exp": b.input("k_decay_exp", "f32", (1, H, Ts, S), n_head=H),
                  "diag_decay_exp": b.input("diag_decay_exp", "f32", (Ts, Ts, H, S), n_head=H)}
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = self.lightning(b, h, decays, il) if self.recurrent(il) else self.attention(b, h, pos, il)
            a, h = b.last_layer_rows((a, "attn_out.rows"), (h, "attn_norm.rows"))
            x = b.op("add", a, self.residual(b, h, "attn"), name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_moe_ffn(h, gate_inp=b.w(T.FFN_GATE_INP, il), up_exps=b.w(T.FFN_UP_EXP, il),
                                gate_exps=b.w_opt(T.FFN_GATE_EXP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True)
            x = b.op("add", f, self.residual(b, h, "ffn"), name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 80 layers of width 6144: lightning attention in seven of every eight, softmax attention (64 query and 8 KV
    # heads of 128, NeoX RoPE over 64 of each head) in every eighth; every FFN 32 experts of 9216, 2 per token;
    # residuals of the normalised inputs times (2 * 80)^(1/4)
    "MiniMax-Text-01": Preset("minimax-01", {
        L.CONTEXT_LENGTH: 10240000, L.EMBEDDING_LENGTH: 6144, L.BLOCK_COUNT: 80, L.FEED_FORWARD_LENGTH: 9216,
        A.HEAD_COUNT: 64, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.DIMENSION_COUNT: 64,
        R.FREQ_BASE: 10000000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 32, L.EXPERT_USED_COUNT: 2,
        L.RESIDUAL_SCALE: 3.5565588200778455, L.VOCAB_SIZE: 200064,
    }, tied=False, include=f"{presets.SPLIT_QKV}|{presets.EXPERT_GATES}", f32=presets.ROUTER_F32,
        source="MiniMaxAI/MiniMax-Text-01 config.json"),
})


# ---- Hugging Face: convert_hf_to_gguf's MiniMaxText01Model -------------------------------------------------

def _residual_scale(c: Config) -> float:
    """layernorm_full_attention_alpha: the converter stores the one alpha its three residuals share."""
    alphas = [c.find(f"layernorm_{part}_alpha", kind="number") for part in ("full_attention", "linear_attention", "mlp")]
    if len(set(alphas)) != 1:
        raise c.error(f"layernorm_*_alpha differ ({alphas}): one residual_scale holds them")
    return alphas[0]


MINIMAX_01 = TEXT + (
    derived(L.RESIDUAL_SCALE, _residual_scale),
    hf(R.DIMENSION_COUNT, "rotary_dim"),
    VOCAB,
)
hf_config.register(Family("minimax-01", MINIMAX_01, {"tie_word_embeddings": False},
                          lambda c: f"{presets.SPLIT_QKV}|{presets.EXPERT_GATES}"),
                   "MiniMaxText01ForCausalLM")
