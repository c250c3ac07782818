"""The attention steps: soft_max with llama.cpp's KV padding, and the (kq, soft_max, kqv) chain fused into one."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.attention import attention_mask, attention_over, open_prefix
from graphir.backends.numba.kernels.indexer import lightning_indexer
from graphir.backends.numba.kernels.mul_mat import mul_mat
from graphir.backends.numba.kernels.softmax import (alibi_slopes, exp_head, heads, mask_rows, per_row, probabilities,
                                                    soft_max, soft_max_kernel)
from graphir.backends.numba.primitives.isa import REDUCE_HADD, IsaPath
from graphir.backends.numba.steps.base import F32, Env, Function, Step, broadcast, dense, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node
from graphir.memory.kv import stream_binding


def _finite(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """Whether every product a reach leaves out is finite: q below f16's overflow once rounded to it (65520 rounds
    to infinity), and the f16 K and V finite."""
    return bool(-65520 < q.min() and q.max() < 65520 and np.isfinite(k).all() and np.isfinite(v).all())


def kv_pad(soft_max_node: Node) -> int:
    """The padding of the cells a mask covers, as the mask input states it (``pad``: a KV cache's n_kv, padded
    to 256 masked cells as llama.cpp's); a mask over the ubatch or an encoder's output states none."""
    n = soft_max_node
    return int(n.inputs[1].attrs.get("pad", 1)) if len(n.inputs) > 1 and n.inputs[1].op == "input" else 1


@kernel("lightning_indexer")
def _lightning_indexer(n: Node, memo: threading.local, path: IsaPath) -> Step:
    hadd = path.reduce == REDUCE_HADD
    streams = len(n.shape) > 2  # [n_kv, T, 1, S]; without streams [n_kv, T]
    return Function(lambda env, q, k, w, mask: _ggml_rank(lightning_indexer(q, k, w, mask, path.lanes, hadd),
                                                          streams))


def _ggml_rank(scores: np.ndarray, streams: bool) -> np.ndarray:
    """The indexer's (S, T, n_kv) scores in the node's numpy layout: (S, 1, T, n_kv), or (T, n_kv)."""
    return scores[:, None] if streams else scores[0]


@kernel("soft_max")
def _soft_max(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _SoftMax(n.attrs, kv_pad(n), path)


class _SoftMax(Step):
    def __init__(self, a: dict[str, Any], pad: int, path: IsaPath):
        self.a, self.pad, self.path = a, pad, path

    def __call__(self, env: Env, x: np.ndarray, mask: np.ndarray | None = None, sinks: Any = None) -> np.ndarray:
        return soft_max(x, None if mask is None else broadcast(mask, x.shape), self.a["scale"], self.a["max_bias"],
                        self.path, self.pad, None if sinks is None else dense(sinks))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """soft_max with a mask or none (no sinks) on the tape: its value marked as soft_max marks it (the KV
        padding it ran with), which the mul_mat that reads it chooses its path by (a value copied into the arena
        from Python would lose the mark, and a recorded mul_mat its path: a vision tower's attention has no mask)."""
        if len(args) not in (1, 2) or not rows_of(*args):
            return None
        x = args[0]
        if len(args) == 2:
            mask = args[1]
            m, mrows = mask_rows(broadcast(mask, x.shape), x.shape)
            if not np.shares_memory(m, mask):
                return None
        else:  # no mask: the kernel reads none of its row (mrows 0)
            m, mrows = tape.arena((1, x.shape[-1]), fresh=True), 0
            m[:] = 0
        x2, lanes = x.reshape(-1, x.shape[-1]), self.path.lanes
        head, scale, none = exp_head(x.shape[-1], lanes, self.pad), F32(self.a["scale"]), tape.arena((0,))
        slopes = none
        if self.a["max_bias"] > 0:  # constants of the step, written once into the arena
            slopes = tape.arena((x2.shape[0],), fresh=True)
            slopes[:] = per_row(alibi_slopes(self.a["max_bias"], heads(x.shape)), x.shape)
        out, variant = tape.arena(x.shape), self.path.expf
        o2 = out.reshape(x2.shape)
        ok = tape.record(T.SOFT_MAX, soft_max_kernel(x.size),
                         (x2, m, mrows, scale, slopes, head, lanes, variant, o2, none))
        return probabilities(out, self.pad) if ok else None


class Attention(Step):
    """One step for an attention chain: kernels.attention for one query token, the chain's three kernels in
    turn for anything else; bit-equal either way. A plan that knows the caches' views reads their layouts once."""

    def __init__(self, sm: Node, kq_step: Callable[..., Any], sm_step: Callable[..., Any],
                 kqv_step: Callable[..., Any], memo: threading.local, path: IsaPath):
        self.steps, self.memo, self.path = (kq_step, sm_step, kqv_step), memo, path
        self.scale, self.pad = sm.attrs["scale"], kv_pad(sm)
        mask = sm.inputs[1] if len(sm.inputs) > 1 else None
        self.streams = stream_binding(str(mask.shape[0])) if mask is not None and mask.op == "input" else None

    def __call__(self, env: Env, k: np.ndarray, q: np.ndarray, mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self._over(attention_over(k, v, self.scale, self.pad, self.path), env, k, q, mask, v)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        k, _, _, v = known
        if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
            return partial(self, env)
        q = shape(1)
        one_token = len(q) == 3 and q[1] == 1   # a decode step's plan
        return partial(self._over, attention_over(k, v, self.scale, self.pad, self.path, one_token), env)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """One query token's attention on the tape: the cells it reads up to set from the mask before each run."""
        k, q, mask, v = args
        if not all(isinstance(a, np.ndarray) for a in args) or not rows_of(q, mask) or q.ndim != 3 or q.shape[1] != 1:
            return None
        over = attention_over(k, v, self.scale, self.pad, self.path, True)
        nh, n_kv = q.shape[0], k.shape[1]
        m, mrows, _ = attention_mask(broadcast(mask, (nh, 1, n_kv)), nh, n_kv)
        if over is None or not over.takes(q, mrows) or not np.shares_memory(m, mask):  # type: ignore[attr-defined]
            return None
        key = ("live", id(mask), mrows, n_kv)
        live = tape.memo.get(key)
        if live is None:
            live = tape.memo[key] = tape.reg()

            def cells(r: int = live) -> None:
                tape.table()[1][r] = min(open_prefix(m[:mrows]), n_kv)

            tape.before.append(cells)
        kq, out = tape.arena((nh, 1, n_kv)), tape.arena((nh, 1, v.shape[1]))
        kernel, a = over.call(q, m, mrows, 0, kq, out)  # type: ignore[attr-defined]
        if not np.shares_memory(a[6], q):
            return None
        return out if tape.record(T.ATTEND, kernel, (*a[:12], live, *a[13:])) else None   # the cells: a register

    def _over(self, over: Callable[..., np.ndarray | None] | None, env: Env, k: np.ndarray, q: np.ndarray,
              mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        stream = env.get(self.streams, 0) if self.streams else 0
        if stream and q.ndim == 3 and q.shape[1] > 1 and mask.ndim == 2:
            return self._per_stream(stream, env, k, q, mask, v)
        return self._joint(over, env, k, q, mask, v)

    def _per_stream(self, stream: int, env: Env, k: np.ndarray, q: np.ndarray, mask: np.ndarray,
                    v: np.ndarray) -> np.ndarray:
        """A cache in per-sequence streams: each stream's tokens attend as a batch of their own over its cells,
        as many as llama.cpp's per-stream views hold (the most any of the ubatch's streams opens, padded)."""
        n_kv = k.shape[-2]
        opened = np.isfinite(mask)
        first = opened.argmax(axis=1) // stream
        groups = {int(s): np.flatnonzero(first == s) for s in np.unique(first)}
        last = max(int(np.flatnonzero(opened[rows].any(axis=0)).max()) - s * stream for s, rows in groups.items())
        width = -(-(last + 1) // self.pad) * self.pad
        out = None
        for s, rows in groups.items():
            a = s * stream
            b = min(a + width, n_kv)
            y = self._joint(None, env, k[..., a:b, :], q[:, rows], mask[rows][:, a:b], v[..., a:b])
            if out is None:
                out = np.empty((y.shape[0], q.shape[1], y.shape[2]), y.dtype)
            out[:, rows] = y
        assert out is not None
        return out

    def _joint(self, over: Callable[..., np.ndarray | None] | None, env: Env, k: np.ndarray, q: np.ndarray,
               mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        if over is not None and q.ndim == 3 and q.shape[1] == 1:
            key = ("attention mask", id(mask), q.shape[0], k.shape[1])  # the same for every layer of a run
            kept = self.memo.d.get(key)                 # (the mask kept with its rows: its id stays its own)
            if kept is None:
                kept = self.memo.d[key] = mask, attention_mask(broadcast(mask, (q.shape[0], 1, k.shape[1])), *key[2:])
            rows = kept[1]
            y = over(q, *rows)
            if y is not None:
                return y
        kq_step, sm_step, kqv_step = self.steps
        n_kv = k.shape[-2]
        reach = self._reach(mask, q, n_kv)
        if mask.shape[-1] == n_kv == v.shape[-1]:   # the three over the cells up to the last one the mask opens
            key = ("open prefix", id(mask))
            kept = self.memo.d.get(key)
            if kept is None:
                kept = self.memo.d[key] = mask, max(-(-open_prefix(mask) // 64) * 64, 64)
            if kept[1] < n_kv:
                k, v, mask = k[..., :kept[1], :], v[..., :kept[1]], mask[..., :kept[1]]
        if reach is not None and _finite(q, k, v):  # kq and kqv as their steps compute them, past the reach left out
            probabilities = sm_step(env, mul_mat(k, q, self.path, reach=reach), mask)
            return mul_mat(v, probabilities, self.path, reach=reach)
        return kqv_step(env, v, sm_step(env, kq_step(env, k, q), mask))

    def _reach(self, mask: np.ndarray, q: np.ndarray, n_kv: int) -> np.ndarray | None:
        """For a prompt whose mask is one (tokens, cells) matrix for every head: each token's cells up to its last
        open one (not -inf; all of them where none is), what kernels.mul_mat leaves out the products past (a
        causal 512-token prompt: half of them). Kept with the mask, the same for every layer of a run."""
        if q.ndim != 3 or q.shape[1] < 2 or mask.shape != (q.shape[1], n_kv):
            return None
        key = ("reach", id(mask))
        kept = self.memo.d.get(key)
        if kept is None:
            opened = mask != -np.inf
            kept = self.memo.d[key] = mask, (n_kv - np.argmax(opened[:, ::-1], axis=1)).astype(np.int64)
        return kept[1]
