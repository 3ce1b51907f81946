"""The TransformerLens side of tests/interop.rs: opens each exported directory of the manifest in the pinned
TransformerLens (its TransformerBridge over the transformers model, loaded from the local directory with eager
attention so that the hooks see the scores) with the export's own tokenizer.json, runs run_with_cache on the
manifest's token ids and writes <dir>/lens.json: the logits (flattened) and every layer's attention pattern
(blocks.L.attn.hook_pattern, [batch, head, query, key], flattened)."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformer_lens.model_bridge import TransformerBridge


def main(manifest_path):
    for entry in json.load(open(manifest_path)):
        d = entry["dir"]
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=d + "/tokenizer.json")
        bridge = TransformerBridge.boot_transformers(d, hf_model=model, tokenizer=tokenizer)
        ids = torch.tensor(entry["ids"], dtype=torch.long)
        with torch.no_grad():
            logits, cache = bridge.run_with_cache(ids)
        layers = model.config.num_hidden_layers
        patterns = [cache[f"blocks.{layer}.attn.hook_pattern"].reshape(-1).tolist() for layer in range(layers)]
        with open(d + "/lens.json", "w") as f:
            json.dump({"class": type(bridge).__name__, "logits": logits.reshape(-1).tolist(), "patterns": patterns}, f)


if __name__ == "__main__":
    main(sys.argv[1])
