"""Granite 4.0 hybrids (granitehybrid): Mamba-2 layers and attention layers in one decoder.

A layer whose ``attention.head_count_kv`` entry is 0 is a Mamba-2 block (arch/mamba.py), the others are
grouped-query attention, RoPE'd unless ``rope.scaling.finetuned`` is false (Granite 4.0-H has no positions
at all); every layer then has a SwiGLU FFN: dense (Granite-4.0-H-Micro), or with ``expert_count`` > 0 a mixture of
experts (each token through its top ``expert_used_count``, softmax weights renormalised) plus, when
``expert_shared_feed_forward_length`` > 0, a shared SwiGLU expert every token takes, ungated
(Granite-4.0-H-Tiny and -Small). Granite's multipliers scale the token embeddings, both residual branches and
(as a divisor) the logits, and ``attention.scale`` replaces 1/sqrt(head size). The memory holds a KV cache for
the attention layers and state cells for the others (the ``hybrid`` kind).
Reference: IBM 2025, "Granite 4.0"; llama.cpp src/models/granite-hybrid.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import Llama
from graphir.model.moe import MOE_KEYS
from graphir.arch.mamba import Mamba2
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import Key, f32
from graphir.model.tensors import TensorSpec, spec
from graphir.model import presets
from graphir.model.presets import Preset


class GraniteHybrid(Llama):
    name = "granitehybrid"
    per_layer = True  # head_count_kv per layer says which layers are recurrent
    keys = Mamba2.keys + (
        Key("logit_scale", Keys.LLM.LOGIT_SCALE, float, 0.0),  # 0: none
        Key("residual_scale", Keys.LLM.RESIDUAL_SCALE, float, 0.0),
        Key("embedding_scale", Keys.LLM.EMBEDDING_SCALE, float, 0.0),
        Key("rope_finetuned", Keys.Rope.SCALING_FINETUNED, bool, True),  # Granite's switch for RoPE
        *MOE_KEYS,
        Key("n_ff_shexp", Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: no shared expert
    )

    def __init__(self, hp):  # type: ignore[no-untyped-def]
        # the Mamba-2 block of the recurrent layers (llama.cpp loads its conv bias as optional, but its graph
        # adds it unconditionally: a file without it crashes there, and is refused here)
        self.ssm = Mamba2(hp)
        super().__init__(hp)

    def recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Recurrent(self.ssm.n_embd_r, self.ssm.n_embd_s) if self.recurrent(il)
                     else Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) for il in range(hp.n_layer))

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        return self.ssm.mixer_tensors(il) if self.recurrent(il) else super().mix_tensors(il)

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        E, F = self.hp.n_embd, self.hp.ff_length(il)
        if self.n_expert():
            S = self.hp.n_ff_shexp
            shared = [spec(T.FFN_GATE_SHEXP, (E, S), il), spec(T.FFN_UP_SHEXP, (E, S), il),
                      spec(T.FFN_DOWN_SHEXP, (S, E), il)] if S else []
            return super().ffn_tensors(il) + shared
        return super().ffn_tensors(il) + [spec(t, (n,), il, "bias", kind="vector", optional=True)
                                          for t, n in ((T.FFN_GATE, F), (T.FFN_UP, F), (T.FFN_DOWN, E))]

    def roped(self, il: int) -> bool:
        return bool(self.hp.rope_finetuned)

    def mix(self, b: GraphBuilder, h: Node, pos: Node, freq_factors: Node | None, il: int) -> Node:
        if not self.recurrent(il):
            return super().mix(b, h, pos, freq_factors, il)
        hp = self.hp
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        return self.ssm.mixer(b, b.reshape(h, (hp.n_embd, Ts, S), name="attn_norm.seqs"), il)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        if self.n_expert():
            out = self.moe(b, h, il)
            if not self.hp.n_ff_shexp:
                return out
            w = b.w
            shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il),  # type: ignore[arg-type]
                                 down=w(T.FFN_DOWN_SHEXP, il), name="ffn_shexp")  # type: ignore[arg-type]
            return b.op("add", out, shared, name="ffn_out")
        return b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=b.w(T.FFN_GATE, il),
                           gate_b=b.w(T.FFN_GATE, il, "bias"), down=b.w(T.FFN_DOWN, il),  # type: ignore[arg-type]
                           down_b=b.w(T.FFN_DOWN, il, "bias"))

    def scaled(self, b: GraphBuilder, x: Node, s: float, name: str) -> Node:
        return b.op("scale", x, s=s, name=name) if s else x

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = self.scaled(b, b.build_inp_embd(b.w(T.TOKEN_EMBD)), hp.embedding_scale, "inp_scaled")
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                a = self.mix(b, b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm"), pos, None, il)
                if il == hp.n_layer - 1:  # only requested rows go through the last FFN and the head
                    a = b.op("get_rows", a, out_ids, name="mix_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", self.scaled(b, a, hp.residual_scale, "mix_out.scaled"), x, name="ffn_inp")
                f = self.ffn(b, b.build_norm(x, b.w(T.FFN_NORM, il), name="ffn_norm"), il)
                x = b.op("add", self.scaled(b, f, hp.residual_scale, "ffn_out.scaled"), x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        head, bias = self.lm_head(b)
        b.build_output(x, head, bias)
        if hp.logit_scale:
            b.outputs["logits"] = b.op("scale", b.outputs["logits"], s=f32(1.0 / hp.logit_scale), name="result_scaled")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


def _granite4h(E: int, n_head: int, n_head_kv: int, n_ff_exp: int, n_ff_shexp: int, n_expert: int, n_used: int,
               n_ssm_head: int, source: str) -> Preset:
    """Granite 4.0-H with experts: 40 layers, attention (heads of 128, no positions) at layers 5, 15, 25 and 35,
    Mamba-2 (heads of 64, one group, 128 states) elsewhere, a mixture of experts plus a shared expert in every
    layer, the LM head tied. Granite's four multipliers (embedding, residual, attention, logits) are left out: the
    public figures found here (model card, config excerpts) do not give them, so these graphs lack their scale
    nodes and scale scores by 1/sqrt(128)."""
    return Preset("granitehybrid", {
        # a context of 2^20: what convert_hf_to_gguf writes for a Granite hybrid without RoPE (not the config's)
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: n_ff_exp,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: [n_head_kv if il % 10 == 5 else 0 for il in range(40)],
        A.LAYERNORM_RMS_EPS: 1e-5, R.SCALING_FINETUNED: False, S.CONV_KERNEL: 4, S.INNER_SIZE: 64 * n_ssm_head,
        S.STATE_SIZE: 128, S.TIME_STEP_RANK: n_ssm_head, S.GROUP_COUNT: 1, L.VOCAB_SIZE: 100352,
        L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: n_used, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp,
    }, tied=True, include=presets.EXPERT_GATES,
        f32=presets.ROUTER_F32 + r"|blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)", source=source)


presets.register({
    "Granite-4.0-H-Tiny": _granite4h(1536, 12, 4, 512, 1024, 64, 6, 48, "ibm-granite/granite-4.0-h-tiny model card "
                                     "and config excerpts (sizes; not the multipliers)"),
    "Granite-4.0-H-Small": _granite4h(4096, 32, 8, 768, 1536, 72, 10, 128, "ibm-granite/granite-4.0-h-small model "
                                      "card and config excerpts (sizes; not the multipliers)"),
})
