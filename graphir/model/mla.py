"""Multi-head latent attention's shared steps (DeepSeek-V2's MLA, MiniCPM3's and PLM's): each token's keys and
values compressed into one latent of ``kv_lora_rank`` values plus a key part of ``n_rot`` values carrying the
positions (RoPE'd once, shared by every head), queries split per head into a part without positions and a RoPE'd
part. :func:`latent_qkv` computes those pieces; :func:`decompressed_attention` is the form that decompresses K and
V per head from the latent (one ``attn_kv_b``) and attends as ordinary multi-head attention over a KV cache."""

from __future__ import annotations

from typing import Callable

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams

Rope = Callable[[GraphBuilder, Node, Node, str], Node]  # (builder, x, positions, name) -> x RoPE'd


def check_decompressed(hp: HParams, arch: str) -> None:
    """The decompressed form makes K and V for every query head, and a head's RoPE'd part is part of it."""
    A, R = Keys.Attention, Keys.Rope
    if hp.n_embd_head_k < hp.n_rot:
        raise MetadataError(f"heads of {hp.n_embd_head_k} values ('{A.KEY_LENGTH.format(arch=arch)}') are fewer than "
                            f"the {hp.n_rot} RoPE'd ones ('{R.DIMENSION_COUNT.format(arch=arch)}')")
    if hp.head_count_kv(0) != hp.head_count(0):
        raise MetadataError(f"K and V are decompressed for every head, but '{A.HEAD_COUNT_KV.format(arch=arch)}' = "
                            f"{hp.head_count_kv(0)} of {hp.head_count(0)} heads")


def latent_qkv(b: GraphBuilder, h: Node, q: Node, pos: Node, il: int, d_nope: int,
               rope: Rope) -> tuple[Node, Node, Node, Node]:
    """From queries q [d_nope + n_rot, n_head, T] and the layer's input h: the queries' parts without and with
    positions (the latter RoPE'd), the normalised latent [kv_lora_rank, T] and the RoPE'd key part [n_rot, 1, T]
    (``attn_kv_a_mqa`` projects both, ``attn_kv_a_norm`` normalises the latent)."""
    hp, T_ = b.hp, b.n_tokens
    d_k, H, R_kv, rot = q.shape[0], q.shape[1], hp.n_lora_kv, hp.n_rot
    q_nope = b.op("view", q, shape=(d_nope, H, T_), strides=(1, d_k, d_k * H), offset=0, name="q_nope")
    q_pe = b.op("view", q, shape=(rot, H, T_), strides=(1, d_k, d_k * H), offset=d_nope, name="q_pe")
    q_pe = rope(b, q_pe, pos, "q_pe.rope")
    kv_pe = b.linear(h, b.w(T.ATTN_KV_A_MQA, il), name="kv_cmpr_pe")
    kv = b.op("view", kv_pe, shape=(R_kv, T_), strides=(1, R_kv + rot), offset=0, name="kv_cmpr")
    k_pe = b.op("view", kv_pe, shape=(rot, 1, T_), strides=(1, R_kv + rot, R_kv + rot), offset=R_kv, name="k_pe")
    k_pe = rope(b, k_pe, pos, "k_pe.rope")
    kv = b.norm(kv, T.ATTN_KV_A_NORM, il, name="kv_cmpr_norm")
    return q_nope, q_pe, kv, k_pe


def decompressed_attention(b: GraphBuilder, q_nope: Node, q_pe: Node, kv: Node, k_pe: Node, il: int, d_v: int,
                           kq_scale: float, temperature: Node | None = None) -> Node:
    """K and V of every head decompressed from the latent through ``attn_kv_b`` (per head: d_nope key values, then
    d_v values), the shared key part repeated to every head, then attention over a KV cache and ``attn_output``
    (times its scale); the queries times each token's ``temperature`` where the model tunes it."""
    d_nope, H, T_ = q_nope.shape
    rot = k_pe.shape[0]
    kvb = b.linear(kv, b.w(T.ATTN_KV_B, il), name="kv")
    row = d_nope + d_v
    k_nope = b.op("view", kvb, shape=(d_nope, H, T_), strides=(1, row, row * H), offset=0, name="k_nope")
    v = b.op("cont", b.op("view", kvb, shape=(d_v, H, T_), strides=(1, row, row * H), offset=d_nope,
                          name="Vcur.view"), name="Vcur")
    # without a no-position part (d_nope 0) the queries are their RoPE'd part, as llama.cpp ropes them whole
    q = b.op("concat", q_nope, q_pe, dim=0, name="Qcur") if d_nope else q_pe
    if temperature is not None:
        q = b.op("mul", q, temperature, name="Qcur_attn_temp_scaled")
    k = b.op("concat", k_nope, b.op("repeat", k_pe, shape=(rot, H, T_), name="k_pe.heads"), dim=0, name="Kcur")
    return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.w_opt(T.ATTN_OUT, il, "scale"), kq_scale=kq_scale)
