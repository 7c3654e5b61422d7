"""Tiny Llama-style decoder ONNX generator, in the shape exporters produce (no torch, no downloads).

Dimensions: B batch, S sequence (new tokens), P past, T total (= P + S), N query heads, Nkv kv heads, H head dim,
D hidden (= N * H), R rotary dim (= H * partial_rotary), V vocab, I intermediate.

Graph contract (the same as HF/Optimum exports, so the generation loop and the rewriter see real-world names):
  inputs  input_ids [B,S] int64, attention_mask [B,T] int64, position_ids [B,S] int64,
          past_key_values.{i}.key / .value [B,Nkv,P,H] float32
  outputs logits [B,S,V] float32, present.{i}.key / .value [B,Nkv,T,H] float32

Variants (each is a pattern the rewriter must recognise):
  style="dynamo"      constants as initializers, reshape targets as constants with 0/-1
  style="torchscript" Constant nodes and Shape/Gather/Unsqueeze/Concat plumbing for every dynamic shape
  rope="half"         Llama: cos/sin from inv_freq @ position_ids, rotate_half (Slice/Neg/Concat) on [B,N,S,H]
  rope="interleaved"  GPT-J: cos/sin gathered from a constant cache, stride-2 slices, stack+reshape, on [B,S,N,H]
  partial_rotary < 1  only the first R channels rotate, the rest pass through a Concat
  fused_qkv=True      Phi-3: one MatMul then Split (dynamo) or Slice (torchscript)
  mask="additive"     Where(allowed, 0, finfo.min) added to the scores; mask="where": Where(allowed, scores, -inf)
  nan_guard=True      Where(IsNaN(p), 0, p) after Softmax (what exporters emit around masked softmax)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._builder import GraphBuilder
from .weights import LlamaConfig, make_weights

__all__ = ["LlamaConfig", "build_tiny_llama", "build_tiny_llama_proto"]

_INT_MAX = np.iinfo(np.int64).max
_FMIN = float(np.finfo(np.float32).min)


@dataclasses.dataclass(frozen=True)
class _Variant:
    style: str
    rope: str
    rotary_dim: int
    fused_qkv: bool
    mask: str
    nan_guard: bool


class _LlamaGraph:
    """Emits one decoder graph; methods mirror the HF modules they imitate."""

    def __init__(self, cfg: LlamaConfig, var: _Variant, weights: dict[str, np.ndarray]) -> None:
        self.cfg, self.var, self.w = cfg, var, weights
        self.g = GraphBuilder(constants_as_nodes=var.style == "torchscript")

    # --- shape plumbing ------------------------------------------------------------------------------------
    def _dim(self, x: str, axis: int) -> str:
        """A 1-D [1] int64 tensor holding x.shape[axis] (TorchScript: Shape -> Gather -> Unsqueeze)."""
        g = self.g
        if self.var.style == "torchscript":
            scalar = g.op("Gather", g.op("Shape", x), g.const(axis), axis=0)
            return g.op("Unsqueeze", scalar, g.const([0]))
        return g.op("Shape", x, start=axis, end=axis + 1)

    def _shape(self, *parts) -> str:
        """Concat of dims: ints become constants, (value, axis) pairs read a dim of a value."""
        g = self.g
        if self.var.style == "dynamo" and all(isinstance(p, int) for p in parts):
            return g.const(list(parts))
        pieces = [g.const([p]) if isinstance(p, int) else self._dim(*p) for p in parts]
        return g.op("Concat", *pieces, axis=0)

    def _reshape(self, x: str, *parts) -> str:
        return self.g.op("Reshape", x, self._shape(*parts))

    # --- building blocks -----------------------------------------------------------------------------------
    def rms_norm(self, x: str, weight: str) -> str:
        g = self.g
        var = g.op("ReduceMean", g.op("Pow", x, g.const(2.0, np.float32)), g.const([-1]), keepdims=1)
        denom = g.op("Sqrt", g.op("Add", var, g.const(self.cfg.rms_norm_eps, np.float32)))
        normed = g.op("Mul", x, g.op("Div", g.const(1.0, np.float32), denom))
        return g.op("Mul", g.weight(weight, self.w[weight]), normed)

    def rotary_tables(self, position_ids: str) -> tuple[str, str]:
        """cos/sin for the current positions. half: [B,S,R] (from inv_freq); interleaved: [B,S,R/2] (cache)."""
        g, r = self.g, self.var.rotary_dim
        if self.var.rope == "half":
            inv_freq = g.weight("model.rotary_emb.inv_freq", self.w["rotary.inv_freq"].reshape(1, r // 2, 1))
            inv_exp = g.op("Expand", inv_freq, self._shape((position_ids, 0), r // 2, 1))   # [B,R/2,1]
            pos = g.op("Cast", g.op("Unsqueeze", position_ids, g.const([1])), to=TensorProto.FLOAT)  # [B,1,S]
            freqs = g.op("Transpose", g.op("MatMul", inv_exp, pos), perm=[0, 2, 1])  # [B,S,R/2]
            emb = g.op("Concat", freqs, freqs, axis=-1)  # [B,S,R]
            scaling = g.const(1.0, np.float32)  # HF's attention_scaling (1.0 for default rope)
            return g.op("Mul", g.op("Cos", emb), scaling), g.op("Mul", g.op("Sin", emb), scaling)
        table = g.weight("embed_positions", self.w["rotary.sincos"])  # [max_pos, R]: sin | cos
        sincos = g.op("Gather", table, position_ids, axis=0)  # [B,S,R]
        sin, cos = g.op("Split", sincos, g.const([r // 2, r // 2]), axis=-1, outputs=2)
        return cos, sin

    def _repeat_interleave(self, t: str) -> str:
        """[B,S,R/2] -> [B,S,1,R] with each channel repeated twice (torch.repeat_interleave(t[:,:,None], 2, 3))."""
        g = self.g
        t5 = g.op("Unsqueeze", t, g.const([2, 4]))  # [B,S,1,R/2,1]
        pair = g.op("Concat", t5, t5, axis=-1)  # [B,S,1,R/2,2]
        return self._reshape(pair, (t, 0), (t, 1), 1, self.var.rotary_dim)

    def _rotate(self, x: str) -> str:
        g, r = self.g, self.var.rotary_dim
        if self.var.rope == "half":
            if self.var.style == "torchscript":  # x.shape[-1] // 2 computed at run time
                half = g.op("Div", self._dim(x, 3), g.const([2]))
            else:
                half = g.const([r // 2])
            x1 = g.op("Slice", x, g.const([0]), half, g.const([3]), g.const([1]))
            x2 = g.op("Slice", x, half, g.const([_INT_MAX]), g.const([3]), g.const([1]))
            return g.op("Concat", g.op("Neg", x2), x1, axis=-1)
        x1 = g.op("Slice", x, g.const([0]), g.const([_INT_MAX]), g.const([3]), g.const([2]))
        x2 = g.op("Slice", x, g.const([1]), g.const([_INT_MAX]), g.const([3]), g.const([2]))
        stacked = g.op("Concat", g.op("Unsqueeze", g.op("Neg", x2), g.const([-1])),
                       g.op("Unsqueeze", x1, g.const([-1])), axis=-1)  # [B,S,N,R/2,2]
        return self._reshape(stacked, (x, 0), (x, 1), (x, 2), r)

    def apply_rotary(self, x: str, cos: str, sin: str) -> str:
        g, r, h = self.g, self.var.rotary_dim, self.cfg.head_dim
        x_rot = x
        if r < h:
            x_rot = g.op("Slice", x, g.const([0]), g.const([r]), g.const([3]), g.const([1]))
            x_pass = g.op("Slice", x, g.const([r]), g.const([_INT_MAX]), g.const([3]), g.const([1]))
        out = g.op("Add", g.op("Mul", x_rot, cos), g.op("Mul", self._rotate(x_rot), sin))
        if r < h:
            out = g.op("Concat", out, x_pass, axis=-1)
        return out

    def attention(self, i: int, h: str, cos: str, sin: str, mask: str, past_k: str, past_v: str) -> str:
        g, c, var = self.g, self.cfg, self.var
        p = f"model.layers.{i}.self_attn"
        n, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if var.fused_qkv:
            qkv = g.op("MatMul", h, g.weight(f"{p}.qkv_proj.weight", self.w[f"{p}.qkv_proj.weight"]),
                       name=f"/{p}/qkv_proj/MatMul")
            sizes = [n * hd, nkv * hd, nkv * hd]
            if var.style == "dynamo":
                q, k, v = g.op("Split", qkv, g.const(sizes), axis=-1, outputs=3)
            else:
                bounds = np.cumsum([0, *sizes])
                q, k, v = (g.op("Slice", qkv, g.const([int(bounds[j])]), g.const([int(bounds[j + 1])]),
                                g.const([-1]), g.const([1])) for j in range(3))
        else:
            q, k, v = (g.op("MatMul", h, g.weight(f"{p}.{nm}_proj.weight", self.w[f"{p}.{nm}_proj.weight"]),
                            name=f"/{p}/{nm}_proj/MatMul") for nm in "qkv")
        q4 = self._reshape(q, (h, 0), (h, 1), n, hd)      # [B,S,N,H]
        k4 = self._reshape(k, (h, 0), (h, 1), nkv, hd)    # [B,S,Nkv,H]
        v4 = self._reshape(v, (h, 0), (h, 1), nkv, hd)
        if var.rope == "interleaved":  # GPT-J rotates in [B,S,N,H], before the head transpose
            cos4, sin4 = self._repeat_interleave(cos), self._repeat_interleave(sin)  # [B,S,1,R]
            q4, k4 = self.apply_rotary(q4, cos4, sin4), self.apply_rotary(k4, cos4, sin4)
        q = g.op("Transpose", q4, perm=[0, 2, 1, 3])       # [B,N,S,H]
        k = g.op("Transpose", k4, perm=[0, 2, 1, 3])       # [B,Nkv,S,H]
        v = g.op("Transpose", v4, perm=[0, 2, 1, 3])
        if var.rope == "half":
            cos4, sin4 = (g.op("Unsqueeze", t, g.const([1])) for t in (cos, sin))  # [B,1,S,R]
            q, k = self.apply_rotary(q, cos4, sin4), self.apply_rotary(k, cos4, sin4)
        k_all = g.op("Concat", past_k, k, axis=-2, outputs=[f"present.{i}.key"])   # [B,Nkv,T,H]
        v_all = g.op("Concat", past_v, v, axis=-2, outputs=[f"present.{i}.value"])
        k_rep, v_rep = self.repeat_kv(k_all), self.repeat_kv(v_all)                  # [B,N,T,H]
        scores = g.op("MatMul", q, g.op("Transpose", k_rep, perm=[0, 1, 3, 2]))      # [B,N,S,T]
        scores = g.op("Mul", scores, g.const(hd ** -0.5, np.float32))
        if var.mask == "additive":
            scores = g.op("Add", scores, mask)
        else:
            scores = g.op("Where", mask, scores, g.const(-np.inf, np.float32))
        probs = g.op("Softmax", scores, axis=-1)
        if var.nan_guard:
            probs = g.op("Where", g.op("IsNaN", probs), g.const(0.0, np.float32), probs)
        out = g.op("Transpose", g.op("MatMul", probs, v_rep), perm=[0, 2, 1, 3])     # [B,S,N,H]
        out = self._reshape(out, (h, 0), (h, 1), n * hd) if var.style == "torchscript" else \
            self._reshape(out, 0, 0, -1)
        return g.op("MatMul", out, g.weight(f"{p}.o_proj.weight", self.w[f"{p}.o_proj.weight"]),
                    name=f"/{p}/o_proj/MatMul")

    def repeat_kv(self, x: str) -> str:
        """[B,Nkv,T,H] -> [B,N,T,H] via Unsqueeze/Expand/Reshape (HF repeat_kv); identity when N == Nkv."""
        g, c = self.g, self.cfg
        n_rep = c.num_attention_heads // c.num_key_value_heads
        if n_rep == 1:
            return x
        x5 = g.op("Unsqueeze", x, g.const([2]))
        x5 = g.op("Expand", x5, self._shape((x, 0), (x, 1), n_rep, (x, 2), (x, 3)))
        return self._reshape(x5, (x, 0), c.num_attention_heads, (x, 2), (x, 3))

    def causal_mask(self, input_ids: str, attention_mask: str) -> str:
        """[B,1,S,T]: key j is visible to query i iff j <= P + i and attention_mask[b, j] == 1.

        Additive style: 0 / finfo.min float; where style: a bool "allowed" tensor.
        """
        g = self.g
        s = self._dim(input_ids, 1)
        t = self._dim(attention_mask, 1)
        past = g.op("Sub", t, s)
        one = g.const(1)

        def to0d(v: str) -> str:
            return g.op("Squeeze", v, g.const([0]))

        cache_pos = g.op("Range", to0d(past), to0d(t), one)                      # [S]
        key_pos = g.op("Range", g.const(0), to0d(t), one)                        # [T]
        causal = g.op("LessOrEqual", g.op("Unsqueeze", key_pos, g.const([0])),
                      g.op("Unsqueeze", cache_pos, g.const([1])))                # [S,T]
        pad = g.op("Cast", g.op("Unsqueeze", attention_mask, g.const([1, 2])), to=TensorProto.BOOL)  # [B,1,1,T]
        allowed = g.op("And", g.op("Unsqueeze", causal, g.const([0, 1])), pad)  # [B,1,S,T]
        if self.var.mask == "where":
            return allowed
        return g.op("Where", allowed, g.const(0.0, np.float32), g.const(_FMIN, np.float32))

    def build(self) -> onnx.ModelProto:
        g, c = self.g, self.cfg
        f32, i64 = TensorProto.FLOAT, TensorProto.INT64
        inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
                  helper.make_tensor_value_info("attention_mask", i64, ["batch", "total_sequence"]),
                  helper.make_tensor_value_info("position_ids", i64, ["batch", "sequence"])]
        outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "sequence", c.vocab_size])]
        kv_shape_in = ["batch", c.num_key_value_heads, "past_sequence", c.head_dim]
        kv_shape_out = ["batch", c.num_key_value_heads, "total_sequence", c.head_dim]
        for i in range(c.num_hidden_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, kv_shape_in))
                outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32, kv_shape_out))

        embed = g.weight("model.embed_tokens.weight", self.w["model.embed_tokens.weight"])
        x = g.op("Gather", embed, "input_ids", axis=0)                          # [B,S,D]
        cos, sin = self.rotary_tables("position_ids")
        mask = self.causal_mask("input_ids", "attention_mask")
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            h = self.rms_norm(x, f"{p}.input_layernorm.weight")
            attn = self.attention(i, h, cos, sin, mask, f"past_key_values.{i}.key", f"past_key_values.{i}.value")
            x = g.op("Add", x, attn)
            h = self.rms_norm(x, f"{p}.post_attention_layernorm.weight")
            gate = g.op("MatMul", h, g.weight(f"{p}.mlp.gate_proj.weight", self.w[f"{p}.mlp.gate_proj.weight"]),
                        name=f"/{p}/mlp/gate_proj/MatMul")
            up = g.op("MatMul", h, g.weight(f"{p}.mlp.up_proj.weight", self.w[f"{p}.mlp.up_proj.weight"]),
                      name=f"/{p}/mlp/up_proj/MatMul")
            act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)       # SwiGLU
            down = g.op("MatMul", act, g.weight(f"{p}.mlp.down_proj.weight", self.w[f"{p}.mlp.down_proj.weight"]),
                        name=f"/{p}/mlp/down_proj/MatMul")
            x = g.op("Add", x, down)
        x = self.rms_norm(x, "model.norm.weight")
        if c.tie_word_embeddings:
            lm_w = g.op("Transpose", embed, perm=[1, 0])
        else:
            lm_w = g.weight("lm_head.weight", self.w["lm_head.weight"])
        g.op("MatMul", x, lm_w, name="lm_head", outputs=["logits"])
        model = g.make_model("tiny_llama", inputs, outputs)
        meta = {**dataclasses.asdict(c), "style": self.var.style, "rope": self.var.rope,
                "rotary_dim": self.var.rotary_dim, "fused_qkv": self.var.fused_qkv, "mask": self.var.mask}
        helper.set_model_props(model, {"npu_ep.model_config": json.dumps(meta),
                                       "max_position_embeddings": str(c.max_position_embeddings)})
        return model


def build_tiny_llama_proto(config: LlamaConfig = LlamaConfig(),  # noqa: B008 - frozen dataclass
                           *, style: str = "dynamo", rope: str = "half",
                           partial_rotary: float = 1.0, fused_qkv: bool = False, mask: str = "additive",
                           nan_guard: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Build the decoder as an in-memory ModelProto (see the module docstring for variants)."""
    if style not in ("dynamo", "torchscript"):
        raise ValueError(f"style must be 'dynamo' or 'torchscript', got {style!r}")
    if rope not in ("half", "interleaved"):
        raise ValueError(f"rope must be 'half' or 'interleaved', got {rope!r}")
    if mask not in ("additive", "where"):
        raise ValueError(f"mask must be 'additive' or 'where', got {mask!r}")
    rotary = config.head_dim * partial_rotary
    rotary_dim = round(rotary)
    if abs(rotary - rotary_dim) > 1e-9 or not 0 < rotary_dim <= config.head_dim or rotary_dim % 2:
        raise ValueError(f"partial_rotary={partial_rotary} gives rotary dim {rotary_dim} for head_dim "
                         f"{config.head_dim}; it must be even and in (0, head_dim]")
    var = _Variant(style, rope, rotary_dim, fused_qkv, mask, nan_guard)
    weights = make_weights(config, rotary_dim=rotary_dim, fused_qkv=fused_qkv, seed=seed)
    return _LlamaGraph(config, var, weights).build()


