"""The transformers side of tests/interop.rs: loads each exported directory of the manifest with the pinned
PyPI transformers (fp32, eager CPU), or a Swin with timm, and writes <dir>/parity.json: a decoder's logits on the manifest's token
ids (flattened) and its greedy continuation of the prompt, a masked LM's logits on the ids, or an image
classifier's class scores on the manifest's images. One process for every export: importing transformers
takes seconds."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageClassification, AutoModelForMaskedLM


def main(manifest_path):
    torch.manual_seed(0)
    for entry in json.load(open(manifest_path)):
        if entry.get("timm"):
            # A timm model: rebuilt from its config.json's architecture and arguments, its weights loaded.
            import timm

            model = timm.create_model("local-dir:" + entry["dir"], pretrained=True)
            model.eval()
            images = torch.tensor(entry["images"], dtype=torch.float32).view(entry["shape"])
            with torch.no_grad():
                logits = model(images)
            with open(entry["dir"] + "/parity.json", "w") as f:
                json.dump({"logits": logits.reshape(-1).tolist(), "greedy": []}, f)
            continue
        if "images" in entry:
            # An image classifier: its class scores on the images ablate read.
            model = AutoModelForImageClassification.from_pretrained(entry["dir"], dtype=torch.float32)
            model.eval()
            images = torch.tensor(entry["images"], dtype=torch.float32).view(entry["shape"])
            with torch.no_grad():
                logits = model(pixel_values=images).logits
            with open(entry["dir"] + "/parity.json", "w") as f:
                json.dump({"logits": logits.reshape(-1).tolist(), "greedy": []}, f)
            continue
        if entry.get("imagegpt"):
            # ImageGPT: its next-pixel logits after the start token and the pixels.
            from transformers import ImageGPTForCausalImageModeling

            model = ImageGPTForCausalImageModeling.from_pretrained(entry["dir"], dtype=torch.float32)
            model.eval()
            ids = torch.tensor(entry["ids"], dtype=torch.long)
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            with open(entry["dir"] + "/parity.json", "w") as f:
                json.dump({"logits": logits.reshape(-1).tolist(), "greedy": []}, f)
            continue
        if entry.get("masked"):
            # A masked LM: its logits at every position of the manifest's ids.
            model = AutoModelForMaskedLM.from_pretrained(entry["dir"], dtype=torch.float32)
            model.eval()
            ids = torch.tensor(entry["ids"], dtype=torch.long)
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            with open(entry["dir"] + "/parity.json", "w") as f:
                json.dump({"logits": logits.reshape(-1).tolist(), "greedy": []}, f)
            continue
        model = AutoModelForCausalLM.from_pretrained(entry["dir"], dtype=torch.float32)
        model.eval()
        ids = torch.tensor(entry["ids"], dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            prompt = torch.tensor([entry["prompt"]], dtype=torch.long)
            n = entry["new_tokens"]
            if n > 0:
                out = model.generate(
                    input_ids=prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=0,
                )
                greedy = out[0, prompt.shape[1]:].tolist()
            else:
                greedy = []
        with open(entry["dir"] + "/parity.json", "w") as f:
            json.dump({"logits": logits.reshape(-1).tolist(), "greedy": greedy}, f)


if __name__ == "__main__":
    main(sys.argv[1])
