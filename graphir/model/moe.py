"""What every mixture-of-experts family reads and checks of its experts, as llama.cpp's loader does for all of them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError, TensorError
from graphir.model.builder import Gating
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, spec, tensor_name

if TYPE_CHECKING:
    from graphir.graph.ir import Node
    from graphir.model.builder import GraphBuilder

# Mixture-of-experts hparams as llama.cpp's loader reads them for every family (0: absent). The used experts may be
# one count per layer: every layer then chooses layer 0's count of experts and sums the first of them its own count
# gives (llama.cpp's build_moe_ffn), which the builder reads from n_expert_used_layers
MOE_KEYS = (
    Key("n_expert", Keys.LLM.EXPERT_COUNT, int, 0, minimum=0),
    Key("n_expert_used", Keys.LLM.EXPERT_USED_COUNT, int, 0, minimum=0, first=True),
    Key("n_expert_used_layers", Keys.LLM.EXPERT_USED_COUNT, list, 0, varying=True),
    Key("n_expert_groups", Keys.LLM.EXPERT_GROUP_COUNT, int, 0, minimum=0),
)


def check_experts(hp: HParams, arch: str, groups: bool = False) -> None:
    """llama.cpp's checks of the expert counts. ``groups``: the family routes group-limited (expert_group_count
    > 1, DeepSeek-V3: it reads ``hp.n_group_used``), which llama.cpp's checks of the groups then cover; the
    families that do not build it refuse such a file rather than route it differently."""
    key = lambda t: t.format(arch=arch)  # noqa: E731
    if hp.n_expert_used > hp.n_expert or (hp.n_expert and not hp.n_expert_used):
        raise MetadataError(f"{hp.n_expert} experts per layer ('{key(Keys.LLM.EXPERT_COUNT)}') of which "
                            f"{hp.n_expert_used} are used ('{key(Keys.LLM.EXPERT_USED_COUNT)}'): a token needs "
                            f"between 1 and all of them")
    for il, used in enumerate(hp.n_expert_used_layers):
        if used > hp.n_expert_used:
            raise MetadataError(f"layer {il} sums {used} experts ('{key(Keys.LLM.EXPERT_USED_COUNT)}'), more than the "
                                f"{hp.n_expert_used} every layer chooses (layer 0's)")
    if hp.n_expert_groups > 1 and not groups:
        raise MetadataError(f"'{key(Keys.LLM.EXPERT_GROUP_COUNT)}' = {hp.n_expert_groups}: group-limited expert "
                            f"routing is not built")
    n_groups, used = hp.n_expert_groups, getattr(hp, "n_group_used", 0) if groups else 0
    if (n_groups and n_groups >= max(hp.n_expert, 1)) or (n_groups > 1 and (hp.n_expert % n_groups
                                                                             or not 0 < used < n_groups)):
        raise MetadataError(f"{hp.n_expert} experts in {n_groups} groups ('{key(Keys.LLM.EXPERT_GROUP_COUNT)}') "
                            f"of which {used} are used ('{key(Keys.LLM.EXPERT_GROUP_USED_COUNT)}'): the groups "
                            f"must be fewer than the experts and divide them, and a token takes between 1 and all "
                            f"but one of them")


def gate_up_tensors(n_embd: int, n_ff: int, n_expert: int, il: int) -> list[TensorSpec]:
    """A layer's experts' gate and up stacks in either form llama.cpp's loader takes (``create_tensor_gate_up_exps``):
    one stack of both [n_embd, 2 n_ff, n_expert], or one each; all optional here, :func:`gate_up` needs a whole form."""
    return [spec(T.FFN_GATE_UP_EXP, (n_embd, 2 * n_ff, n_expert), il, optional=True),
            spec(T.FFN_GATE_EXP, (n_embd, n_ff, n_expert), il, optional=True),
            spec(T.FFN_UP_EXP, (n_embd, n_ff, n_expert), il, optional=True)]


def gate_up_problems(tensors: Mapping[str, Any], il: int) -> list[str]:
    """What layer il lacks of its experts' gate and up stacks (empty: the file has a whole form), one line each."""
    fused = tensor_name(T.FFN_GATE_UP_EXP, il)
    if fused in tensors:
        return []
    return [f"missing tensor '{tensor_name(t, il)}' (or '{fused}' of both stacks)"
            for t in (T.FFN_UP_EXP, T.FFN_GATE_EXP) if tensor_name(t, il) not in tensors]