def build_tiny_llama(path: str | Path, config: LlamaConfig = LlamaConfig(),  # noqa: B008 - frozen dataclass
                     *, style: str = "dynamo",
                     rope: str = "half", partial_rotary: float = 1.0, fused_qkv: bool = False,
                     mask: str = "additive", nan_guard: bool = False, seed: int = 0) -> Path:
    """Write the tiny decoder to ``path`` and return the path. Deterministic for a given seed."""
    model = build_tiny_llama_proto(config, style=style, rope=rope, partial_rotary=partial_rotary,
                                   fused_qkv=fused_qkv, mask=mask, nan_guard=nan_guard, seed=seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    if weights < onnx.checker.MAXIMUM_PROTOBUF // 2:
        onnx.checker.check_model(model)
        onnx.save(model, path)
    else:  # real vocabularies at real widths pass protobuf's 2 GiB: the weights go to a file beside the model
        onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data")
        onnx.checker.check_model(str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m npu_ep.models.tiny_llama", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output .onnx path")
    d = LlamaConfig()
    ap.add_argument("--layers", type=int, default=d.num_hidden_layers)
    ap.add_argument("--hidden", type=int, default=d.hidden_size)
    ap.add_argument("--heads", type=int, default=d.num_attention_heads)
    ap.add_argument("--kv-heads", type=int, default=d.num_key_value_heads)
    ap.add_argument("--intermediate", type=int, default=d.intermediate_size)
    ap.add_argument("--vocab", type=int, default=d.vocab_size)
    ap.add_argument("--max-positions", type=int, default=d.max_position_embeddings)
    ap.add_argument("--tie-embeddings", action="store_true")
    ap.add_argument("--style", choices=["dynamo", "torchscript"], default="dynamo")
    ap.add_argument("--rope", choices=["half", "interleaved"], default="half")
    ap.add_argument("--partial-rotary", type=float, default=1.0)
    ap.add_argument("--fused-qkv", action="store_true")
    ap.add_argument("--mask", choices=["additive", "where"], default="additive")
    ap.add_argument("--nan-guard", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    cfg = LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate, vocab_size=a.vocab,
                      max_position_embeddings=a.max_positions, tie_word_embeddings=a.tie_embeddings)
    path = build_tiny_llama(a.out, cfg, style=a.style, rope=a.rope, partial_rotary=a.partial_rotary,
                            fused_qkv=a.fused_qkv, mask=a.mask, nan_guard=a.nan_guard, seed=a.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
