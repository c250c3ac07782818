"""Granite 4.0 hybrids (granitehybrid): Mamba-2 layers and attention layers in one decoder.

A layer whose ``attention.head_count_kv`` entry is 0 is a Mamba-2 block (arch/mamba.py), the others are
grouped-query attention, RoPE'd unless ``rope.scaling.finetuned`` is false (Granite 4.0-H has no positions
at all); every layer then has a SwiGLU FFN. Granite's multipliers scale the token embeddings, both residual
branches and (as a divisor) the logits, and ``attention.scale`` replaces 1/sqrt(head size). The memory holds
a KV cache for the attention layers and state cells for the others (the ``hybrid`` kind).
Mixture-of-experts FFNs (Granite-4.0-H-Tiny and -Small) are not built yet: such a file is refused.
Reference: IBM 2025, "Granite 4.0"; llama.cpp src/models/granite-hybrid.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import Llama
from graphir.arch.mamba import Mamba2
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import Key, f32
from graphir.model.tensors import TensorSpec, spec


class GraniteHybrid(Llama):
    name = "granitehybrid"
    per_layer = True  # head_count_kv per layer says which layers are recurrent
    keys = Mamba2.keys + (
        Key("logit_scale", Keys.LLM.LOGIT_SCALE, float, 0.0),  # 0: none
        Key("residual_scale", Keys.LLM.RESIDUAL_SCALE, float, 0.0),
        Key("embedding_scale", Keys.LLM.EMBEDDING_SCALE, float, 0.0),
        Key("rope_finetuned", Keys.Rope.SCALING_FINETUNED, bool, True),  # Granite's switch for RoPE
        Key("n_expert", Keys.LLM.EXPERT_COUNT, int, 0),
    )

    def __init__(self, hp):  # type: ignore[no-untyped-def]
        if hp.n_expert:
            raise MetadataError(f"a '{self.name}' model with {hp.n_expert} experts per layer "
                                f"({Keys.LLM.EXPERT_COUNT.format(arch=self.name)}) needs mixture-of-experts FFNs, "
                                f"which graphir does not build yet")
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
