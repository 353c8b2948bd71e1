#!/usr/bin/env python3
"""An independent NumPy reference for jamba checkpoints (attention and Mamba-1 layers interleaved, each followed
by a dense SwiGLU FFN or, where the file holds the layer's router, a mixture of SwiGLU experts).

Usage: hybrid_reference.py MODEL.gguf TOKENS.txt OUT.f32

Reads an F32 GGUF file with its own minimal parser, runs the whole token sequence (whitespace-separated ids
in TOKENS.txt) through the model in float64, the Mamba layers by their recurrence one position at a time and
the attention layers causally over all positions, and writes the logits of every position to OUT.f32 as
little-endian float32, [n_tokens, n_vocab]. Written from the model's definition, not from Tandem's code.
Exits 77 when NumPy is missing, so a caller can skip.
"""
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("hybrid_reference.py: NumPy is missing (Debian: apt-get install python3-numpy)", file=sys.stderr)
    sys.exit(77)

# GGUF value types and the struct formats of the fixed-size ones.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
GGML_F32 = 0


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.unpack("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t in SCALARS:
            return self.unpack(SCALARS[t])
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.unpack("<I"), self.unpack("<Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_gguf(path):
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    r.pos = 4
    version = r.unpack("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported here")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        infos.append((name, dims, r.unpack("<I"), r.unpack("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.pos + align - 1) // align * align
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        if ggml_type != GGML_F32:
            raise ValueError(f"tensor {name} is not F32; this reference reads F32 files only")
        count = int(np.prod(dims))
        flat = np.frombuffer(data, dtype="<f4", count=count, offset=base + offset)
        # GGUF lists dimensions fastest first; NumPy wants them slowest first.
        tensors[name] = flat.reshape(list(reversed(dims))).astype(np.float64)
    return meta, tensors


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def mamba_mixer(h, t, p, eps):
    """h: [T, n_embd] normalised inputs -> [T, n_embd], the recurrence run position by position."""
    d_inner = t[p + "ssm_d"].shape[0]
    conv_w = t[p + "ssm_conv1d.weight"]  # [d_inner, d_conv]
    d_conv = conv_w.shape[1]
    A = t[p + "ssm_a"]  # [d_inner, d_state], already -exp(A_log)
    d_state = A.shape[1]
    xz = h @ t[p + "ssm_in.weight"].T  # [T, 2 d_inner]
    x, z = xz[:, :d_inner], xz[:, d_inner:]
    # Causal depthwise convolution: position i sees inputs i - d_conv + 1 .. i (zeros before the start).
    padded = np.concatenate([np.zeros((d_conv - 1, d_inner)), x], axis=0)
    xc = np.stack([np.sum(padded[i:i + d_conv].T * conv_w, axis=1) for i in range(len(x))])
    xc = silu(xc + t[p + "ssm_conv1d.bias"])
    dbc = xc @ t[p + "ssm_x.weight"].T
    dt_rank = dbc.shape[1] - 2 * d_state
    dt, B, C = dbc[:, :dt_rank], dbc[:, dt_rank:dt_rank + d_state], dbc[:, dt_rank + d_state:]
    dt = rms_norm(dt, t[p + "ssm_dt_norm.weight"], eps)
    B = rms_norm(B, t[p + "ssm_b_norm.weight"], eps)
    C = rms_norm(C, t[p + "ssm_c_norm.weight"], eps)
    dt = softplus(dt @ t[p + "ssm_dt.weight"].T + t[p + "ssm_dt.bias"])  # [T, d_inner]
    state = np.zeros((d_inner, d_state))
    y = np.empty_like(xc)
    for i in range(len(xc)):
        state = state * np.exp(dt[i][:, None] * A) + (dt[i] * xc[i])[:, None] * B[i][None, :]
        y[i] = state @ C[i] + t[p + "ssm_d"] * xc[i]
    return (y * silu(z)) @ t[p + "ssm_out.weight"].T


def attention(h, t, p, n_head, n_head_kv):
    """Causal multi-head attention without positional encoding (GQA: query heads share KV heads in order)."""
    T, E = h.shape
    hd = E // n_head
    q = (h @ t[p + "attn_q.weight"].T).reshape(T, n_head, hd)
    k = (h @ t[p + "attn_k.weight"].T).reshape(T, n_head_kv, hd)
    v = (h @ t[p + "attn_v.weight"].T).reshape(T, n_head_kv, hd)
    out = np.empty((T, n_head, hd))
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for hq in range(n_head):
        hk = hq // (n_head // n_head_kv)
        scores = q[:, hq] @ k[:, hk].T / np.sqrt(hd) + mask
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, hq] = (scores / scores.sum(axis=1, keepdims=True)) @ v[:, hk]
    return out.reshape(T, E) @ t[p + "attn_output.weight"].T


def swiglu_ffn(h, gate, up, down):
    return (silu(h @ gate.T) * (h @ up.T)) @ down.T


def moe_ffn(h, t, p, n_used, renormalise):
    """A mixture of experts: softmax over the router's logits, the n_used most probable experts of each
    position weighed by their probabilities (divided by the chosen ones' sum when renormalise)."""
    logits = h @ t[p + "ffn_gate_inp.weight"].T  # [T, n_expert]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    gate, up, down = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"], t[p + "ffn_down_exps.weight"]
    out = np.zeros_like(h)
    for i in range(len(h)):
        # Highest probability first; equal ones in expert order.
        chosen = sorted(range(probs.shape[1]), key=lambda e: (-probs[i, e], e))[:n_used]
        weights = probs[i, chosen]
        if renormalise:
            weights = weights / weights.sum()
        for e, w in zip(chosen, weights):
            out[i] += w * swiglu_ffn(h[i:i + 1], gate[e], up[e], down[e])[0]
    return out


def forward(meta, t, tokens):
    arch = meta["general.architecture"]
    if arch != "jamba":
        raise ValueError(f"architecture {arch}: this reference runs jamba files only")
    eps = meta.get(arch + ".attention.layer_norm_rms_epsilon", 1e-6)
    n_head = meta[arch + ".attention.head_count"]
    kv_heads = meta[arch + ".attention.head_count_kv"]
    n_layer = meta[arch + ".block_count"]
    if not isinstance(kv_heads, list):
        kv_heads = [kv_heads] * n_layer
    n_used = meta.get(arch + ".expert_used_count", 0)
    renormalise = bool(meta.get(arch + ".expert_weights_norm", False))
    if meta.get(arch + ".expert_gating_func", 1) != 1:
        raise ValueError("this reference routes experts by softmax only")
    x = t["token_embd.weight"][tokens]  # [T, n_embd]
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, t[p + "attn_norm.weight"], eps)
        if kv_heads[il] == 0:
            x = x + mamba_mixer(h, t, p, eps)
        else:
            x = x + attention(h, t, p, n_head, kv_heads[il])
        h = rms_norm(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in t:
            x = x + moe_ffn(h, t, p, n_used, renormalise)
        else:
            x = x + swiglu_ffn(h, t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"], t[p + "ffn_down.weight"])
    head = t.get("output.weight", t["token_embd.weight"])
    return rms_norm(x, t["output_norm.weight"], eps) @ head.T


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    meta, tensors = read_gguf(sys.argv[1])
    with open(sys.argv[2]) as f:
        tokens = [int(s) for s in f.read().split()]
    logits = forward(meta, tensors, np.array(tokens, dtype=np.int64))
    logits.astype("<f4").tofile(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
