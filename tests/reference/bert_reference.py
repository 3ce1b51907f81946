"""An independent BERT forward pass in plain PyTorch ops, for tests/bert.rs.

Reads a Hugging Face BERT directory (config.json, model.safetensors) and, on stdin, JSON
{"ids": [[...]], "mask": [[0/1...]]}; prints JSON {"hidden": B×N×D, "mean": B×D}: the final hidden states
and their mean over the real tokens. Written from the BERT paper and the checkpoint's names alone (no
transformers, no safetensors package: the file format is an 8-byte header length, a JSON header, raw data).
"""
import json
import math
import struct
import sys
import warnings

# The torch wheel warns on import when NumPy is absent; nothing here needs NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": torch.float32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[start:end]), dtype=kinds[info["dtype"]])
        out[name.removeprefix("bert.")] = t.reshape(info["shape"]).clone()
    return out


def main():
    model_dir = sys.argv[1]
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = read_safetensors(f"{model_dir}/model.safetensors")
    req = json.load(sys.stdin)
    ids = torch.tensor(req["ids"], dtype=torch.int64)
    mask = torch.tensor(req["mask"], dtype=torch.float32)
    b, n = ids.shape
    d, h, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    dh = d // h

    def ln(x, name):
        return F.layer_norm(x, (d,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def dense(x, name):
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    with torch.no_grad():
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = ln(x, "embeddings.LayerNorm")
        # Padding keys get -inf-like scores: exp underflows to exactly 0.
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}"

            def heads(t):
                return t.view(b, n, h, dh).transpose(1, 2)

            q = heads(dense(x, f"{p}.attention.self.query"))
            k = heads(dense(x, f"{p}.attention.self.key"))
            v = heads(dense(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dh) + bias
            a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
            x = ln(x + dense(a, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            f = F.gelu(dense(x, f"{p}.intermediate.dense"))  # exact (erf) GELU, as BERT's "gelu"
            x = ln(x + dense(f, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        mean = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    json.dump({"hidden": x.tolist(), "mean": mean.tolist()}, sys.stdout)


main()