def gate_up(b: GraphBuilder, il: int) -> dict[str, Node | None]:
    """Layer il's gate and up stacks as ``build_moe_ffn`` takes them, in the form the file holds: the fused stack
    when it is there, else the two (both required then, as llama.cpp's loader requires them)."""
    fused = b.w_opt(T.FFN_GATE_UP_EXP, il)
    if fused is not None:
        return {"gate_up_exps": fused, "gate_exps": None, "up_exps": None}
    problems = gate_up_problems(b.tensors, il)
    if problems:
        raise TensorError(f"{b.label}: {problems[0]}")
    return {"up_exps": b.w_opt(T.FFN_UP_EXP, il), "gate_exps": b.w_opt(T.FFN_GATE_EXP, il)}


# ---- shared experts and multi-token-prediction layers, as several mixture-of-experts families load them ---------

# llama.cpp's count of multi-token-prediction (NextN) layers, the last ones of block_count: loaded, not built
NEXTN_KEY = Key("n_layer_nextn", Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0, minimum=0)
# what a NextN layer holds beside a trunk layer's tensors (llama.cpp's ``layer.nextn``)
NEXTN_TENSORS = ((T.NEXTN_EH_PROJ, "eh"), (T.NEXTN_ENORM, "e"), (T.NEXTN_HNORM, "e"),
                 (T.NEXTN_EMBED_TOKENS, "ev"), (T.NEXTN_SHARED_HEAD_HEAD, "ev"), (T.NEXTN_SHARED_HEAD_NORM, "e"))


def trunk_layers(hp: HParams, arch: str) -> int:
    """The layers the graph runs: block_count less the NextN layers llama.cpp leaves to its draft graph."""
    if hp.n_layer_nextn >= hp.n_layer:
        raise MetadataError(f"'{Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)}' = {hp.n_layer_nextn} of "
                            f"{hp.n_layer} layers leaves no layer to run")
    return hp.n_layer - hp.n_layer_nextn


def nextn_layer(layer: list[TensorSpec], hp: HParams, il: int, required: bool = False) -> list[TensorSpec]:
    """A NextN layer's tensors: a trunk layer's and its own, which the graph never reads. All optional (a file may
    hold them or not, as llama.cpp loads them), or ``required``: as a trunk layer's, with the projection and its two
    norms (GLM-4's loader skips them but asks for them); its own embedding and head stay optional."""
    E, V = hp.n_embd, hp.n_vocab
    sizes = {"eh": (2 * E, E), "e": (E,), "ev": (E, V)}
    own = [spec(t, sizes[s], il, kind="vector" if s == "e" else "matrix", optional=not required or s == "ev")
           for t, s in NEXTN_TENSORS]
    # Q, K and V stay optional either way: create_tensor_qkv asks for neither form in a skipped layer
    qkv = {tensor_name(t, il, suffix) for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_QKV)
           for suffix in ("weight", "bias")}
    return [replace(s, optional=s.optional or not required or s.name in qkv, tied_to=None) for s in layer + own]


def nextn_written(n_layer: int, n_nextn: int, trunk: str) -> str:
    """The NextN layers' tensors the converter writes: those of a trunk layer it names (``trunk``: a regex of
    weight names), the routers' selection bias, eh_proj, the two norms and the shared head's norm."""
    nextn = "|".join(str(il) for il in range(n_layer, n_layer + n_nextn))
    return (rf"blk\.({nextn})\.({trunk}|ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp)|"
            rf"nextn\.(eh_proj|enorm|hnorm|shared_head_norm))\.weight|blk\.({nextn})\.exp_probs_b\.bias")


def shared_expert_tensors(n_embd: int, n_ff: int, il: int) -> list[TensorSpec]:
    """Layer il's shared expert: a SwiGLU FFN every token takes beside its routed experts."""
    return [spec(T.FFN_GATE_SHEXP, (n_embd, n_ff), il), spec(T.FFN_DOWN_SHEXP, (n_ff, n_embd), il),
            spec(T.FFN_UP_SHEXP, (n_embd, n_ff), il)]


