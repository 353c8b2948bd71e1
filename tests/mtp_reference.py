#!/usr/bin/env python3
"""An independent NumPy reference for the next-token-prediction (MTP) layer of deepseek2 checkpoints.

Usage: mtp_reference.py MODEL.gguf TOKENS.txt OUT.f32

Reads an F32 GGUF file with its own minimal parser and runs the token sequence (whitespace-separated ids in
TOKENS.txt, T of them) in float64: the main layers (block_count - nextn_predict_layers of them: multi-head
latent attention with its keys and values expanded per head, dense or mixture-of-experts feed-forward), then
the first MTP layer over positions 0 .. T-2, where position t reads the main model's final hidden state at t
(before the output norm) and the embedding of token t + 1:

    x = eh_proj [enorm(embed(token t + 1)); hnorm(h_t)]
    y = the decoder block of that layer (its attention causal over the MTP positions, rotated at t)
    logits = head(shared_head_norm(y))

The MTP logits of every position, [T - 1, n_vocab], go to OUT.f32 as little-endian float32. Written from the
model's definition (DeepSeek-V3's multi-token prediction module, GGUF's tensor naming), not from Tandem's
code. Exits 77 when NumPy is missing, so a caller can skip.
"""
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("mtp_reference.py: NumPy is missing (Debian: apt-get install python3-numpy)", file=sys.stderr)
    sys.exit(77)

FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY, TYPE_F32 = 8, 9, 0


