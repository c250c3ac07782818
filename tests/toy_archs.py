"""Three test-only families that show how the next ones are expressed: each is hparams in, layer needs and a
graph out, with no cache in sight. Importing this module registers them.

- ``test-iswa``: Llama with Gemma-2's interleaving, every even layer attending through a sliding window of
  ``attention.sliding_window`` positions; its context gets an interleaved pair of KV caches (``iswa``).
- ``test-hybrid``: Jamba-style, a per-layer ``attention.head_count_kv`` array whose zeros mark Mamba layers
  and whose other entries mark Llama attention layers; its context gets a KV cache and a recurrent memory
  behind one interface (``hybrid``).
- ``test-mla-hybrid``: the same interleaving over DeepSeek-V2's multi-head latent attention (Kimi-Linear's
  shape): its context gets a latent cache and a recurrent memory behind one interface (``hybrid``).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T

from graphir.arch.deepseek2 import DeepSeek2
from graphir.arch.llama import Llama
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LatentAttention, LayerNeeds
from graphir.model import ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import SlidingWindow
from graphir.model.tensors import TensorSpec, tensor_name


def mamba_mix(b: GraphBuilder, h: Node, il: int) -> Node:
    """A Mamba layer's mixer over the ubatch's tokens [n_embd, n_tokens], as its sequences of equal length."""
    return b.reshape(ssm.mamba_layer(b, h, il), (b.hp.n_embd, b.n_tokens), name="ssm_out.tokens")


class ToySWA(Llama):
    name = "test-iswa"
    swa = SlidingWindow(period=2)  # attention.sliding_window required; layers 0, 2, ... slide


class ToyHybrid(Architecture):
    """Llama's layers whose attention is a Mamba mixer where ``head_count_kv`` is 0."""

    name = "test-hybrid"
    rope_mode = Llama.rope_mode
    required_keys = Llama.required_keys
    per_layer = True
    keys = ssm.MAMBA_KEYS

    def is_recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(ssm.recurrent_state(hp, hp.ssm_d_inner) if self.is_recurrent(il)
                     else Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) for il in range(hp.n_layer))

    def tensors(self) -> list[TensorSpec]:
        """Llama's tensors, the Mamba mixer's in place of the attention projections of the recurrent layers."""
        attention = {T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT}
        recurrent = {tensor_name(t, il, suffix) for il in range(self.hp.n_layer) if self.is_recurrent(il)
                     for t in attention for suffix in ("weight", "bias", "scale", "input_scale")}
        return [s for s in Llama(self.hp).tensors() if s.name not in recurrent] + [
            s for il in range(self.hp.n_layer) if self.is_recurrent(il) for s in ssm.mamba_tensors(self.hp, il)]

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.is_recurrent(il):
                a = mamba_mix(b, h, il)
            else:
                q, k, v = b.build_qkv(h, il)
                q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
                a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


class ToyLatentHybrid(DeepSeek2):
    name = "test-mla-hybrid"
    per_layer = True
    keys = DeepSeek2.keys + ssm.MAMBA_KEYS
    is_recurrent = ToyHybrid.is_recurrent

    def layers(self) -> LayerNeeds:
        latent = LatentAttention(self.hp.n_lora_kv + self.hp.n_rot)
        return tuple(ssm.recurrent_state(self.hp, self.hp.ssm_d_inner) if self.is_recurrent(il) else latent
                     for il in range(self.hp.n_layer))

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        return ssm.mamba_tensors(self.hp, il) if self.is_recurrent(il) else super().attn_tensors(il)

    def attention(self, b: GraphBuilder, h: Node, pos: Node, temperature: Node | None, il: int) -> Node:
        return mamba_mix(b, h, il) if self.is_recurrent(il) else super().attention(b, h, pos, temperature, il)
