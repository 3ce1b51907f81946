"""The transformers side of tests/interop.rs's import test: builds each model of the manifest from its config
with the pinned PyPI transformers alone (no ablate code involved), draws every parameter at random, saves it
with save_pretrained (model.safetensors, config.json) and writes <dir>/parity.json: its logits on the
manifest's token ids (flattened)."""
import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(manifest_path):
    for entry in json.load(open(manifest_path)):
        torch.manual_seed(entry.get("seed", 0))
        config = AutoConfig.for_model(entry["model_type"], **entry["config"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for _, p in sorted(model.named_parameters()):
                p.copy_(torch.randn_like(p) * 0.3)
        model.eval()
        model.save_pretrained(entry["dir"], safe_serialization=True)
        ids = torch.tensor(entry["ids"], dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        with open(entry["dir"] + "/parity.json", "w") as f:
            json.dump({"logits": logits.reshape(-1).tolist()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
