"""Spark 2.5: the pre-norm decoder whose attention output is gated per head (a sigmoid of one projection of the
sublayer's input, one value a head) before the output projection, with a GeGLU FFN. Its sliding layers (as the
file's pattern says, over the file's window) rotate their own number of dims with their own base; head counts may
differ between layers. The LM head is the token embedding unless the file has its own.

Reference: llama.cpp src/models/spark2-5.cpp (and convert_hf_to_gguf's Spark2_5Model).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, head_dim
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.prenorm import RMS_KEYS, synthetic
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Spark2_5(Architecture):
    name = "spark2_5"
    rope_mode = "neox"
    required_keys = (*RMS_KEYS, A.SLIDING_WINDOW, A.SLIDING_WINDOW_PATTERN)
    per_layer = True
    swa = SlidingWindow("standard")
    keys = (Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
            Key("n_rot_swa", R.DIMENSION_COUNT_SWA, int, default_from="n_rot", minimum=0),
            # llama.cpp sizes a sliding layer's heads by these, but its graph by the global ones: they must agree
            Key("n_embd_head_k_swa", A.KEY_LENGTH_SWA, int, default_from="n_embd_head_k"),
            Key("n_embd_head_v_swa", A.VALUE_LENGTH_SWA, int, default_from="n_embd_head_v"))

    def __init__(self, hp: HParams):
        if (hp.n_embd_head_k_swa, hp.n_embd_head_v_swa) != (hp.n_embd_head_k, hp.n_embd_head_v):
            raise MetadataError(f"'{A.KEY_LENGTH_SWA.format(arch=self.name)}' = {hp.n_embd_head_k_swa} and "
                                f"'{A.VALUE_LENGTH_SWA.format(arch=self.name)}' = {hp.n_embd_head_v_swa}: llama.cpp's "
                                f"graph reads the sliding layers' heads as {hp.n_embd_head_k} wide")
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            H = hp.head_count(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                     spec(T.ATTN_GATE, (E, H), il), spec(T.ATTN_OUT, (H * hp.n_embd_head_k, E), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                     spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs


    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        d = hp.n_embd_head_k
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            H, T_ = hp.head_count(il), b.n_tokens
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention, each head's output gated by sigmoid(W_gate h)
            q, k, v = b.build_qkv(h, il)
            rope = dict(freq_base=hp.rope_freq_base_swa, n_dims=hp.n_rot_swa) if hp.is_swa(il) else {}
            q, k = b.rope(q, pos, name="Qcur.rope", **rope), b.rope(k, pos, name="Kcur.rope", **rope)
            a = b.build_attn(q, k, v, wo=None, kq_scale=inv_sqrt(d))
            gate = b.op("sigmoid", b.mm(b.w(T.ATTN_GATE, il), h, name="attn_gate_proj"), name="attn_gate")
            a = b.op("mul", b.reshape(a, (d, H, T_), name="attn_out.heads"),
                     b.reshape(gate, (1, H, T_), name="attn_gate.heads"), name="attn_gated.heads")
            a = b.mm(b.w(T.ATTN_OUT, il), b.reshape(a, (d * H, T_), name="attn_gated"), b.scale(T.ATTN_OUT, il),
                     name="attn_out_proj")
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: GeGLU
            f = b.build_ffn(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il), act=Act.GELU)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's Spark2_5Model: the window, which layers slide, each layer type's rotated
# dims (its partial_rotary_factor of head_dim) ------------------------------------------------------------------

QKV = r"blk\.\d+\.attn_qkv\.weight"  # its checkpoints fuse Q, K and V (q_k_v_proj)


def _layers(c: Config) -> dict[str, object]:
    d, rope = head_dim(c), c.rope
    return {A.SLIDING_WINDOW: c.find("sliding_window"),
            A.SLIDING_WINDOW_PATTERN: [t == "sliding_attention" for t in c.find("layer_types", kind="list")],
            R.DIMENSION_COUNT: int(d * float(rope["full_attention"]["partial_rotary_factor"])),
            R.DIMENSION_COUNT_SWA: int(d * float(rope["sliding_attention"]["partial_rotary_factor"]))}


hf_config.register(Family("spark2_5", TEXT + (VOCAB, _layers), {"tie_word_embeddings": False}, lambda c: QKV),
                   "Spark2_5ForCausalLM")

presets.register({"Spark-2.5-tiny": synthetic(
    "spark2_5", "a synthetic header of tiny sizes: layers 0-2 slide over 64 positions, rotating half their heads",
    include=QKV, keys={A.SLIDING_WINDOW: 64, A.SLIDING_WINDOW_PATTERN: [True, True, True, False],
                       R.DIMENSION_COUNT_SWA: 64, R.FREQ_BASE_SWA: 1000.0})})