def load_gguf(path):
    """(metadata dict, tensors by name as float64 arrays, slowest dimension first)."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def text():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(kind):
        if kind in FIXED:
            return take(FIXED[kind])
        if kind == GGUF_STRING:
            return text()
        if kind == GGUF_ARRAY:
            inner, count = take("<I"), take("<Q")
            return [value(inner) for _ in range(count)]
        raise ValueError(f"GGUF value type {kind} is unknown")

    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    if take("<I") < 2:
        raise ValueError(f"{path}: GGUF versions before 2 are not read here")
    n_tensors, n_meta = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_meta):
        key = text()
        meta[key] = value(take("<I"))
    layout = []
    for _ in range(n_tensors):
        name = text()
        shape = [take("<Q") for _ in range(take("<I"))]
        kind, offset = take("<I"), take("<Q")
        layout.append((name, shape, kind, offset))
    alignment = meta.get("general.alignment", 32)
    data_start = -(-pos // alignment) * alignment
    tensors = {}
    for name, shape, kind, offset in layout:
        if kind != TYPE_F32:
            raise ValueError(f"{name}: only F32 tensors are read here (type {kind})")
        n = int(np.prod(shape))
        a = np.frombuffer(buf, dtype="<f4", count=n, offset=data_start + offset)
        tensors[name] = a.reshape(shape[::-1]).astype(np.float64)
    return meta, tensors


def rmsnorm(x, weight, eps):
    return weight * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def swiglu_ffn(x, gate, up, down):
    g = x @ gate.T
    return ((g / (1.0 + np.exp(-g))) * (x @ up.T)) @ down.T


def rotate(x, positions, base):
    """Rotary embedding in GGUF's normal layout: element pairs (2i, 2i + 1) turn by pos * base^(-2i / n)."""
    n = x.shape[-1]
    freq = base ** (-np.arange(0, n, 2, dtype=np.float64) / n)
    ang = positions[:, None] * freq[None, :]  # [T, n / 2]
    shape = (len(positions),) + (1,) * (x.ndim - 2) + (n // 2,)
    cos, sin = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


class DeepSeek2:
    def __init__(self, meta, t):
        a = meta["general.architecture"]
        if a != "deepseek2":
            raise ValueError(f"architecture {a}: this reference runs deepseek2 files only")
        g = lambda key, default=None: meta.get(f"{a}.{key}", default)
        if g("rope.scaling.type", "none") != "none":
            raise ValueError("rope scaling is not part of this reference")
        if g("expert_group_count", 1) != 1:
            raise ValueError("group-limited routing is not part of this reference")
        self.t = t
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-6)
        self.heads = g("attention.head_count")
        self.k_len, self.v_len = g("attention.key_length"), g("attention.value_length")
        self.rot = g("rope.dimension_count")
        self.base = g("rope.freq_base", 10000.0)
        self.rank = g("attention.kv_lora_rank")
        self.n_mtp = g("nextn_predict_layers", 0)
        self.n_main = g("block_count") - self.n_mtp
        self.dense = g("leading_dense_block_count", 0)
        self.top_k = g("expert_used_count")
        self.sigmoid = g("expert_gating_func", 1) == 2
        self.normalise = bool(g("expert_weights_norm", False))
        self.routed_scale = g("expert_weights_scale", 1.0)
        self.head = t.get("output.weight", t["token_embd.weight"])

    def attention(self, x, p, positions):
        """Latent attention with keys and values expanded per head, causal over the rows of x."""
        t, T, H = self.t, x.shape[0], self.heads
        nope = self.k_len - self.rot
        if p + "attn_q_a.weight" in t:
            q = rmsnorm(x @ t[p + "attn_q_a.weight"].T, t[p + "attn_q_a_norm.weight"], self.eps)
            q = q @ t[p + "attn_q_b.weight"].T
        else:
            q = x @ t[p + "attn_q.weight"].T
        q = q.reshape(T, H, self.k_len)
        q = np.concatenate([q[..., :nope], rotate(q[..., nope:], positions, self.base)], axis=-1)
        kv_a = x @ t[p + "attn_kv_a_mqa.weight"].T  # [T, rank + rot]
        latent = rmsnorm(kv_a[:, :self.rank], t[p + "attn_kv_a_norm.weight"], self.eps)
        k_rot = rotate(kv_a[:, self.rank:], positions, self.base)  # [T, rot], one for all heads
        kv = (latent @ t[p + "attn_kv_b.weight"].T).reshape(T, H, nope + self.v_len)
        k = np.concatenate([kv[..., :nope], np.broadcast_to(k_rot[:, None, :], (T, H, self.rot))], axis=-1)
        v = kv[..., nope:]
        scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(self.k_len)
        scores = scores + np.triu(np.full((T, T), -np.inf), 1)[None]
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        out = np.einsum("hij,jhd->ihd", w, v).reshape(T, H * self.v_len)
        return out @ t[p + "attn_output.weight"].T

    def moe(self, x, p):
        t = self.t
        logits = x @ t[p + "ffn_gate_inp.weight"].T  # [T, n_expert]
        if self.sigmoid:
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:
            scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
        bias = t.get(p + "exp_probs_b.bias")
        rank_by = scores + bias if bias is not None else scores
        out = swiglu_ffn(x, t[p + "ffn_gate_shexp.weight"], t[p + "ffn_up_shexp.weight"],
                         t[p + "ffn_down_shexp.weight"])
        gate, up, down = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"], t[p + "ffn_down_exps.weight"]
        for r in range(x.shape[0]):
            chosen = np.argsort(-rank_by[r], kind="stable")[:self.top_k]
            weights = scores[r, chosen]
            if self.normalise:
                weights = weights / weights.sum()
            weights = weights * self.routed_scale
            for e, w in zip(chosen, weights):
                out[r] += w * swiglu_ffn(x[r:r + 1], gate[e], up[e], down[e])[0]
        return out

    def block(self, x, layer, positions):
        t, p = self.t, f"blk.{layer}."
        x = x + self.attention(rmsnorm(x, t[p + "attn_norm.weight"], self.eps), p, positions)
        h = rmsnorm(x, t[p + "ffn_norm.weight"], self.eps)
        if layer < self.dense:
            return x + swiglu_ffn(h, t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"], t[p + "ffn_down.weight"])
        return x + self.moe(h, p)

    def main_hidden(self, tokens):
        """The final hidden states of the main layers, before the output norm: [T, n_embd]."""
        x = self.t["token_embd.weight"][tokens]
        positions = np.arange(len(tokens), dtype=np.float64)
        for layer in range(self.n_main):
            x = self.block(x, layer, positions)
        return x

    def mtp_logits(self, tokens):
        if self.n_mtp < 1:
            raise ValueError("the file has no MTP layers (nextn_predict_layers)")
        t, layer = self.t, self.n_main
        p = f"blk.{layer}.nextn."
        h = self.main_hidden(tokens)[:-1]  # positions 0 .. T-2
        embed = t.get(p + "embed_tokens.weight", t["token_embd.weight"])[tokens[1:]]
        joined = np.concatenate([rmsnorm(embed, t[p + "enorm.weight"], self.eps),
                                 rmsnorm(h, t[p + "hnorm.weight"], self.eps)], axis=-1)
        x = joined @ t[p + "eh_proj.weight"].T
        y = self.block(x, layer, np.arange(len(h), dtype=np.float64))
        norm = t.get(p + "shared_head_norm.weight", t["output_norm.weight"])
        head = t.get(p + "shared_head_head.weight", self.head)
        return rmsnorm(y, norm, self.eps) @ head.T


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    meta, tensors = load_gguf(sys.argv[1])
    with open(sys.argv[2]) as f:
        tokens = np.array([int(s) for s in f.read().split()], dtype=np.int64)
    logits = DeepSeek2(meta, tensors).mtp_logits(tokens)
    logits.astype("<f4").tofile(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
