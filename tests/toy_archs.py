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

from graphir.arch.deepseek2 import DeepSeek2
from graphir.arch.llama import Llama
from graphir.arch.mamba import Mamba
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import SlidingWindow
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LatentAttention, LayerNeeds, Recurrent
from graphir.model.tensors import TensorSpec


def mamba_mix(arch: Mamba, b: GraphBuilder, h: Node, il: int) -> Node:
    """A Mamba layer's mixer over the ubatch's tokens [n_embd, n_tokens], as its sequences of equal length."""
    E = arch.hp.n_embd
    y = Mamba.mixer(arch, b, b.reshape(h, (E, b.n_seq_tokens, b.n_seqs), name="attn_norm.seqs"), il)
    return b.reshape(y, (E, b.n_tokens), name="ssm_out.tokens")


class ToySWA(Llama):
    name = "test-iswa"
    swa = SlidingWindow(period=2)  # attention.sliding_window required; layers 0, 2, ... slide


class ToyHybrid(Llama):
    name = "test-hybrid"
    per_layer = True
    keys = Mamba.keys
    n_embd_r, n_embd_s = Mamba.n_embd_r, Mamba.n_embd_s

    def is_recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Recurrent(self.n_embd_r, self.n_embd_s) if self.is_recurrent(il)
                     else Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) for il in range(hp.n_layer))

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        return Mamba.mixer_tensors(self, il) if self.is_recurrent(il) else super().mix_tensors(il)  # type: ignore[arg-type]

    def mix(self, b: GraphBuilder, h: Node, pos: Node, freq_factors: Node | None, il: int) -> Node:
        if not self.is_recurrent(il):
            return super().mix(b, h, pos, freq_factors, il)
        return mamba_mix(self, b, h, il)  # type: ignore[arg-type]


class ToyLatentHybrid(DeepSeek2):
    name = "test-mla-hybrid"
    per_layer = True
    keys = DeepSeek2.keys + Mamba.keys
    n_embd_r, n_embd_s, is_recurrent = Mamba.n_embd_r, Mamba.n_embd_s, ToyHybrid.is_recurrent

    def layers(self) -> LayerNeeds:
        latent = LatentAttention(self.hp.n_lora_kv + self.hp.n_rot)
        return tuple(Recurrent(self.n_embd_r, self.n_embd_s) if self.is_recurrent(il) else latent
                     for il in range(self.hp.n_layer))

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        return Mamba.mixer_tensors(self, il) if self.is_recurrent(il) else super().attn_tensors(il)  # type: ignore[arg-type]

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        return mamba_mix(self, b, h, il) if self.is_recurrent(il) else super().attention(b, h, pos, il)  # type: ignore[arg-type]