def shared_expert(b: GraphBuilder, x: Node, il: int, name: str = "ffn_shexp") -> Node:
    """The shared expert's output on x (llama.cpp's build_ffn over the *_shexp tensors, no scales)."""
    return b.build_ffn(x, up=b.w(T.FFN_UP_SHEXP, il), gate=b.w(T.FFN_GATE_SHEXP, il), down=b.w(T.FFN_DOWN_SHEXP, il),
                       name=name)


GATING_FUNC_KEY = Key("expert_gating_func", Keys.LLM.EXPERT_GATING_FUNC, int, 0, minimum=0)


def gating(hp: HParams, arch: str, absent: Gating | None) -> Gating:
    """The file's ``expert_gating_func`` (llama.cpp's numbers: 1 softmax, 2 sigmoid, 3 softmax of the chosen);
    ``absent`` where the key is missing or 0, as the family's loader takes it (None: llama.cpp has no gating then
    and aborts, so the file is refused)."""
    funcs = {1: Gating.SOFTMAX, 2: Gating.SIGMOID, 3: Gating.SOFTMAX_WEIGHT}
    if hp.expert_gating_func not in funcs and (hp.expert_gating_func or absent is None):
        raise MetadataError(f"'{Keys.LLM.EXPERT_GATING_FUNC.format(arch=arch)}' = {hp.expert_gating_func}: not a "
                            f"gating function (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
    return funcs.get(hp.expert_gating_func, absent)  # type: ignore[arg-type]


def expert_width(hp: HParams) -> int:
    """One routed expert's hidden width as llama.cpp's loaders size every layer's experts: layer 0's
    ``expert_feed_forward_length`` (a family's ``n_ff_exp``, one value or one per layer), or, 0, layer 0's FFN
    length shared among the used experts (at least one)."""
    first = hp.n_ff_exp if isinstance(hp.n_ff_exp, int) else hp.n_ff_exp[0]
    return first or hp.ff_length(0) // max(hp.n_expert_used, 1)


def check_routed(hp: HParams, arch: str) -> None:
    """:func:`check_experts`, for a family whose FFNs are all mixtures of experts: it needs experts, and a token
    some of them (llama.cpp's loaders refuse 0 of either)."""
    check_experts(hp, arch)
    if not (hp.n_expert and hp.n_expert_used):
        raise MetadataError(f"a '{arch}' model needs experts ('{Keys.LLM.EXPERT_COUNT.format(arch=arch)}' and "
                            f"'{Keys.LLM.EXPERT_USED_COUNT.format(arch=arch)}' > 0)")


def routed_expert_tensors(n_embd: int, n_ff: int, n_expert: int, il: int) -> list[TensorSpec]:
    """Layer il's router and its experts' gate, down and up stacks, all required."""
    return [spec(T.FFN_GATE_INP, (n_embd, n_expert), il), spec(T.FFN_GATE_EXP, (n_embd, n_ff, n_expert), il),
            spec(T.FFN_DOWN_EXP, (n_ff, n_embd, n_expert), il), spec(T.FFN_UP_EXP, (n_embd, n_ff, n_expert), il)]


def routed_experts(b: GraphBuilder, x: Node, il: int, **routing: Any) -> Node:
    """``build_moe_ffn`` over layer il's router and expert stacks (:func:`routed_expert_tensors`), every token to
    its ``expert_used_count`` best of ``expert_count``, routed as ``routing`` says (gating, norm_w, probs_b...)."""
    return b.build_moe_ffn(x, **experts(b, il), n_expert=b.hp.n_expert, n_expert_used=b.hp.n_expert_used, **routing)


def experts(b: GraphBuilder, il: int) -> dict[str, Node | None]:
    """Layer il's router and expert stacks (:func:`routed_expert_tensors`) as ``build_moe_ffn`` takes them."""
    return {"gate_inp": b.w(T.FFN_GATE_INP, il), "up_exps": b.w(T.FFN_UP_EXP, il),
            "gate_exps": b.w(T.FFN_GATE_EXP, il), "down_exps": b.w(T.FFN_DOWN_EXP, il)}
